"""The software a step runs on, as an input: the same GPU computes slower on older framework releases.

The published training results gpurig is fitted to ran in NVIDIA's PyTorch containers of three eras, and
the same GPU, model and batch runs 5-15 % slower on the older ones (Lambda's v0 and v1 tables, A100 and
RTX 3090 / A6000 rows side by side; fp16 Transformer-XL on a V100 1.6x its fp32 rate under apex, 2.7x on
NGC 22.09). ``--software`` names the release; each costs a fitted factor on every compute rate
(:attr:`gpurig.perf.machine.GpuEfficiency.software`), one for FP32/TF32 steps and one for mixed precision.

>>> check("pytorch-1.4")
'pytorch-1.4'
>>> check("tensorflow")
Traceback (most recent call last):
...
gpurig.errors.UsageError: unknown software 'tensorflow'; choose one of: current, pytorch-1.7, pytorch-1.4
"""

from __future__ import annotations

from gpurig.errors import UsageError

# release -> what it is (the published rows of each: benchmarks/data/README.md)
RELEASES = {
    "current": "PyTorch 1.13 or later (NGC 22.09 on): native AMP, CUDA 11.8+ libraries (the default)",
    "pytorch-1.7": "PyTorch 1.7 (NGC 20.10): native AMP, CUDA 11.1, cuDNN 8.0 (Lambda's first Ampere runs)",
    "pytorch-1.4": "PyTorch 1.4 (NGC 20.01): apex AMP, CUDA 10.2, cuDNN 7.6 (Lambda's first pre-Ampere runs)",
}
DEFAULT = "current"
# The --precision values each older release can run: TF32 needs CUDA 11 (PyTorch 1.7), bf16 autocast PyTorch 1.10,
# fp8 Transformer Engine (2022); "current" runs them all.
PRECISIONS = {"pytorch-1.7": ("fp32", "tf32", "fp16"), "pytorch-1.4": ("fp32", "fp16")}


def check(name: str, precision: str | None = None) -> str:
    """``name`` if it is a release gpurig prices (and it runs ``precision``); one line with the choices otherwise.

    >>> check("pytorch-1.7", "bf16")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --precision bf16 needs a later PyTorch than --software pytorch-1.7, which runs fp32, tf32, fp16
    """
    if name not in RELEASES:
        raise UsageError(f"unknown software {name!r}; choose one of: {', '.join(RELEASES)}")
    runs = PRECISIONS.get(name)
    if precision is not None and runs is not None and precision not in runs:
        raise UsageError(f"--precision {precision} needs a later PyTorch than --software {name}, which runs "
                         f"{', '.join(runs)}")
    return name
