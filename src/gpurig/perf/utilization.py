"""How much of the hardware's arithmetic a training run uses: achieved FLOP/s and MFU (model FLOPs utilization).

MFU is the model's FLOPs per step over the step's time, as a share of the
devices' peak (PaLM's definition, as nanoGPT, Megatron and torchtitan report it).
The model's FLOPs per step are its description's forward and backward FLOPs
(:mod:`gpurig.models.describe`, counted as ``torch.utils.flop_counter`` counts
them): for a transformer that is the usual 3x forward (6N per token); a model
whose first layer takes the data needs less, as no gradient is computed for
the input (the reference MLP: 2.6x forward). Work the run does beyond the
model's — recomputed activations, codecs, padding — is not counted, so MFU
falls when it grows, as it should.

>>> round(mfu(flops_per_step=3e12, step_s=0.5, peak_flops_per_s=312e12, devices=8), 4)   # 6 TFLOP/s of 2496
0.0024
"""

from __future__ import annotations


def training_flops(forward_flops: float, backward_flops: float) -> float:
    """FLOPs of one training step of a model whose forward pass over the batch costs ``forward_flops`` and
    backward ``backward_flops`` (the optimizer's few FLOPs per parameter are not model FLOPs).

    >>> training_flops(1e9, 2e9)
    3000000000.0
    """
    return float(forward_flops + backward_flops)


def achieved_flops_per_s(flops_per_step: float, step_s: float) -> float:
    """The model's FLOPs per second of the job: one step's FLOPs (all ranks together) over its time.

    >>> achieved_flops_per_s(3e12, 0.5)
    6000000000000.0
    """
    return flops_per_step / step_s if step_s > 0 else 0.0


def mfu(flops_per_step: float, step_s: float, peak_flops_per_s: float | None, devices: int) -> float | None:
    """Model FLOPs utilization: achieved FLOP/s over ``devices`` times one device's peak (None: peak unknown).

    >>> mfu(1e12, 1.0, None, 2) is None
    True
    """
    if not peak_flops_per_s or devices < 1:
        return None
    return achieved_flops_per_s(flops_per_step, step_s) / (peak_flops_per_s * devices)


def blended_peak(flops_by_kind: dict[str, float], peak_by_kind: dict[str, float], default_peak: float) -> float:
    """The peak of a model whose layers run at different peaks (on an A100 in fp32, PyTorch runs convolutions in
    TF32 at 156 TFLOP/s and matrix multiplies in FP32 at 19.5): its FLOPs over the time they take at each
    kind's peak (``default_peak`` for kinds not in ``peak_by_kind``).

    >>> round(blended_peak({"conv": 9e9, "linear": 1e9}, {"conv": 156e12}, 19.5e12) / 1e12, 1)  # 90 % in TF32
    91.8
    """
    total = sum(flops_by_kind.values())
    seconds = sum(flops / peak_by_kind.get(kind, default_peak) for kind, flops in flops_by_kind.items())
    return total / seconds if seconds > 0 else default_peak


def flops_by_kind(spec) -> dict[str, float]:
    """A model description's forward and backward FLOPs per layer kind (``conv``, ``linear``, ...).

    >>> from gpurig.models import mlp
    >>> from gpurig.models.describe import describe
    >>> sorted(flops_by_kind(describe(mlp(), (784,))))
    ['linear']
    """
    kinds: dict[str, float] = {}
    for layer in spec.layers:
        flops = layer.forward_flops + layer.backward_flops
        if flops:
            kinds[layer.kind] = kinds.get(layer.kind, 0.0) + flops
    return kinds
