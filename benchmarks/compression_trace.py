"""Where a compressed step's time goes: one rank's timeline of a DataParallel step, over an emulated link.

    .venv/bin/python benchmarks/compression_trace.py                  # int8, 1 Gbit/s; needs root
    .venv/bin/python benchmarks/compression_trace.py --codec fp16 --rate 10gbit

Two emulated nodes x 1 rank train the source's MLP (64 samples per rank). For
the last steps, rank 0 prints when (ms after backward began) each bucket was
launched on the main thread, when its compressed average was begun and finished
on the communication thread, and every wait on an MPI request: the table in
docs/benchmarks.md ("Where an int8 step's time goes") was read from such lines.
The timestamps come from wrapping those methods in this script; nothing in
gpurig changes.
"""

import argparse
import os
import sys
import time

STEPS, SHOWN = 40, 5


def trace(codec: str) -> None:
    import torch
    import torch.nn.functional as F

    import gpurig
    from gpurig import models
    from gpurig.comm import mpi_engine
    from gpurig.parallel import compression
    from gpurig.parallel.data_parallel import DataParallel

    events = []

    def timed(owner, method: str, label: str) -> None:
        inner = getattr(owner, method)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            result = inner(*args, **kwargs)
            events.append((label, start, time.perf_counter()))
            return result

        setattr(owner, method, wrapper)

    timed(DataParallel, "_launch", "launch")
    timed(compression.CompressedAverage, "__init__", "begin")
    timed(compression.CompressedAverage, "finish", "finish")
    timed(mpi_engine.Request, "wait", "wait")

    comm = gpurig.init()
    torch.manual_seed(0)
    model = DataParallel(models.mlp(), compression=codec)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    for step in range(STEPS):
        comm.barrier()
        events.clear()
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        backward = time.perf_counter()
        loss.backward()
        done = time.perf_counter()
        optimizer.step()
        end = time.perf_counter()
        if step >= STEPS - SHOWN and comm.rank == 0:
            spans = " ".join(f"{label}[{1000 * (a - backward):.1f}..{1000 * (b - backward):.1f}]"
                             for label, a, b in sorted(events, key=lambda e: e[1]))
            print(f"step {step}: forward {1000 * (backward - start):.1f} backward+wait {1000 * (done - backward):.1f} "
                  f"(exposed {1000 * model.stats.last_exposed_s:.1f}) optimizer {1000 * (end - done):.1f} | {spans}",
                  flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--codec", default="int8")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # inside the emulated job
    args = p.parse_args()
    if args.rank:
        return trace(args.codec)
    from gpurig.launch.emulator import Cluster

    with Cluster(nodes=2, rate=args.rate) as cluster:
        raise SystemExit(cluster.run([sys.executable, os.path.abspath(__file__), "--rank", "--codec", args.codec]))


if __name__ == "__main__":
    main()
