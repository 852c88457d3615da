"""What one torch operator costs: FLOPs, the matrix multiply it runs, bytes it moves, what its backward adds.

The unit of :mod:`gpurig.models.trace`, which sees every aten operator of a forward
pass. FLOPs come from PyTorch's own table (``torch.utils.flop_counter``, the
formulas behind ``FlopCounterMode``): 2 FLOPs per multiply-add of ``mm``,
``addmm``, ``bmm``, ``baddbmm`` and convolutions (bias adds not counted),
attention as its two batched matrix multiplies (a causal mask not halving
them); nothing else counts as FLOPs. Every other operator is memory traffic:
the bytes of its tensor inputs plus its outputs, views being free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten

GEMM_KINDS = {aten.mm: "linear", aten.addmm: "linear", aten.bmm: "attention-matmul",
              aten.baddbmm: "attention-matmul", aten.convolution: "conv", aten._convolution: "conv"}
NORM_OPS = {aten.native_layer_norm, aten.native_batch_norm, aten._native_batch_norm_legit,
            aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit_functional,
            aten.native_group_norm, aten._fused_rms_norm}
# Operators whose arithmetic per value, not their memory traffic, can bound them on a GPU: transcendentals and
# random numbers (dropout's masks count too: :meth:`gpurig.models.trace.Tracer.charge_dropout`). ReLU, adds,
# batch and layer norms and pooling do a few operations per value and are memory-bound. Of these, the backward
# of GELU and SiLU evaluates the function again; the others' backward is a multiply by what forward kept.
VECTOR_OPS = {aten.gelu, aten.tanh, aten.sigmoid, aten.silu, aten.mish, aten.exp, aten.erf, aten.log,
              aten._softmax, aten._log_softmax, aten.sin, aten.cos, aten.elu, aten.softplus, aten.bernoulli,
              aten.native_dropout, aten.rand_like, aten.randn_like}
VECTOR_BACKWARD_OPS = {aten.gelu, aten.silu, aten.mish}
# Operators autocast runs in float32 under mixed precision (torch.amp's CUDA float32 list: softmax, log-softmax,
# layer and group norm, the losses, exp / log / pow, reductions), whose traffic therefore stays 4 bytes a value
# when activations elsewhere are 16-bit.
FLOAT32_OPS = {aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.native_group_norm,
               aten.nll_loss_forward, aten.nll_loss2d_forward, aten.mse_loss, aten.l1_loss, aten.smooth_l1_loss,
               aten.binary_cross_entropy_with_logits, aten.kl_div, aten.exp, aten.log, aten.pow, aten.logsumexp,
               aten.cumsum, aten.sum, aten.prod}
# What an operator's backward moves, in multiples of its forward's traffic, where that is not twice it (the rule
# for the rest: each tensor forward read or wrote is read or written once more, and as many gradients besides).
# A pointwise function's backward reads the output's gradient and one saved tensor and writes the input's: 3 passes
# of forward's 2. An add's gradient goes to both operands untouched; where the branches meet again (a residual's
# fork) one add sums them: 3 passes, forward's 3. Batch norm's backward reduces the gradient and the input per
# channel, then reads both again to write the input's gradient: 5 passes of forward's 3 (:func:`moved_bytes`).
# H200 kernels, ResNet-50: docs/predict.md, "Run 2026-11-27 (ninth, session 44): each operator's own passes".
BACKWARD_TRAFFIC = {
    **{op: 1.5 for op in (aten.relu, aten.relu_, aten.threshold, aten.gelu, aten.silu, aten.silu_, aten.sigmoid,
                          aten.tanh, aten.hardtanh, aten.hardtanh_, aten.leaky_relu, aten.leaky_relu_, aten.elu,
                          aten.elu_, aten.hardswish, aten.hardswish_, aten.hardsigmoid, aten.hardsigmoid_,
                          aten.mish, aten.softplus)},
    aten.add: 1.0, aten.add_: 1.0,
    # softmax's backward reads its output and the gradient, writes one (3 of 2); dropout's multiplies the gradient
    # by the one-byte mask forward wrote (forward's traffic again); layer norm's writes the input's gradient from the
    # gradient and the input (3 passes), then reduces both again for the weight and bias (2): 5 of forward's 2
    aten._softmax: 1.5, aten._log_softmax: 1.5, aten.native_dropout: 1.0, aten.native_layer_norm: 2.5,
    **{op: 5 / 3 for op in (aten.native_batch_norm, aten._native_batch_norm_legit,
                            aten._native_batch_norm_legit_functional)},
}
# Batch norm in training reads its input twice: its statistics, then the transform.
_BATCH_NORM_TRAINING = {aten.native_batch_norm: 5, aten._native_batch_norm_legit: 5,
                        aten._native_batch_norm_legit_functional: 5}   # the index of its ``training`` argument
# Which two arguments of a GEMM are its operands A and B (the rest is bias).
_OPERANDS = {aten.mm: (0, 1), aten.addmm: (1, 2), aten.bmm: (0, 1), aten.baddbmm: (1, 2),
             aten.convolution: (0, 1), aten._convolution: (0, 1)}
# Allocations that fill nothing, and a view PyTorch does not mark as one.
_FREE = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided, aten._unsafe_view}


@dataclass(frozen=True)
class Gemm:
    """A matrix multiply C[M×N] = A[M×K]·B[K×N], run ``count`` times (heads × batch, or conv groups).

    A convolution's implicit GEMM also records its kernel's footprint on the input (height, width: a dilated
    kernel's span) and its stride, which decide the algorithms cuDNN can run it with (:mod:`gpurig.perf.step`);
    both are empty for other products.

    >>> Gemm(m=128, n=3072, k=768).flops
    603979776
    """

    m: int
    n: int
    k: int
    count: int = 1
    kernel: tuple[int, ...] = field(default=(), repr=False)
    stride: tuple[int, ...] = field(default=(), repr=False)

    @property
    def flops(self) -> int:
        """2·M·N·K per multiply (a multiply-add is 2 FLOPs), times ``count``."""
        return 2 * self.m * self.n * self.k * self.count


def gemm_of(packet, args: tuple, out) -> Gemm | None:
    """The matrix multiply a GEMM operator runs; None for any other operator.

    A linear layer is ``addmm(bias, x, Wᵀ)``: M = batch·tokens, K = inputs,
    N = outputs. A convolution is an implicit GEMM: M = batch·H_out·W_out,
    N = out_channels/groups, K = in_channels/groups·kh·kw, ``count`` = groups; with the kernel's footprint
    ((kh − 1)·dilation + 1, likewise for kw) and stride.

    >>> gemm_of(aten.mm, (torch.empty(10, 8, device="meta"), torch.empty(8, 16, device="meta")), None)
    Gemm(m=10, n=16, k=8, count=1)
    >>> x, w = torch.empty(2, 3, 8, 8, device="meta"), torch.empty(4, 3, 3, 3, device="meta")
    >>> conv = gemm_of(aten.convolution, (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), torch.empty(2, 4, 6, 6))
    >>> conv, conv.kernel, conv.stride
    (Gemm(m=72, n=4, k=27, count=1), (3, 3), (1, 1))
    """
    if packet in (aten.mm, aten.addmm):
        a, b = (args[i] for i in _OPERANDS[packet])
        return Gemm(a.shape[0], b.shape[1], a.shape[1])
    if packet in (aten.bmm, aten.baddbmm):
        a, b = (args[i] for i in _OPERANDS[packet])
        return Gemm(a.shape[1], b.shape[2], a.shape[2], a.shape[0])
    if packet in (aten.convolution, aten._convolution):
        x, w, stride, dilation, transposed, groups = args[0], args[1], args[3], args[5], args[6], args[8]
        kernel = math.prod(w.shape[2:])
        footprint = tuple((size - 1) * d + 1 for size, d in zip(w.shape[2:], dilation))
        if transposed:  # weight is (in, out/groups, kh, kw); the GEMM runs over the input's pixels
            return Gemm(x.shape[0] * math.prod(x.shape[2:]), w.shape[1] * kernel, w.shape[0] // groups, groups,
                        footprint, tuple(stride))
        return Gemm(out.shape[0] * math.prod(out.shape[2:]), w.shape[0] // groups, w.shape[1] * kernel, groups,
                    footprint, tuple(stride))
    return None


def attention_gemms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[Gemm, Gemm]:
    """The two batched GEMMs of attention: scores Q·Kᵀ, then scores·V (one per batch item and head).

    >>> q = torch.empty(2, 12, 128, 64, device="meta")
    >>> attention_gemms(q, q, q)
    (Gemm(m=128, n=128, k=64, count=24), Gemm(m=128, n=64, k=128, count=24))
    """
    count, queries, width = math.prod(q.shape[:-2]), q.shape[-2], q.shape[-1]
    keys = k.shape[-2]
    return Gemm(queries, keys, width, count), Gemm(queries, v.shape[-1], keys, count)


def flops_of(packet, args: tuple, kwargs: dict, out) -> int:
    """FLOPs of one operator call by ``FlopCounterMode``'s formulas; 0 for operators it does not count.

    >>> flops_of(aten.mm, (torch.empty(10, 8, device="meta"), torch.empty(8, 16, device="meta")), {}, None)
    2560
    """
    formula = flop_registry.get(packet)
    return int(formula(*args, **kwargs, out_val=out)) if formula else 0


def tensors(value) -> list[torch.Tensor]:
    """The tensors in a nested structure of arguments or results.

    >>> len(tensors(((torch.empty(1), 2), {"x": torch.empty(3)})))
    2
    """
    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def nbytes(tensor: torch.Tensor) -> int:
    """Bytes of a tensor's elements (on the meta device too).

    >>> nbytes(torch.empty(4, 256, device="meta"))
    4096
    """
    return tensor.numel() * tensor.element_size()


def moved_bytes(func, args: tuple, kwargs: dict, out) -> int:
    """Bytes a non-GEMM operator reads and writes: its tensor inputs plus its outputs.

    Views and bare allocations move nothing; an embedding reads only the rows it
    gathers (as many bytes as it writes), not its whole table; batch norm in training
    reads its input twice (statistics, then the transform).

    >>> x = torch.empty(8, 256, device="meta")
    >>> moved_bytes(aten.relu.default, (x,), {}, torch.relu(x)), moved_bytes(aten.t.default, (x,), {}, x.t())
    (16384, 0)
    >>> w, b = torch.ones(256, device="meta"), torch.zeros(256, device="meta")
    >>> norm = aten.native_batch_norm.default
    >>> moved_bytes(norm, (x, w, b, None, None, True, 0.1, 1e-5), {}, norm(x, w, b, None, None, True, 0.1, 1e-5))
    28672
    """
    packet = func.overloadpacket
    if func.is_view or packet in _FREE:
        return 0
    if packet is aten.embedding:
        return 2 * nbytes(out) + nbytes(args[1])
    inputs = tensors((args, kwargs))
    if not inputs:  # factories (arange, zeros): small fills
        return 0
    moved = sum(map(nbytes, inputs)) + sum(map(nbytes, tensors(out)))
    training = _BATCH_NORM_TRAINING.get(packet)
    if training is not None and len(args) > training and args[training]:
        moved += nbytes(args[0])
    return moved


def backward_bytes(packet, moved: int) -> int:
    """What ``packet``'s backward moves when its forward moved ``moved`` bytes (:data:`BACKWARD_TRAFFIC`).

    >>> backward_bytes(aten.mul, 300), backward_bytes(aten.relu_, 200), backward_bytes(aten.add, 300)
    (600, 300, 300)
    """
    return round(BACKWARD_TRAFFIC.get(packet, 2) * moved)


def needs_grad(values) -> bool:
    """Whether any tensor among ``values`` takes part in autograd (so the backward pass visits it).

    >>> needs_grad([torch.empty(2, requires_grad=True), torch.empty(2)]), needs_grad([torch.empty(2)])
    (True, False)
    """
    return any(t.requires_grad for t in tensors(values))


def gemm_backward_factor(packet, args: tuple) -> int:
    """How many GEMMs of the forward's size the backward pass runs: one per operand that needs a gradient.

    A hidden linear layer: 2 (input gradient and weight gradient). The first
    layer, fed by data: 1 (no gradient for the data). A frozen layer fed by data: 0.

    >>> w, x = torch.empty(8, 4, requires_grad=True), torch.empty(2, 8)
    >>> gemm_backward_factor(aten.mm, (x, w)), gemm_backward_factor(aten.mm, (x.requires_grad_(), w))
    (1, 2)
    """
    return sum(bool(args[i].requires_grad) for i in _OPERANDS.get(packet, (0, 1)))
