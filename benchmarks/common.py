"""What every benchmark script shares: both engines in one job, interleaved timing, results.

A benchmark script runs on 2 ranks under ``gpurig run`` (MPI engine). It calls
:func:`both_engines` to get an MPI and a Gloo communicator over the same ranks,
times its variants with :func:`interleave` so that the noise of a shared machine
hits all of them alike, and lets rank 0 write its JSON with :func:`write_result`::

    mpi, gloo = both_engines()
    seconds = interleave({"a": run_a, "b": run_b}, rounds=20, warmup=2)
    write_result(mpi, "/tmp/out.json", {"a_ms": 1e3 * median(slowest_rank(mpi, seconds["a"]))})
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import socket
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import gpurig
from gpurig import models
from gpurig.comm import Communicator
from gpurig.comm.torch_engine import TorchEngine


def both_engines() -> tuple[Communicator, Communicator]:
    """(MPI communicator, Gloo communicator) over the same ranks, in a job started with ``gpurig run``.

    MPI comes up first; rank 0 then picks a free port and the ranks form a Gloo
    process group through it. That group is torch.distributed's default group,
    the one ``DistributedDataParallel`` uses, so gpurig over Gloo and DDP share it.

    >>> mpi, gloo = both_engines()          # doctest: +SKIP
    >>> mpi.engine_name, gloo.engine_name   # doctest: +SKIP
    ('mpi', 'torch/gloo')
    """
    mpi = gpurig.init("mpi")
    port = 0
    if mpi.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = int(mpi.broadcast(torch.tensor([port]), root=0).item())
    os.environ.update(RANK=str(mpi.rank), WORLD_SIZE=str(mpi.size), LOCAL_RANK=str(mpi.local_rank),
                      LOCAL_WORLD_SIZE=str(mpi.local_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    gloo = Communicator(TorchEngine(backend="gloo"))
    atexit.register(gloo.shutdown)  # before MPI's own shutdown (atexit runs last-in, first-out)
    return mpi, gloo


def interleave(blocks: dict[str, Callable[[], None]], rounds: int, warmup: int,
               shuffle: random.Random | None = None) -> dict[str, list[float]]:
    """Seconds per call of every block, calling each once per round in a rotating order.

    Round r starts with the r-th block and runs every block once, so noise that
    lasts longer than a block hits all of them, and none always runs first.
    Rotating, each block always follows the same one; with ``shuffle`` (a seeded
    generator, the same on every rank) each round takes its own order instead, so
    that what a block inherits from its predecessor (threads to wake, caches)
    falls on all of them alike.
    The first ``warmup`` rounds are dropped. Blocks follow each other with no
    barrier between them: their own collectives keep the ranks in step, while a
    barrier on one engine leaves the other's threads asleep, and on this VM
    waking them costs the next Gloo call milliseconds.

    >>> out = interleave({"a": lambda: None, "b": lambda: None}, rounds=3, warmup=1)
    >>> sorted(out), len(out["a"])
    (['a', 'b'], 3)
    """
    names = list(blocks)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warmup + rounds):
        shift = r % len(names)
        order = names[shift:] + names[:shift]
        if shuffle is not None:
            shuffle.shuffle(order)
        for name in order:
            start = time.perf_counter()
            blocks[name]()
            if r >= warmup:
                seconds[name].append(time.perf_counter() - start)
    return seconds


def per_rank(comm: Communicator, values: list[float]) -> list[list[float]]:
    """Every rank's ``values`` (same length on all ranks), in rank order.

    >>> per_rank(comm, [0.1, 0.3])          # doctest: +SKIP
    [[0.1, 0.3], [0.12, 0.25]]
    """
    mine = torch.tensor(values, dtype=torch.float64)
    return comm.allgather(mine).view(comm.size, -1).tolist()


def slowest_rank(comm: Communicator, values: list[float]) -> list[float]:
    """Element-wise maximum of ``values`` over all ranks (a step lasts as long as its slowest rank).

    >>> slowest_rank(comm, [0.1, 0.3])      # doctest: +SKIP
    [0.12, 0.3]                              # rank 1 was slower in the first round
    """
    return [max(column) for column in zip(*per_rank(comm, values))]


def median(values) -> float:
    """The median (robust to the occasional slow round of a shared machine).

    >>> median([3.0, 1.0, 2.0, 100.0])
    2.5
    """
    return statistics.median(values)


def spread(values) -> float:
    """Interquartile range over the median: how noisy a set of timings was.

    >>> round(spread([1.0, 1.0, 1.1, 1.2, 1.2]), 2)
    0.18
    """
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(values)


def paired_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median over rounds of ``numerator[r] / denominator[r]``.

    Both lists come from the same rounds of :func:`interleave`, so each pair ran
    under the same load; the ratio per round cancels slow phases of the machine
    that a ratio of two medians would not.

    >>> paired_ratio([2.0, 4.0, 2.2], [1.0, 2.0, 2.0])
    2.0
    """
    return median([a / b for a, b in zip(numerator, denominator)])


def write_result(comm: Communicator, path: str, result: dict) -> None:
    """Rank 0 writes ``result`` as JSON to ``path``; the other ranks do nothing."""
    if comm.rank == 0:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)


def step_benchmark_args(doc: str, block_help: str = "steps per block") -> argparse.ArgumentParser:
    """The flags every training-step benchmark takes: model, batch, blocks, rounds, warm-up, output."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(models.TRAINABLE), default="mlp")
    p.add_argument("--per-rank-batch", type=int, default=64)
    p.add_argument("--block", type=int, default=5, help=block_help)
    p.add_argument("--rounds", type=int, default=20, help="measured rounds (one block of every variant each)")
    p.add_argument("--warmup", type=int, default=2, help="rounds dropped at the start")
    p.add_argument("--out", required=True)
    return p


def batches(count: int, per_rank: int, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` random MNIST-shaped batches, different on each rank, the same for every variant."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(per_rank, 784, generator=g), torch.randint(0, 10, (per_rank,), generator=g))
            for _ in range(count)]


def training_block(model: torch.nn.Module, data) -> Callable[[], None]:
    """A function that runs one SGD step (momentum 0.9) per batch of ``data``."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def block():
        for x, y in data:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return block


class ThreadHandoff(Communicator):
    """The Communicator as it was before issue 23, for side-by-side comparisons only: every asynchronous
    collective on an engine without torch's ``async_op`` (MPI) is handed to the background Python thread,
    and so is the step's signature check.

    >>> old = ThreadHandoff(mpi.engine)       # doctest: +SKIP
    """

    def _can_start(self, *tensors, begins: str = "start_alltoall") -> bool:
        if getattr(self.engine, "native_async", False) or self._worker.on_worker_thread():
            return super()._can_start(*tensors, begins=begins)
        return False

    def expect_async(self, signatures) -> bool:
        return getattr(self.engine, "native_async", False) and super().expect_async(signatures)

    def expect(self, signatures) -> None:
        if getattr(self.engine, "native_async", False):
            return super().expect(signatures)

        def announce():
            with self._engine_errors():
                self.guard.expect(signatures)

        self._run(announce, blocking=False)
