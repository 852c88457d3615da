"""Benchmarks in this process: GEMM by batch size, host↔device copies, data loading, disk reads.

Each returns plain data for the machine profile (:mod:`gpurig.measure.bench`) and
takes its sizes as arguments, so ``--quick`` and the tests run small ones.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
import time

import numpy as np
import torch

from gpurig.timing import device_sync, timed


def gemm(batches: list[int], k: int, n: int, device: torch.device, repeats: int = 5,
         dtype: torch.dtype = torch.float32) -> list[dict]:
    """Throughput of ``(batch × k) @ (k × n)`` for each batch size: the tile effect of the source.

    Batches that are multiples of 32/64 fill the GEMM's tiles; odd sizes leave
    parts of the last tile empty. FLOPs = 2 · batch · k · n.

    >>> rows = gemm([32, 33], k=64, n=64, device=torch.device("cpu"), repeats=1)
    >>> [r["batch"] for r in rows], all(r["tflops"] > 0 for r in rows)
    ([32, 33], True)
    """
    weight = torch.randn(k, n, device=device, dtype=dtype)
    sync = device_sync(device)
    rows = []
    for batch in batches:
        x = torch.randn(batch, k, device=device, dtype=dtype)
        inner = max(1, int(2e8 // (2 * batch * k * n)))  # enough multiplications per timing to beat timer noise

        def run():
            for _ in range(inner):
                torch.mm(x, weight)

        seconds = timed(run, repeats, sync) / inner
        rows.append({"batch": batch, "k": k, "n": n, "seconds": seconds,
                     "tflops": 2 * batch * k * n / seconds / 1e12, "multiple_of": _multiple(batch)})
    return rows


def _multiple(batch: int) -> int:
    """The largest of 64, 32, 16, 8 that divides ``batch`` (1 when none).

    >>> _multiple(96), _multiple(64), _multiple(33)
    (32, 64, 1)
    """
    return next((m for m in (64, 32, 16, 8) if batch % m == 0), 1)


def host_device(sizes: list[int], repeats: int = 5) -> dict:
    """Host→device and device→host GB/s, pinned and pageable host memory, per size (needs CUDA).

    >>> host_device([1 << 20])["available"] == torch.cuda.is_available()
    True
    """
    if not torch.cuda.is_available():
        return {"available": False, "reason": "no CUDA device", "rows": []}
    device = torch.device("cuda", 0)
    sync = device_sync(device)
    rows = []
    for nbytes in sizes:
        gpu = torch.empty(nbytes, dtype=torch.uint8, device=device)
        for pinned in (True, False):
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
            for direction, fn in (("h2d", lambda: gpu.copy_(host, non_blocking=pinned)),
                                  ("d2h", lambda: host.copy_(gpu, non_blocking=pinned))):
                seconds = timed(fn, repeats, sync)
                rows.append({"direction": direction, "pinned": pinned, "bytes": nbytes, "seconds": seconds,
                             "gbs": nbytes / seconds / 1e9})
    return {"available": True, "device": torch.cuda.get_device_name(device), "rows": rows}


def _write_batches(path: str, batch_bytes: int, count: int) -> None:
    block = os.urandom(min(batch_bytes, 1 << 20))
    with open(path, "wb") as f:
        for _ in range(count):
            left = batch_bytes
            while left > 0:
                f.write(block[:left])
                left -= len(block)


def _read_batch(path: str, index: int, batch_bytes: int) -> torch.Tensor:
    with open(path, "rb", buffering=0) as f:
        f.seek(index * batch_bytes)
        data = f.read(batch_bytes)
    # "decode": bytes to floats, in numpy (one thread, no GIL held), not in torch's thread pool
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).astype(np.float32))


def _drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def loading(batch_bytes: int, steps: int, compute_size: int = 256, directory: str | None = None) -> dict:
    """Per-step time when each batch is read from a file before computing (blocking) vs read ahead by a thread.

    The compute is real matrix multiplies, as many as take about as long as one
    read (the case where overlap matters most): on the GPU when there is one (the
    host only waits, as in training), else on all cores but one, which is left
    to the reader. The read is a real file read, from the disk where the page
    cache can be dropped, plus a conversion to floats. Prefetching hides the
    smaller of the two, as the source says an asynchronous loader hides a slow disk.

    >>> r = loading(1 << 16, steps=3, compute_size=64)
    >>> sorted(r) == ["batch_bytes", "blocking_ms", "compute_ms", "load_ms", "prefetch_ms", "steps"]
    True
    """
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    sync = device_sync(device)
    a = torch.randn(compute_size, compute_size, device=device)
    reps = 1

    def compute():
        for _ in range(reps):
            torch.mm(a, a)
        sync()

    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(max(1, threads - 1))
    try:
        with tempfile.TemporaryDirectory(dir=directory, prefix="gpurig-bench-") as tmp:
            path = os.path.join(tmp, "batches.bin")
            _write_batches(path, batch_bytes, steps)
            _drop_cache(path)
            load_s = timed(lambda: _read_batch(path, 0, batch_bytes), 3)
            reps = max(1, round(load_s / timed(compute, 3)))
            compute_s = timed(compute, 3)

            _drop_cache(path)
            start = time.perf_counter()
            for i in range(steps):
                _read_batch(path, i, batch_bytes)
                compute()
            blocking = (time.perf_counter() - start) / steps

            ready: queue.Queue = queue.Queue(maxsize=2)

            def prefetcher():
                for i in range(steps):
                    ready.put(_read_batch(path, i, batch_bytes))

            _drop_cache(path)
            start = time.perf_counter()
            thread = threading.Thread(target=prefetcher, daemon=True)
            thread.start()
            for _ in range(steps):
                ready.get()
                compute()
            thread.join()
            prefetch = (time.perf_counter() - start) / steps
    finally:
        torch.set_num_threads(threads)
    return {"batch_bytes": batch_bytes, "steps": steps, "load_ms": 1e3 * load_s, "compute_ms": 1e3 * compute_s,
            "blocking_ms": 1e3 * blocking, "prefetch_ms": 1e3 * prefetch}


def disk_read(nbytes: int, directory: str | None = None, block: int = 4 << 20) -> dict:
    """Sequential read speed of a fresh file in ``directory``, with the page cache dropped for it first.

    The file is written, flushed to disk, and its cached pages released
    (``posix_fadvise(DONTNEED)``) so that the read comes from the device.

    >>> r = disk_read(1 << 20); r["mb_per_s"] > 0
    True
    """
    with tempfile.TemporaryDirectory(dir=directory, prefix="gpurig-bench-") as tmp:
        path = os.path.join(tmp, "read.bin")
        _write_batches(path, nbytes, 1)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            dropped = hasattr(os, "posix_fadvise")
            if dropped:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            start = time.perf_counter()
            while os.read(fd, block):
                pass
            seconds = time.perf_counter() - start
        finally:
            os.close(fd)
    return {"directory": directory or tempfile.gettempdir(), "bytes": nbytes, "seconds": seconds,
            "mb_per_s": nbytes / seconds / 1e6, "cache_dropped": dropped}
