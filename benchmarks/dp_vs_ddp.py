"""Training step time: gpurig.DataParallel vs torch DistributedDataParallel, in one job.

Every variant trains its own copy of the same model, with the same batches, on
the same 2 ranks. They take turns in blocks of steps (one block of each per
round, rotating order, warm-up rounds dropped), so the noise of a shared
machine hits all of them. A block's time is its slowest rank's; reported are
the median step time over blocks, samples/s, and the throughput ratio against
DDP with the same bucket size, taken round by round (see ``common.paired_ratio``).

Variants: gpurig over Gloo and DDP over Gloo share torch.distributed's default
process group (gpurig also without the checks DDP does not make: the
collective check, ``GPURIG_CHECK=0``, and the numerical guard,
``nonfinite="ignore"``); gpurig over MPI is the extra row (on one node every bucket
Open MPI's Iallreduce begun on the caller's thread), with three variants of the
hand-off for comparison: the last bucket allreduced blocking (the default across
nodes), that with the earlier buckets handed to a Python thread
(``common.ThreadHandoff``), and every bucket handed to the thread (the design
before issue 23); the same pair again with 1 MB buckets, where per-bucket
overhead shows. Issue 23's third pass added, on both engines, the checks as
before it (the collective check blocking at the first bucket, the numerical
guard's sum after the wait: ``BlockingCheck``, ``GuardAfter``), and over MPI
``MPI_Wait``'s busy wait instead of the polite one (``MPIEngine.wait_spin_s``). Issue 23's eighth pass added,
on both engines, each bucket begun through ``allreduce_async``'s whole path as before (``LaunchAsBefore``).
``--variants "a;b"`` runs only those (each with its DDP reference).

    gpurig run -n 2 -- python benchmarks/dp_vs_ddp.py --model mlp --out /tmp/dp.json
"""

import copy

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import gpurig
from gpurig import models
from gpurig.comm import Communicator
from gpurig.comm.mpi_engine import MPIEngine
from gpurig.comm.torch_engine import TorchEngine
from common import (ThreadHandoff, batches, both_engines, interleave, median, paired_ratio, slowest_rank, spread,
                    step_benchmark_args, training_block, write_result)


class BlockingCheck(Communicator):
    """The Communicator with the step's collective check blocking at the first bucket, as before issue 23's third
    pass (comparison only; the default begins it at backward's first gradient, ``expect_async``)."""

    def expect_async(self, signatures) -> bool:
        return False


class GuardAfter(gpurig.DataParallel):
    """DataParallel with the numerical guard's sum over every averaged bucket after the wait, as before issue 23's
    third pass (comparison only; the default flags the gradients while copying them in, ``numerics.copy_flagged``)."""

    def _build_buckets(self) -> None:
        super()._build_buckets()
        for bucket in self.buckets:
            bucket.flagged = False


class LastBlocking(gpurig.DataParallel):
    """DataParallel with the last bucket allreduced blocking on autograd's thread within one node too, as the
    default did until issue 23's second pass (comparison only; the default now does so only across nodes)."""

    def _inline(self, index: int) -> bool:
        return index == len(self.buckets) - 1 and not getattr(self.comm.engine, "native_async", False)


class LaunchAsBefore(gpurig.DataParallel):
    """DataParallel with every bucket begun through ``allreduce_async``'s whole path, as before issue 23's eighth
    pass (comparison only; the default prepares each bucket's allreduce once, ``Communicator.prepare_allreduce``)."""

    lean_launch = False


def engine_check(engine) -> Communicator:
    """A communicator whose collective check goes through the engine on one machine too, as before the check
    board (comparison only)."""
    comm = Communicator(engine)
    comm.guard.use_board = False
    return comm


def main():
    p = step_benchmark_args(__doc__)
    p.add_argument("--variants", help="variant names to run, separated by ';' (default: all); each one's DDP "
                                      "reference runs with it")
    args = p.parse_args()

    mpi, gloo = both_engines()
    busy = Communicator(MPIEngine())  # waits as before issue 23's third pass: MPI_Wait, busy-polling
    busy.engine.wait_spin_s = None
    torch.manual_seed(0)
    base = models.build(args.model)
    data = batches(args.block, args.per_rank_batch, mpi.rank)
    # name -> (model, the DDP variant it is compared with)
    variants = {
        "gpurig / gloo": (gpurig.DataParallel(copy.deepcopy(base), gloo), "DDP / gloo"),
        "DDP / gloo": (DDP(copy.deepcopy(base)), "DDP / gloo"),
        "gpurig / gloo, without its checks": (
            gpurig.DataParallel(copy.deepcopy(base), Communicator(TorchEngine(backend="gloo"), check=False),
                                nonfinite="ignore"), "DDP / gloo"),
        "gpurig / gloo, the check through the engine (before the board)": (
            gpurig.DataParallel(copy.deepcopy(base), engine_check(TorchEngine(backend="gloo"))), "DDP / gloo"),
        "gpurig / mpi, the check through the engine (before the board)": (
            gpurig.DataParallel(copy.deepcopy(base), engine_check(MPIEngine())), "DDP / gloo"),
        "gpurig / gloo, without the collective check (the guard's flag kept)": (
            gpurig.DataParallel(copy.deepcopy(base), Communicator(TorchEngine(backend="gloo"), check=False)),
            "DDP / gloo"),
        "gpurig / gloo, checks as before (blocking check, guard's sum after)": (
            GuardAfter(copy.deepcopy(base), BlockingCheck(gloo.engine)), "DDP / gloo"),
        "gpurig / gloo, check blocking (the guard's flag as now)": (
            gpurig.DataParallel(copy.deepcopy(base), BlockingCheck(gloo.engine)), "DDP / gloo"),
        "gpurig / gloo, launch as before": (LaunchAsBefore(copy.deepcopy(base), gloo), "DDP / gloo"),
        "gpurig / mpi": (gpurig.DataParallel(copy.deepcopy(base), mpi), "DDP / gloo"),
        "gpurig / mpi, launch as before": (LaunchAsBefore(copy.deepcopy(base), mpi), "DDP / gloo"),
        "gpurig / mpi, MPI_Wait (before)": (gpurig.DataParallel(copy.deepcopy(base), busy), "DDP / gloo"),
        "gpurig / mpi, checks as before (blocking check, guard's sum after)": (
            GuardAfter(copy.deepcopy(base), BlockingCheck(mpi.engine)), "DDP / gloo"),
        "gpurig / mpi, last bucket blocking": (LastBlocking(copy.deepcopy(base), mpi), "DDP / gloo"),
        "gpurig / mpi, last bucket blocking, earlier ones on a thread": (
            LastBlocking(copy.deepcopy(base), ThreadHandoff(mpi.engine)), "DDP / gloo"),
        "gpurig / mpi, every bucket on a thread (before)": (
            gpurig.DataParallel(copy.deepcopy(base), ThreadHandoff(mpi.engine)), "DDP / gloo"),
        "gpurig / gloo, 1 MB buckets": (gpurig.DataParallel(copy.deepcopy(base), gloo, bucket_cap_mb=1),
                                        "DDP / gloo, 1 MB buckets"),
        "DDP / gloo, 1 MB buckets": (DDP(copy.deepcopy(base), bucket_cap_mb=1), "DDP / gloo, 1 MB buckets"),
        "gpurig / mpi, 1 MB buckets": (gpurig.DataParallel(copy.deepcopy(base), mpi, bucket_cap_mb=1),
                                       "DDP / gloo, 1 MB buckets"),
        "gpurig / mpi, 1 MB buckets, last blocking, earlier ones on a thread": (
            LastBlocking(copy.deepcopy(base), ThreadHandoff(mpi.engine), bucket_cap_mb=1),
            "DDP / gloo, 1 MB buckets"),
    }
    if args.variants:
        wanted = [name.strip() for name in args.variants.split(";")]
        unknown = [name for name in wanted if name not in variants]
        if unknown:
            p.error(f"unknown variants {unknown}; choose from {list(variants)}")
        wanted += [variants[name][1] for name in wanted]
        variants = {name: v for name, v in variants.items() if name in wanted}
    blocks = {name: training_block(model, data) for name, (model, _) in variants.items()}
    seconds = interleave(blocks, args.rounds, args.warmup)
    seconds = {name: slowest_rank(mpi, s) for name, s in seconds.items()}

    global_batch = mpi.size * args.per_rank_batch
    rows = {}
    for name, (_, reference) in variants.items():
        step = median(seconds[name]) / args.block
        rows[name] = {"step_ms": 1e3 * step, "samples_per_s": global_batch / step,
                      "spread": spread(seconds[name]), "compared_with": reference,
                      # throughput ratio = DDP's time / ours, round by round
                      "vs_ddp": paired_ratio(seconds[reference], seconds[name])}
    write_result(mpi, args.out, {
        "model": args.model, "parameters": sum(p.numel() for p in base.parameters()),
        "ranks": mpi.size, "per_rank_batch": args.per_rank_batch, "block": args.block,
        "rounds": args.rounds, "warmup": args.warmup, "variants": rows})


if __name__ == "__main__":
    main()
