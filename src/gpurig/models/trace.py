"""Run a module's forward pass once and charge every operator to the module that ran it.

Forward hooks keep a stack of the modules being run; a ``TorchDispatchMode``
sees each aten operator and charges its cost (:mod:`gpurig.models.ops`) to the
innermost one, so a container's own code (a residual add) is charged to the
container, not to its last child. ``F.scaled_dot_product_attention`` and ``F.dropout`` are
caught one level higher (``TorchFunctionMode``) and charged as the single
fused kernels a GPU runs, not as the decomposition the meta device shows:
attention as two batched GEMMs plus Q, K, V and the output as memory traffic
(what a flash-attention kernel moves, not a tokens×tokens score matrix);
dropout as its input, output and a one-byte mask.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections import Counter
from dataclasses import dataclass, field

import torch  # noqa: F401 (docstring examples)
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from gpurig.models import ops
from gpurig.models.inside import call_inside
from gpurig.models.peak import fused_on_cuda


@dataclass
class Charges:
    """What one module did itself (not its children), summed over its calls, and the order it first did it."""

    name: str
    module: nn.Module
    order: int = -1
    calls: int = 0
    input_elements: int = 0
    output_elements: int = 0
    forward_flops: int = 0
    backward_flops: int = 0
    forward_bytes: int = 0
    backward_bytes: int = 0
    # the parts of those bytes that :data:`gpurig.models.ops.VECTOR_OPS` move (their arithmetic may outlast their
    # traffic) and that :data:`~gpurig.models.ops.FLOAT32_OPS` move (autocast keeps them 4 bytes a value)
    forward_vector_bytes: int = 0
    backward_vector_bytes: int = 0
    forward_float32_bytes: int = 0
    backward_float32_bytes: int = 0
    gemms: list[ops.Gemm] = field(default_factory=list)
    gemm_flops: Counter = field(default_factory=Counter)   # by GEMM kind: linear, conv, attention-matmul
    ops: set = field(default_factory=set)                   # packets of the other operators it ran

    @property
    def did_work(self) -> bool:
        return bool(self.forward_flops or self.forward_bytes or self.gemms)


class Tracer:
    """Charges per module for one forward pass of ``model``: ``with Tracer(model) as t: model(x)``, then ``t.charges()``.

    >>> with torch.device("meta"):
    ...     model = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
    ...     with Tracer(model) as tracer:
    ...         _ = model(torch.empty(2, 8))
    >>> [(c.name, c.forward_flops, c.forward_bytes) for c in tracer.charges()]
    [('0', 128, 0), ('1', 0, 64)]
    """

    def __init__(self, model: nn.Module):
        self.by_module: dict[nn.Module, Charges] = {m: Charges(n, m) for n, m in model.named_modules()}
        self.stack: list[Charges] = []
        self.next_order = 0
        self.suppressed = False
        self._exits = contextlib.ExitStack()

    def __enter__(self) -> Tracer:
        for module in self.by_module:
            self._exits.callback(module.register_forward_pre_hook(self._enter_module, with_kwargs=True).remove)
            self._exits.callback(module.register_forward_hook(self._exit_module, with_kwargs=True,
                                                              always_call=True).remove)
        self._exits.enter_context(_Operators(self))
        self._exits.enter_context(_Functions(self))
        return self

    def __exit__(self, *exc) -> None:
        self._exits.close()

    def charges(self) -> list[Charges]:
        """Modules with parameters of their own or work of their own, in the order they first ran (unused ones last)."""
        kept = [c for c in self.by_module.values() if c.did_work or _own_parameters(c.module)]
        return sorted(kept, key=lambda c: (c.order < 0, c.order))

    def _mark(self, charges: Charges) -> None:
        if charges.order < 0:
            charges.order, self.next_order = self.next_order, self.next_order + 1

    def _enter_module(self, module, args, kwargs):
        charges = self.by_module[module]
        charges.calls += 1
        charges.input_elements += sum(t.numel() for t in ops.tensors((args, kwargs)))
        if _own_parameters(module):
            self._mark(charges)
        self.stack.append(charges)

    def _exit_module(self, module, args, kwargs, output):
        self.stack.pop()
        self.by_module[module].output_elements += sum(t.numel() for t in ops.tensors(output))

    def charge_operator(self, func, args: tuple, kwargs: dict, out) -> None:
        """Charge one aten operator call to the innermost running module."""
        if self.suppressed:
            return
        packet = func.overloadpacket
        flops = ops.flops_of(packet, args, kwargs, out)
        if flops:
            gemm = ops.gemm_of(packet, args, out)
            self._charge(flops=flops, backward_factor=ops.gemm_backward_factor(packet, args),
                         gemms=[gemm] if gemm else [], kind=ops.GEMM_KINDS.get(packet, _guess_kind(packet)))
            return
        moved = ops.moved_bytes(func, args, kwargs, out)
        if moved:
            self._charge(moved=moved, grad=ops.needs_grad((args, kwargs)), packet=packet)

    def charge_attention(self, args: tuple, kwargs: dict, out) -> None:
        """A fused attention call: its two batched GEMMs; Q, K, V, mask and output as traffic."""
        q, k, v = (args[i] if i < len(args) else kwargs[name] for i, name in enumerate(("query", "key", "value")))
        grad = ops.needs_grad((q, k, v))
        gemms = ops.attention_gemms(q, k, v)
        self._charge(flops=sum(g.flops for g in gemms), backward_factor=2 if grad else 0, gemms=list(gemms),
                     kind="attention-matmul", moved=sum(map(ops.nbytes, [*ops.tensors((args, kwargs)), out])),
                     grad=grad)

    def charge_dropout(self, args: tuple, kwargs: dict, out) -> None:
        """A fused dropout kernel: reads the input, writes the output and a one-byte mask."""
        bound = _DROPOUT.bind(*args, **kwargs)
        bound.apply_defaults()
        x = bound.arguments["input"]
        if bound.arguments["training"] and bound.arguments["p"] > 0:
            moved = ops.nbytes(x) + ops.nbytes(out) + x.numel()
            # random numbers; backward: a multiply by the mask
            self._charge(moved=moved, grad=x.requires_grad, vector=(moved, 0), packet=torch.ops.aten.native_dropout)

    def _charge(self, *, flops: int = 0, backward_factor: int = 0, gemms: list | None = None, kind: str | None = None,
                moved: int = 0, grad: bool = False, packet=None, vector: tuple[int, int] | None = None) -> None:
        if not self.stack:
            return
        if vector is None and packet is not None:   # (forward, backward) bytes of vector-bound work
            vector = (moved if packet in ops.VECTOR_OPS else 0, moved if packet in ops.VECTOR_BACKWARD_OPS else 0)
        charges = self.stack[-1]
        self._mark(charges)
        charges.forward_flops += flops
        charges.backward_flops += flops * backward_factor
        charges.gemms += gemms or []
        if kind:
            charges.gemm_flops[kind] += flops
        charges.forward_bytes += moved
        charges.backward_bytes += ops.backward_bytes(packet, moved) if grad else 0
        if vector:
            charges.forward_vector_bytes += vector[0]
            charges.backward_vector_bytes += ops.backward_bytes(packet, vector[1]) if grad else 0
        if packet in ops.FLOAT32_OPS:
            charges.forward_float32_bytes += moved
            charges.backward_float32_bytes += ops.backward_bytes(packet, moved) if grad else 0
        if packet is not None:
            charges.ops.add(packet)


_DROPOUT = inspect.signature(F.dropout)


class SavedActivations:
    """The tensors autograd keeps from a forward pass for backward, other than the weights: what a training step
    holds at the end of forward. ``with SavedActivations(model) as saved: model(x)``, then ``saved.total_bytes``.

    Counted when the block ends, of the tensors still held then (keep the output referenced inside the block).
    Each storage counts once (a view saved twice, or saved by two operators, is one tensor); the
    model's parameters and buffers, and their views (a transposed weight), are not activations; nor are
    ``weight_casts`` (a dict whose values are the weights' 16-bit copies, :class:`gpurig.models.autocast.MetaAutocast`).
    ``F.scaled_dot_product_attention`` keeps what a fused (flash) kernel keeps: Q, K, V, its output
    and one float per query row, not the tokens × tokens scores its decomposition would.

    >>> with torch.device("meta"):
    ...     model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    ...     with SavedActivations(model) as saved:
    ...         _ = model(torch.empty(32, 8))
    >>> saved.total_bytes, saved.largest_bytes   # the input (32×8 floats, for a weight gradient), ReLU's output (32×16)
    (3072, 2048)
    """

    def __init__(self, model: nn.Module, weight_casts: dict | None = None):
        self._weights = {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}
        self._weight_casts = weight_casts if weight_casts is not None else {}
        # weak references: a tensor autograd let go of before forward ended is not held, and its storage's
        # address may be reused by a later one (keyed by address alone, the count depended on the allocator)
        self._saved: list[tuple[weakref.ref, int]] = []
        self._fused = 0
        self._exits = contextlib.ExitStack()
        self.total_bytes = self.largest_bytes = 0

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self._fused:
            self._saved.append((weakref.ref(tensor), 0))
        return tensor

    def _attention(self, args: tuple, kwargs: dict, out: torch.Tensor) -> None:
        q, k, v = (args[i] if i < len(args) else kwargs[name] for i, name in enumerate(("query", "key", "value")))
        if not out.requires_grad:
            return
        for tensor in (q, k, v, out):
            self._saved.append((weakref.ref(tensor), 0))
        self._saved.append((weakref.ref(out), out.numel() // out.shape[-1] * 4))   # the row-wise log-sum-exp, float32

    def __enter__(self) -> SavedActivations:
        self._exits.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t))
        self._exits.enter_context(_FusedAttention(self))
        return self

    def __exit__(self, *exc) -> None:
        self._exits.close()
        self._weights |= {t.untyped_storage()._cdata for t in self._weight_casts.values()}
        storages: dict[int, int] = {}
        extra = []
        for ref, nbytes in self._saved:
            tensor = ref()
            if tensor is None:
                continue
            if nbytes:
                extra.append(nbytes)
                continue
            storage = tensor.untyped_storage()
            if storage._cdata not in self._weights:
                storages[storage._cdata] = storage.nbytes()
        sizes = list(storages.values()) + extra
        self.total_bytes, self.largest_bytes = sum(sizes), max(sizes, default=0)
        self._saved.clear()
class _FusedAttention(TorchFunctionMode):
    """Counts a fused attention call's saved tensors as the fused kernel keeps them (:class:`SavedActivations`)."""

    def __init__(self, saved: SavedActivations):
        super().__init__()
        self.saved = saved

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.saved._fused:
            return func(*args, **kwargs)
        if func is not F.scaled_dot_product_attention:
            return call_inside(self, func, args, kwargs)
        if not fused_on_cuda(args, kwargs):
            return func(*args, **kwargs)
        self.saved._fused += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self.saved._fused -= 1
        self.saved._attention(args, kwargs, out)
        return out


def _own_parameters(module: nn.Module) -> bool:
    return next(module.parameters(recurse=False), None) is not None


def _guess_kind(packet) -> str:
    """GEMM kind of a FLOP-counted operator gpurig does not decode (fused or private kernels)."""
    name = str(packet)
    return "conv" if "conv" in name else "attention-matmul" if "attention" in name else "linear"


class _Operators(TorchDispatchMode):
    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.tracer.charge_operator(func, args, kwargs, out)
        return out


class _Functions(TorchFunctionMode):
    """Catches the functions a GPU runs as one fused kernel and charges them whole, not their decomposition."""

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer
        self.fused = {F.scaled_dot_product_attention: tracer.charge_attention, F.dropout: tracer.charge_dropout}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.tracer.suppressed:
            return func(*args, **kwargs)
        charge = self.fused.get(func)
        if charge is self.tracer.charge_attention and not fused_on_cuda(args, kwargs):
            charge = None   # charged as the unfused operators it becomes
        if charge is None:
            return call_inside(self, func, args, kwargs)
        self.tracer.suppressed = True
        try:
            out = func(*args, **kwargs)
        finally:
            self.tracer.suppressed = False
        charge(args, kwargs, out)
        return out
