"""What ``gpurig train`` reports as achieved TFLOP/s and MFU: the model's FLOPs per step, and the devices' peak.

The FLOPs come from the model's description (:func:`gpurig.models.describe.describe`,
the formulas of :mod:`gpurig.perf.utilization`); the peak from the catalog on a GPU
(its datasheet rate in the run's precision) or, on CPU ranks, from the GEMM rate
``gpurig bench`` measured with this many ranks computing at once (this job's own
calibration when it predicts, else ``runs/bench/profile.json``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from gpurig.train.config import TrainConfig

PEAK_UNKNOWN = "peak unknown: run gpurig bench"
BENCH_PROFILE = "runs/bench/profile.json"


def flops_per_step(model: torch.nn.Module, sample: torch.Tensor, global_batch: int) -> float | None:
    """The model's FLOPs in one training step of ``global_batch`` samples like ``sample`` (None: it cannot be
    described without running it).

    >>> from gpurig import models
    >>> flops_per_step(models.build("mlp"), torch.zeros(1, 784), 128) / 128 / 1e6    # MFLOPs per sample
    12.4752
    """
    from gpurig.errors import UsageError
    from gpurig.models.describe import describe
    from gpurig.perf.utilization import training_flops

    try:
        spec = describe(model, sample[:1], batch=global_batch)
    except UsageError:
        return None
    return training_flops(spec.forward_flops, spec.backward_flops)


def peak_flops_per_s(device: torch.device, config: TrainConfig, ranks_per_node: int,
                     profiles: tuple[str, ...] = ()) -> tuple[float | None, str]:
    """One rank's peak FLOP/s and where it comes from (or None and :data:`PEAK_UNKNOWN`).

    >>> peak_flops_per_s(torch.device("cpu"), TrainConfig(), 2, profiles=("/nonexistent.json",))
    (None, 'peak unknown: run gpurig bench')
    """
    if device.type == "cuda":
        from gpurig.perf.precision import precision_on
        from gpurig.spec import catalog

        name = torch.cuda.get_device_name(device)
        try:
            gpu = catalog.gpu(name)
        except Exception:  # not in the catalog: no peak to divide by
            return None, f"peak unknown: {name} is not in gpurig's catalog"
        peak = precision_on(gpu, config.precision).linear_tflops
        return peak * 1e12, f"{gpu.name} {config.precision} peak {peak:g} TFLOP/s (catalog)"
    from gpurig.measure.profile import load_profile
    from gpurig.perf.machine import profile_device

    for path in profiles:
        if not Path(path).is_file():
            continue
        try:
            rate = profile_device(load_profile(path), ranks_per_node).gemm.flops_per_s
        except Exception:  # a profile without compute measurements, or unreadable: try the next
            continue
        return rate, f"GEMM {rate / 1e9:.1f} GFLOP/s per rank ({path}, measured)"
    return None, PEAK_UNKNOWN


def achieved(flops: float | None, step_s: float, peak: float | None, ranks: int) -> dict:
    """An epoch's ``tflops`` (the job's model TFLOP/s) and ``mfu`` (None: the peak, or the FLOPs, unknown).

    >>> achieved(3e12, 0.5, 1e12, 8)
    {'tflops': 6.0, 'mfu': 0.75}
    """
    from gpurig.perf.utilization import achieved_flops_per_s, mfu

    if flops is None:
        return {"tflops": None, "mfu": None}
    used = mfu(flops, step_s, peak, ranks)
    return {"tflops": round(achieved_flops_per_s(flops, step_s) / 1e12, 5),
            "mfu": None if used is None else round(used, 5)}
