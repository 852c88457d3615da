"""One optimizer step on a GPU, as PyTorch runs it: the passes its kernels make over the weights, gradients and
states, and the kernels the host launches for them.

PyTorch implements an optimizer three ways (``torch.optim``'s ``foreach`` and ``fused`` arguments):

- ``fused``: one kernel does the whole update, reading each weight, gradient and state once and writing the
  weight and states once (``fused=True``; apex's FusedAdam / FusedSGD / FusedLAMB);
- ``foreach``: one multi-tensor kernel per elementwise operator of the update, over many tensors at a time
  (the default on CUDA since PyTorch 2.0): few launches, but every operator is its own pass over memory;
- ``for-loop``: the same operators one tensor at a time (``foreach=False``, the only way before PyTorch 2.0,
  and how hand-written optimizers run): a model of hundreds of tensors launches thousands of kernels a step.

The GPU streams the passes while the host launches; with no synchronisation between them the step takes the
longer of the two.

>>> bert = [768 * 768] * 48 + [768] * 150           # 198 tensors, 28 M values: a BERT-base's encoder, roughly
>>> [round(step_seconds("adam", impl, bert, 1e12, 90e-6, 22e-6) * 1e3, 1) for impl in IMPLEMENTATIONS]
[0.8, 2.0, 13.4]
"""

from __future__ import annotations

import math

from gpurig.errors import UsageError
from gpurig.perf.compute import DTYPE_BYTES, memory_seconds

IMPLEMENTATIONS = {
    "fused": "one kernel for the whole update (torch.optim's fused=True, apex's fused optimizers)",
    "foreach": "one multi-tensor kernel per operator of the update (PyTorch 2's default on CUDA)",
    "for-loop": "the update's operators one tensor at a time (foreach=False; PyTorch before 2.0; hand-written)",
}

# FP32 values moved per parameter value. Fused: weight, gradient and states read, weight and states written
# (SGD 3, momentum 5, Adam 7; LAMB reads the weight and the update once more for its two norms).
FUSED_PASSES = {"sgd": 3, "momentum": 5, "adam": 7, "adamw": 7, "lamb": 9}
# Operator by operator, each reading its inputs and writing its output (torch.optim's single-tensor SGD and Adam,
# the LAMB of benchmarks/optimizer_host.py):
# - momentum: buf.mul_ 2, buf.add_(grad) 3, weight.add_(buf) 3;
# - Adam: m.lerp_ 3, v.mul_ 2, v.addcmul_ 3, sqrt 2, division by the bias correction 2, add eps 2, weight.addcdiv_ 4;
#   AdamW decays the weight first (weight.mul_ 2);
# - LAMB: Adam's moments 8, the update m / (√v + eps) 7, its weight decay 3, the two norms 2, scaling it 2, weight 3.
UNFUSED_PASSES = {"sgd": 3, "momentum": 8, "adam": 18, "adamw": 20, "lamb": 25}
# Kernels per tensor list (foreach) or per tensor (for-loop), counted as above.
KERNELS = {"sgd": 1, "momentum": 3, "adam": 7, "adamw": 8, "lamb": 15}
# For-loop: the host's time per tensor against one layer's forward and backward (``layer_overhead_s``), on tensors of
# 16 values in one process (measured, not fitted: ``benchmarks/optimizer_host.py``, torch 2.13, SGD 0.067, momentum
# 0.22-0.23, Adam 0.72-0.80, LAMB 1.20-1.44 in six runs, AdamW 0.78-0.85 in three). Adam's loop also does per-tensor
# Python (its step count, bias corrections).
FOR_LOOP_HOST_SHARE = {"sgd": 0.07, "momentum": 0.22, "adam": 0.75, "adamw": 0.82, "lamb": 1.3}
# A multi-tensor launch covers at most this many tensors or values (PyTorch's MultiTensorApply.cuh: lists of
# depth 3 hold 48 tensors; 320 blocks of 65,536 values), so a large model's foreach operator takes several.
TENSORS_PER_LAUNCH = 48
VALUES_PER_LAUNCH = 320 * 65536


def default_implementation(software: str) -> str:
    """How torch.optim runs an optimizer on CUDA by default under ``software`` (:mod:`gpurig.perf.software`):
    foreach on current PyTorch, for-loop on the releases before 2.0.

    >>> default_implementation("current"), default_implementation("pytorch-1.7")
    ('foreach', 'for-loop')
    """
    return "foreach" if software == "current" else "for-loop"


def check_optimizer(optimizer: str, implementation: str | None = None) -> None:
    """Refuse, in one line, an optimizer gpurig does not price or an implementation it does not know (None: the
    default, :func:`default_implementation`).

    >>> check_optimizer("adagrad")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --optimizer must be one of sgd, momentum, adam, adamw, lamb, got 'adagrad'
    """
    if optimizer not in FUSED_PASSES:
        raise UsageError(f"--optimizer must be one of {', '.join(FUSED_PASSES)}, got {optimizer!r}")
    if implementation is not None:
        check(implementation)


def check(implementation: str) -> str:
    """``implementation`` if gpurig prices it; one line with the choices otherwise.

    >>> check("apex")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: unknown optimizer implementation 'apex'; choose one of: fused, foreach, for-loop
    """
    if implementation not in IMPLEMENTATIONS:
        raise UsageError(f"unknown optimizer implementation {implementation!r}; "
                         f"choose one of: {', '.join(IMPLEMENTATIONS)}")
    return implementation


def step_seconds(optimizer: str, implementation: str, sizes, memory_bytes_per_s: float, layer_overhead_s: float,
                 launch_s: float) -> float:
    """One step of ``optimizer`` run as ``implementation`` over tensors of ``sizes`` values: the longer of its
    passes over memory at ``memory_bytes_per_s`` and the host's launches (for-loop: each tensor at its measured
    share of ``layer_overhead_s``; foreach and fused: each multi-tensor launch at ``launch_s``).

    >>> step_seconds("momentum", "fused", [10**6] * 100, 1e12, 90e-6, 22e-6)    # 2 GB of passes: memory-bound
    0.002
    >>> round(step_seconds("momentum", "for-loop", [10] * 1000, 1e12, 90e-6, 22e-6), 4)   # a launch-bound loop
    0.0198
    """
    sizes = list(sizes)
    values = sum(sizes)
    if not values:
        return 0.0
    passes = FUSED_PASSES if implementation == "fused" else UNFUSED_PASSES
    memory = memory_seconds(values * passes[optimizer] * DTYPE_BYTES, memory_bytes_per_s)
    if implementation == "for-loop":
        host = len(sizes) * FOR_LOOP_HOST_SHARE[optimizer] * layer_overhead_s
    else:
        lists = max(math.ceil(len(sizes) / TENSORS_PER_LAUNCH), math.ceil(values / VALUES_PER_LAUNCH))
        host = (1 if implementation == "fused" else KERNELS[optimizer]) * lists * launch_s
    return max(memory, host)
