"""What a training step holds in one GPU's memory, and the largest batch that fits.

A rank holds the weights, the optimizer's state, cuBLAS's workspaces (which
PyTorch takes from its allocator) and, with several ranks, the gradient buckets
for the whole step, and on top of them what the step makes.
That part is taken from the step itself, traced on the meta device
(:mod:`gpurig.models.peak`): the most forward, the loss and backward hold at once
(backward frees each layer's saved tensors as it makes its gradients), or the
optimizer's step with every gradient and its own working copy, whichever is
more. When the meta device cannot run a model's backward, the parts are added
up instead, as follows. A rank holds, besides the CUDA context and cuDNN's
workspaces (not counted: outside, or not predicted):

- the weights in FP32, their gradients in FP32 and the optimizer's state
  (momentum: one value per parameter; Adam: two);
- under mixed precision, the weights' 16-bit copies that autocast keeps for the step;
- with several ranks, the gradient buckets DataParallel (and DDP) average: one
  more gradient copy;
- with ``shard`` (ZeRO, ``gpurig train --shard``): the optimizer's state for 1/N
  of the parameters; with ``"gradients"`` (stage 2) also only 1/N of the
  gradients, plus the one bucket in flight (its full buffer lives from its
  launch until its reduce-scatter ends) instead of a second whole copy;
- the activations backward needs: the tensors autograd saved in forward, counted
  as the model was described (:class:`gpurig.models.trace.SavedActivations`), plus
  the largest of them once more, for its gradient while backward starts. Under mixed
  precision, each typed as CUDA's autocast types it (:mod:`gpurig.models.autocast`):
  16-bit for what products save, FP32 for norms, softmax and a transformer's residual
  stream. A BERT layer keeps 0.63x its FP32 bytes, a ResNet 0.51x; a description
  without that trace falls back to half;
- the model's output and its loss: the output itself (held by the loss), the
  loss's own copy (cross-entropy keeps its log-probabilities) and, in backward, the
  gradients of both at once: four copies, the last three in FP32 under mixed
  precision too (autocast runs the loss in FP32). A classifier's are small; a
  language model's logits are batch × tokens × vocabulary: on a lent H100, GPT-2
  (124 M parameters, 4 × 1024 tokens) peaked at 7.2 GiB where saved tensors and
  states alone predicted 3.6 (docs/gpu/h100-2026-11-26), and a CPU step's
  allocations peak at exactly four logits more than before the step (tests/test_perf.py).
  All of these grow with the batch; the rest does not, so the largest batch that
  fits follows from one batch's worth. A description written
  before gpurig counted saved tensors falls back to every layer's input (in-place
  activations, such as convolutional nets' ReLU, keeping nothing of their own).

>>> from gpurig.models import model_spec
>>> m = step_memory(model_spec("mnist-mlp", batch=64), "momentum", mixed=False, ranks=1)
>>> m["weights"], m["optimizer"], m["activations"] > 0
(9580840, 9580840, True)
"""

from __future__ import annotations

import math

from gpurig.perf.compute import DTYPE_BYTES

# Optimizer state per parameter, in FP32 values (SGD keeps nothing, momentum one buffer, Adam/LAMB two moments).
OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2, "lamb": 2}
# What the optimizer's step makes on top, per parameter, in FP32 values: PyTorch's foreach Adam (CUDA's default)
# computes √v for every parameter at once before adding the update to the weights; SGD works in place. One tensor
# at a time (for-loop) it is the largest tensor's; a fused kernel keeps it in registers (:func:`optimizer_working`).
OPTIMIZER_WORKING = {"sgd": 0, "momentum": 0, "adam": 1, "adamw": 1, "lamb": 1}
# Activations that overwrite their input (nn.ReLU(inplace=True) in every torchvision convolutional net).
IN_PLACE = {"ReLU", "ReLU6", "LeakyReLU", "Hardtanh"}
# What the allocator cannot hand to tensors: fragmentation between differently sized blocks, and the CUDA
# context with the libraries' own memory.
FRAGMENTATION = 0.05
CONTEXT_BYTES = 0.5 * 2**30


BUCKET_BYTES = 25 * 2**20  # DataParallel's (and DDP's) gradient bucket
# cuBLAS's workspace, which PyTorch takes from its caching allocator, one per handle and stream: the forward's
# thread and autograd's backward thread have one each. PyTorch's default size (CublasHandlePool.cpp, unless
# CUBLAS_WORKSPACE_CONFIG says otherwise): 4096 KiB × 8 on Hopper and later, 4096 KiB × 2 + 16 KiB × 8 before.
CUBLAS_WORKSPACE = {"Hopper": 32 * 2**20, "Blackwell": 32 * 2**20}
CUBLAS_WORKSPACE_BEFORE_HOPPER = 2 * 4096 * 2**10 + 8 * 16 * 2**10


def library_workspaces(gpu) -> int:
    """Bytes of libraries' workspaces a training step's GPU holds in PyTorch's allocator (cuBLAS's two), for a
    catalog GPU; none known for other vendors' GPUs or without a GPU.

    >>> from gpurig.spec import catalog
    >>> library_workspaces(catalog.gpu("H100 SXM5 80GB")) / 2**20, library_workspaces(catalog.gpu("RTX 3090")) / 2**20
    (64.0, 16.25)
    """
    if gpu is None or gpu.vendor != "NVIDIA":
        return 0
    return 2 * CUBLAS_WORKSPACE.get(gpu.architecture, CUBLAS_WORKSPACE_BEFORE_HOPPER)


def optimizer_working(spec, optimizer: str, implementation: str, shards: int = 1) -> int:
    """Bytes the optimizer's step makes on top of its state (:data:`OPTIMIZER_WORKING`) for ``spec``'s trainable
    tensors run as ``implementation`` (:mod:`gpurig.perf.optimizer`), each rank updating 1/``shards`` of them.

    >>> from gpurig.models import model_spec
    >>> bert = model_spec("bert-base", batch=8, tokens=128)
    >>> [round(optimizer_working(bert, "adam", i) / 2**20) for i in ("foreach", "for-loop", "fused")]
    [418, 89, 0]
    """
    if implementation == "fused":
        return 0
    if implementation == "for-loop" and shards == 1:
        values = max((math.prod(shape) for layer in spec.layers for _, shape in layer.trainable_shapes), default=0)
    else:   # foreach, and ZeRO's flat share: every value at once
        values = math.ceil(spec.trainable_parameters / shards)
    return values * DTYPE_BYTES * OPTIMIZER_WORKING[optimizer]


def step_memory(spec, optimizer: str, mixed: bool, ranks: int, shard: str = "none",
                traced: dict | None = None, workspaces: int = 0, implementation: str = "foreach") -> dict[str, int]:
    """Bytes one rank holds at the peak of a training step of ``spec`` (a described model at its batch), by kind.

    ``shard``: ``"optimizer"``, each of the ``ranks`` keeps its share of the optimizer state (ZeRO stage 1,
    PyTorch's ``ZeroRedundancyOptimizer``); ``"gradients"``, of the gradients too (stage 2).

    With ``traced``, the step's peak traced at ``spec``'s batch and precision (:func:`gpurig.models.step_peak`),
    the parts are what is held at the step's peak: at backward's, or at the optimizer's step when that holds
    more (every gradient and the optimizer's working copy, ``optimizer_working``). Without, every activation,
    gradient and copy is added up. ``workspaces``: libraries' workspaces held for the step
    (:func:`library_workspaces`). ``implementation``: how the optimizer runs (:func:`optimizer_working`).

    >>> from gpurig.models import model_spec
    >>> bert = step_memory(model_spec("bert-base", batch=32, tokens=128), "adam", mixed=True, ranks=8)
    >>> round(bert["optimizer"] / bert["weights"]), bert["amp_copies"] * 2 == bert["weights"]
    (2, True)
    >>> zero2 = step_memory(model_spec("bert-base", batch=32, tokens=128), "adam", True, 8, shard="gradients")
    >>> round(zero2["optimizer"] / bert["optimizer"], 3), round(zero2["gradients"] / bert["gradients"], 3)
    (0.125, 0.125)
    >>> from gpurig.models import step_peak
    >>> bert8 = model_spec("bert-base", batch=8, tokens=128)
    >>> traced = step_memory(bert8, "momentum", False, 1, traced=step_peak("bert-base", 8, tokens=128))
    >>> round(sum(traced.values()) / sum(step_memory(bert8, "momentum", False, 1).values()), 2)   # backward frees
    0.8
    """
    held, backward, optimizer_step = _peaks(spec, optimizer, mixed, ranks, shard, traced, workspaces, implementation)
    return {**held, **max(backward, optimizer_step, key=lambda parts: sum(parts.values()))}


def _peaks(spec, optimizer: str, mixed: bool, ranks: int, shard: str, traced: dict | None,
           workspaces: int = 0, implementation: str = "foreach") -> tuple[dict, dict, dict]:
    """What the whole step holds (weights, optimizer state, buckets, workspaces), and on top of it at backward's
    peak and at the optimizer step's (all zeros when the step was not traced: the summed parts are then backward's)."""
    params = spec.trainable_parameters   # what has a gradient and optimizer state; frozen weights have neither
    shards = ranks if shard != "none" else 1
    stage2 = shard == "gradients" and ranks > 1
    gradients = params * DTYPE_BYTES
    held = {
        "weights": spec.parameters * DTYPE_BYTES,
        "optimizer": math.ceil(params / shards) * DTYPE_BYTES * OPTIMIZER_STATES[optimizer],
        "buckets": (min(params * DTYPE_BYTES, BUCKET_BYTES) if stage2 else params * DTYPE_BYTES) if ranks > 1 else 0,
        "workspaces": workspaces,
        "buffers": spec.buffer_bytes,
    }
    if traced:
        share = 1 / ranks if stage2 else 1   # ZeRO-2 keeps its share of each bucket's averaged gradients
        backward = {"gradients": round(traced["gradients"] * share), "amp_copies": traced["weight_casts"],
                    "activations": traced["activations"], "output_and_loss": traced["output_and_loss"],
                    "backward_working": traced["backward_working"], "optimizer_working": 0}
        optimizer_step = {**dict.fromkeys(backward, 0), "gradients": round(gradients * share),
                          "optimizer_working": optimizer_working(spec, optimizer, implementation, shards)}
        return held, backward, optimizer_step
    if mixed and spec.mixed_saved_bytes:
        activations = spec.mixed_saved_bytes + spec.mixed_largest_saved_bytes
    elif spec.saved_bytes:
        activations = (spec.saved_bytes + spec.largest_saved_bytes) * ((2 if mixed else DTYPE_BYTES) / DTYPE_BYTES)
    else:
        values = sum(layer.input_elements for layer in spec.layers
                     if layer.kind != "embedding" and layer.module not in IN_PLACE)
        values += sum(layer.output_elements for layer in spec.layers if layer.kind == "embedding")
        activations = values * (2 if mixed else DTYPE_BYTES)
    output = spec.output_bytes / DTYPE_BYTES  # values
    held_output = (spec.mixed_output_bytes or output * 2) if mixed else spec.output_bytes
    backward = {
        "gradients": math.ceil(params / ranks) * DTYPE_BYTES if stage2 else gradients,
        "amp_copies": spec.parameters * 2 if mixed else 0,
        "activations": round(activations),
        "output_and_loss": round(held_output + output * 3 * DTYPE_BYTES),
        "backward_working": 0,
        "optimizer_working": 0,
    }
    return held, backward, dict.fromkeys(backward, 0)


def largest_fitting_batch(spec, optimizer: str, mixed: bool, ranks: int, memory_gb: float,
                          shard: str = "none", traced: dict | None = None, workspaces: int = 0,
                          implementation: str = "foreach") -> int:
    """The largest per-GPU batch of ``spec``'s model whose step fits ``memory_gb``: backward's peak grows with
    each sample (by the traced growth, or by the activations' and output's share), the optimizer step's does not.

    >>> from gpurig.models import model_spec
    >>> from gpurig.models import step_peak
    >>> largest_fitting_batch(model_spec("bert-base", batch=8, tokens=128), "adam", False, 1, 24,
    ...                       traced=step_peak("bert-base", 8, tokens=128))
    280
    """
    held, backward, optimizer_step = _peaks(spec, optimizer, mixed, ranks, shard, traced, workspaces, implementation)
    if sum(held.values()) + sum(optimizer_step.values()) > usable_bytes(memory_gb):
        return 0
    now = sum(held.values()) + sum(backward.values())
    per_sample = traced["per_sample"] if traced else (backward["activations"] + backward["output_and_loss"]) / spec.batch
    return largest_batch(now - per_sample * spec.batch, per_sample, memory_gb)


def usable_bytes(memory_gb: float) -> float:
    """Of a GPU's memory, what tensors can have: less the CUDA context and fragmentation.

    >>> round(usable_bytes(80) / 2**30, 1)
    75.5
    """
    return (memory_gb * 2**30 - CONTEXT_BYTES) * (1 - FRAGMENTATION)


def largest_batch(fixed_bytes: float, per_sample_bytes: float, memory_gb: float) -> int:
    """The largest per-GPU batch whose step fits ``memory_gb``, 0 when not even the weights fit.

    >>> largest_batch(10 * 2**30, 0.5 * 2**30, 24)
    24
    """
    room = usable_bytes(memory_gb) - fixed_bytes
    return max(0, math.floor(room / per_sample_bytes)) if per_sample_bytes > 0 else 0
