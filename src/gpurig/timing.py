"""Timing a piece of work: repeated runs, a device sync after each, the fastest or the typical one;
or several pieces timed turn about.

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


def timed_turns(fns: list, rounds: int = 7, sync=None, before=None, warm: int = 1) -> list[float]:
    """Seconds one run of each of ``fns`` typically takes, timed turn about: ``rounds`` rounds in which each
    function is timed once, and per function the median of its rounds. Each timed run follows ``warm``
    untimed runs of the same function (caches and the thread pool then stand as in a run of repeats), and
    ``before()`` is called before those (a barrier, so that every rank times the same function at once).

    On a machine whose speed drifts (a shared VM), timing one function's repeats back to back lets a slow
    spell land on all of them, and that function then looks slow next to the others; turn about, the spell
    lands on one round of a few functions and the median drops it, so the functions stay comparable with
    each other, which is what a model fitted to them needs.

    >>> fast, slow = timed_turns([lambda: None, lambda: time.sleep(0.002)], rounds=3)
    >>> fast < 0.002 <= slow
    True
    """
    sync = sync or (lambda: None)
    before = before or (lambda: None)
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, seen in zip(fns, times):
            before()
            for _ in range(warm):
                fn()
            sync()
            start = time.perf_counter()
            fn()
            sync()
            seen.append(time.perf_counter() - start)
    return [statistics.median(seen) for seen in times]
