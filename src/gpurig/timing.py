"""Timing a piece of work: repeated runs, a device sync after each, the fastest or the typical one.

A leaf module (like :mod:`gpurig.units`): benchmarks, ``gpurig bench`` and
``compression="auto"``'s codec costs all time work the same way.
"""

from __future__ import annotations

import statistics
import time


def device_sync(device) -> callable:
    """A function that waits for ``device``'s queued work (a no-op on a CPU).

    >>> import torch; device_sync(torch.device("cpu"))() is None
    True
    """
    import torch

    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def timed(fn, repeats: int = 3, sync=None, typical: bool = False, warmup: int = 1) -> float:
    """Seconds one run of ``fn()`` takes: the fastest of ``repeats`` (least disturbed by other work), or with
    ``typical`` the median (what a run takes while neighbours compete). ``warmup`` runs go first, untimed.

    >>> timed(lambda: None) < 0.01
    True
    """
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) if typical else min(times)
