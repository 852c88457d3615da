"""The most memory a training step holds at once, from the step itself run on the meta device.

Adding up what a step holds (every saved activation, every gradient, the
output and its loss) says more than a GPU ever holds at once: backward frees
each layer's saved tensors as it makes that layer's gradients, and its own
working tensors (activations' gradients, a softmax's backward) come and go.
At a small batch the sum is off by a fifth (BERT-base at 8 on an H100: 1.78
GiB summed, 1.50 measured). So :func:`trace_step` runs the step — forward,
the loss, backward — on meta tensors and follows every tensor it creates from
its creation until autograd or Python lets it go, as PyTorch's allocator would
(:class:`LiveBytes`; what ``torch.distributed._tools.mem_tracker.MemTracker``
does, without its per-module bookkeeping, which costs four times the step).

On a CPU, where the same operators run, the traced peak is the allocator's
(tests/test_perf.py: a small GPT-2's step to the byte in FP32, within 0.4 %
typed as autocast types it). What differs on a GPU is what CUDA runs instead:
``F.scaled_dot_product_attention`` is traced as the fused (memory-efficient)
kernel CUDA picks, which keeps one float per query row instead of the tokens ×
tokens scores the meta device's fallback would, except where CUDA falls back
too (a mask that needs a gradient, :func:`fused_on_cuda`); a dropout's mask
is one byte a value, as CUDA's fused dropout keeps it, not a tensor of the
input's type; and what kernels allocate inside themselves (cuDNN's and
cuBLAS's workspaces) is not seen (:mod:`gpurig.perf.footprint` adds
cuBLAS's). On an H100, 36 steps of six built-in models peaked within 3.5 % of
what predict says, and 18 of nine models it was never tuned on (torchvision's
and Hugging Face's) within 8.8 % (docs/predict.md).

>>> from gpurig.models import mlp
>>> with torch.device("meta"):
...     model = mlp()
>>> peak = trace_step(model, torch.empty(64, 784, device="meta"))
>>> peak["peak"] == sum(peak[part] for part in PHASES), peak["gradients"] < 4 * 2395210 < peak["peak"]
(True, True)
>>> peak["forward_ops"], peak["backward_ops"]   # 3 linear layers, 2 ReLUs, the loss; their backward
(8, 13)
"""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from gpurig.models.autocast import MetaAutocast
from gpurig.models.factory import Placed
from gpurig.models.inside import call_inside

# What a step allocates, by when: forward (saved activations, the output), the loss, backward (activations'
# gradients and working tensors); parameters' gradients and the weights' 16-bit copies are moved to their own.
PHASES = ("activations", "output_and_loss", "backward_working", "gradients", "weight_casts")
# Dropout off CUDA draws its mask into a tensor of the input's type (aten's _dropout_impl: empty_like, then this);
# CUDA's fused native_dropout keeps a bool
_BERNOULLI = torch.ops.aten.bernoulli_.float


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of every storage an operator creates while it lives, and their peak, by :data:`PHASES`.

    ``phase`` names what new storages are (set it as the step moves on); :meth:`move` re-files one that turns
    out to be something else (a parameter's gradient). Storages in ``ignore`` (weights) are not counted.
    ``dropout_mask_bytes``: count a dropout's random mask at this many bytes a value (1, CUDA's bool) instead of
    its tensor's own (the input's type, as a CPU or the meta device draws it).

    >>> with torch.device("meta"), LiveBytes() as live:
    ...     a = torch.ones(1024)          # 4 KB
    ...     b = a * 2                     # 8 KB at once
    ...     del a
    ...     c = b + 1                     # 8 KB again: a was freed
    >>> live.peak, live.now
    (8192, 8192)
    """

    def __init__(self, ignore=(), dropout_mask_bytes: int | None = None):
        super().__init__()
        self.phase = PHASES[0]
        self._mask_bytes = dropout_mask_bytes
        self._ignore = {t.untyped_storage()._cdata for t in ignore}
        self._live: dict[int, tuple[str, int]] = {}   # storage -> (its phase, bytes)
        self.now = self.peak = 0
        self.by_phase = dict.fromkeys(PHASES, 0)
        self.at_peak = dict(self.by_phase)
        self.ops = dict.fromkeys(PHASES, 0)   # operators dispatched in each phase, views left out

    def _freed(self, key: int) -> None:
        phase, nbytes = self._live.pop(key)
        self.now -= nbytes
        self.by_phase[phase] -= nbytes

    def _resize(self, tensor: torch.Tensor, nbytes: int) -> None:
        """Count ``tensor``'s storage as ``nbytes`` from now on (a dropout mask CUDA keeps in one byte a value)."""
        key = tensor.untyped_storage()._cdata
        if key in self._live:
            phase, old = self._live[key]
            self._live[key] = (phase, nbytes)
            self.now += nbytes - old
            self.by_phase[phase] += nbytes - old

    def move(self, tensor: torch.Tensor, phase: str) -> None:
        """File ``tensor``'s storage under ``phase`` from now on (and in the peak, if it was live then)."""
        key = tensor.untyped_storage()._cdata
        if key in self._live:
            old, nbytes = self._live[key]
            self._live[key] = (phase, nbytes)
            self.by_phase[old] -= nbytes
            self.by_phase[phase] += nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:  # a view launches no kernel: what a GPU's host pays for is the others
            self.ops[self.phase] += 1
        if func is _BERNOULLI and self._mask_bytes is not None:
            self._resize(out, out.numel() * self._mask_bytes)
        for tensor in (out if isinstance(out, (tuple, list)) else (out,)):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key = storage._cdata
            if key in self._live or key in self._ignore:
                continue
            nbytes = storage.nbytes()
            self._live[key] = (self.phase, nbytes)
            self.now += nbytes
            self.by_phase[self.phase] += nbytes
            weakref.finalize(storage, self._freed, key)
        if self.now > self.peak:
            self.peak, self.at_peak = self.now, dict(self.by_phase)
        return out


_ATTENTION_ARGUMENTS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


def fused_on_cuda(args: tuple, kwargs: dict) -> bool:
    """Whether CUDA runs a call of ``F.scaled_dot_product_attention`` with these arguments as one fused kernel in
    training. Not when its mask needs a gradient (T5's learned position bias): no fused kernel makes one, and
    PyTorch falls back to the unfused math, softmax and all (an H100 ran T5's self-attention so, and its
    cross-attention, whose zero bias needs none, fused).

    >>> q = torch.empty(1, 2, 8, 4, device="meta")
    >>> fused_on_cuda((q, q, q), {}), fused_on_cuda((q, q, q), {"attn_mask": torch.zeros(8, 8, requires_grad=True)})
    (True, False)
    """
    mask = {**dict(zip(_ATTENTION_ARGUMENTS, args)), **kwargs}.get("attn_mask")
    return not (isinstance(mask, torch.Tensor) and mask.requires_grad)


class FusedAttention(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` as CUDA runs it in training: the memory-efficient kernel, which keeps
    Q, K, V, the output and one float per query row (the meta device would decompose it into tokens × tokens
    scores). Left to PyTorch where that kernel does not take the call, or CUDA would not (:func:`fused_on_cuda`)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return call_inside(self, func, args, kwargs)
        if not fused_on_cuda(args, kwargs):
            return func(*args, **kwargs)
        given = {**dict(zip(_ATTENTION_ARGUMENTS, args)), **kwargs}
        try:
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                given["query"], given["key"], given["value"], given.get("attn_mask"), True,
                given.get("dropout_p", 0.0), given.get("is_causal", False), scale=given.get("scale"))[0]
        except (RuntimeError, TypeError, NotImplementedError):
            return func(*args, **kwargs)


_RNN_GATES = {torch.lstm: 4, torch.gru: 3, torch.rnn_tanh: 1, torch.rnn_relu: 1}


class _CudnnRNNCall(torch.autograd.Function):
    """One cuDNN RNN call's outputs, without its arithmetic: ``(input, reserve, *weights)`` in, ``(output, *h_n)``
    out. Its backward is as many operators as cuDNN's two (data and weights)."""

    @staticmethod
    def forward(ctx, x, reserve, shapes, *weights):
        ctx.save_for_backward(x, reserve, *weights)
        return tuple(x.new_empty(shape) for shape in shapes)

    @staticmethod
    def backward(ctx, *grads):
        x, reserve, *weights = ctx.saved_tensors
        return (torch.empty_like(x), None, None, *(torch.empty_like(w) for w in weights))


class CudnnRNN(TorchFunctionMode):
    """``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` as CUDA runs them in training: one cuDNN call a module forward (two in
    backward), keeping a reserve of every layer's gates for backward, where the meta device unrolls them into a
    dozen operators a time step (2,572 for a 2-layer LSTM over 64 tokens). What the host launches, not what the
    GPU computes (:class:`~gpurig.models.trace.Tracer` counts that). Packed sequences, or a call it cannot read,
    are left to PyTorch.

    >>> lstm = torch.nn.LSTM(16, 32, num_layers=2).to("meta")
    >>> with torch.device("meta"), CudnnRNN():
    ...     out, (h, c) = lstm(torch.empty(64, 4, 16, device="meta"))
    >>> out.shape, h.shape
    (torch.Size([64, 4, 32]), torch.Size([2, 4, 32]))
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        gates = _RNN_GATES.get(func)
        # (input, hx, weights, biases, layers, dropout, train, bidirectional, batch_first): LSTM's hx is (h, c),
        # the others' one tensor; a packed sequence's call has batch sizes where hx is
        unpacked = len(args) == 9 and (isinstance(args[1], (list, tuple)) if func is torch.lstm else
                                       isinstance(args[1], torch.Tensor) and args[1].is_floating_point())
        if gates is None or kwargs or not unpacked:
            return call_inside(self, func, args, kwargs)
        x, hx, weights, _, layers, _, _, bidirectional, batch_first = args
        hx = list(hx) if isinstance(hx, (list, tuple)) else [hx]
        directions = 2 if bidirectional else 1
        steps, batch = ((x.shape[1], x.shape[0]) if batch_first else x.shape[:2]) if x.dim() == 3 else (x.shape[0], 1)
        reserve = x.new_empty(layers * directions * steps * batch * (gates + 1) * hx[-1].shape[-1])
        shapes = (torch.Size((*x.shape[:-1], directions * hx[0].shape[-1])), *(h.shape for h in hx))
        return _CudnnRNNCall.apply(x, reserve, shapes, *weights)


def stand_in_loss(output) -> torch.Tensor:
    """A loss of the shape training uses, for what it holds: cross-entropy over the last dimension of each
    floating-point output with two or more dimensions (a classifier's scores, a language model's logits), an
    output that is already a loss as it is.

    >>> stand_in_loss(torch.zeros(4, 10, requires_grad=True)).shape
    torch.Size([])
    """
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        losses = [stand_in_loss(item) for item in output]
        losses = [loss for loss in losses if loss is not None]
        return sum(losses[1:], losses[0]) if losses else None
    if not isinstance(output, torch.Tensor) or not output.is_floating_point() or not output.requires_grad:
        return None
    if output.dim() < 2:
        return output.sum()
    labels = torch.zeros(output.shape[:-1].numel(), dtype=torch.long, device=output.device)
    return F.cross_entropy(output.flatten(0, -2), labels)


def trace_step(model: nn.Module, x: torch.Tensor, mixed: torch.dtype | None = None, loss_of=stand_in_loss,
               cuda: bool = True) -> dict[str, int]:
    """Bytes one training step of ``model`` on ``x`` (both on the meta device) holds at its peak beyond the
    weights: ``peak``, and what it is made of (:data:`PHASES`; the input batch counts as an activation); and
    ``forward_ops``, ``backward_ops``: the operators forward (with the loss) and backward dispatch, views left
    out, which a GPU's host launches one by one (:func:`gpurig.perf.step.predict_step`). ``mixed``: the 16-bit type of a
    mixed-precision step (CUDA autocast's casts, :class:`~gpurig.models.autocast.MetaAutocast`). ``loss_of``: the
    loss from the model's output (a stand-in by default, :func:`stand_in_loss`). ``cuda=False`` leaves
    attention and dropout as the meta device runs them, as a CPU does; by default they are CUDA's: its fused
    attention kernel (:class:`FusedAttention`) and dropout's one-byte mask.

    The weights' gradients are created by backward (``set_to_none``, PyTorch's default), and are all held
    once backward ends; the optimizer's step comes after (:mod:`gpurig.perf.footprint` prices it).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    live = LiveBytes(ignore=[*model.parameters(), *model.buffers()], dropout_mask_bytes=1 if cuda else None)
    hooks = [p.register_post_accumulate_grad_hook(lambda p: live.move(p.grad, "gradients")) for p in params]
    amp = MetaAutocast(mixed) if mixed is not None else contextlib.nullcontext()
    try:
        attention = FusedAttention() if cuda else contextlib.nullcontext()
        # the device first: the modes above it leave it on while they look inside a function (models.inside)
        with Placed("meta"), torch.device("meta"), live, attention, torch.enable_grad():
            with amp:
                output = model(x)
                live.phase = "output_and_loss"
                loss = loss_of(output)
            if mixed is not None:   # autocast's cache ends with its block; what autograd saved stays
                for cast in amp.weight_casts.values():
                    live.move(cast, "weight_casts")
                amp.weight_casts.clear()
            live.phase = "backward_working"
            if loss is not None:   # the output stays referenced through backward, as a training loop's does
                loss.backward()
            del output, loss
    finally:
        for hook in hooks:
            hook.remove()
        for p in params:
            p.grad = None
    batch = x.untyped_storage().nbytes()   # on the GPU for the whole step, saved by the first layer
    return {"peak": live.peak + batch, **live.at_peak, "activations": live.at_peak["activations"] + batch,
            "forward_ops": live.ops["activations"] + live.ops["output_and_loss"],
            "backward_ops": live.ops["backward_working"]}


def step_peaks(model: nn.Module, x: torch.Tensor, mixed: torch.dtype | None = None) -> dict[str, float]:
    """:func:`trace_step` at ``x``'s batch, and ``per_sample``: how much the peak grows with each sample more,
    from a second trace at twice the batch (a meta step costs the same at any batch), at batches large enough
    that the samples' share is most of the peak (up to 8^5 times ``x``'s).

    >>> from gpurig.models import mlp
    >>> with torch.device("meta"):
    ...     model = mlp()
    >>> peaks = step_peaks(model, torch.empty(64, 784, device="meta"))
    >>> peaks["per_sample"] > 0
    True
    """
    def traced(batch: int) -> dict:
        return trace_step(model, torch.empty((batch, *x.shape[1:]), dtype=x.dtype, device="meta"), mixed)

    at = trace_step(model, x, mixed)
    low, batch = at, x.shape[0]
    for _ in range(5):
        twice = traced(2 * batch)
        per_sample = (twice["peak"] - low["peak"]) / batch
        # where the batch's share is small, the peak sits where it does not grow (the end of backward, every
        # gradient held): its slope there understates what a large batch needs. Go on to where it dominates.
        if per_sample * batch >= 0.8 * low["peak"]:   # at the smaller batch already: both on the growing line
            break
        batch *= 8
        low = traced(batch)
    return {**at, "per_sample": per_sample}
