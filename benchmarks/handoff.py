"""What handing a bucket's collective to the engine costs the computation around it: the design before
issue 23 (a Python thread runs it) against the engine's nonblocking call begun on the caller's thread.

Both communicators run over the same MPI ranks, in turns, under the same load.
Per round and design, a chain of matrix products (backward's layers) runs
with two 16 KB allreduces posted at evenly spaced points and waited on at the
end, next to the same chain with nothing posted
(:func:`gpurig.measure.comm.posting_seconds`): what a posting adds to the chain.
Then, posted one at a time under a running product:

- the thread design's wake-up: from the submission to the thread starting the job;
- the CPU time of the job on that thread (``time.thread_time``), which it
  spends holding the GIL or polling the engine while backward wants the core;
- the caller design's cost of beginning the collective and of one ``progress()``.

    gpurig run -n 2 -- python benchmarks/handoff.py --out /tmp/handoff.json
"""

import argparse
import statistics
import time

import torch

from common import ThreadHandoff, both_engines, write_result
from gpurig.measure.comm import posting_seconds


def thread_costs(comm, product, n: int) -> tuple[list[float], list[float]]:
    """Wake-up seconds and the thread's CPU seconds, per collective handed to the thread."""
    buf, wake, cpu = torch.zeros(4096), [], []
    for _ in range(n):
        comm.barrier()
        submitted = time.perf_counter()
        seen = {}

        def job():
            seen["start"], cpu_start = time.perf_counter(), time.thread_time()
            comm.allreduce(buf, op="sum")
            seen["cpu"] = time.thread_time() - cpu_start

        handle = comm.run_async(job)
        product()
        handle.wait()
        wake.append(seen["start"] - submitted)
        cpu.append(seen["cpu"])
    return wake, cpu


def caller_costs(comm, product, n: int) -> tuple[list[float], list[float]]:
    """Seconds to begin a nonblocking allreduce on this thread, and one progress() test of it."""
    buf, begin, test = torch.zeros(4096), [], []
    for _ in range(n):
        comm.barrier()
        start = time.perf_counter()
        handle = comm.allreduce_async(buf, op="sum")
        begun = time.perf_counter()
        comm.progress()
        begin.append(begun - start)
        test.append(time.perf_counter() - begun)
        product()
        handle.wait()
    return begin, test


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    mpi, _ = both_engines()
    torch.set_num_threads(1)
    thread = ThreadHandoff(mpi.engine)
    a, b = torch.randn(128, 1024), torch.randn(1024, 1024)

    def product():
        torch.mm(a, b)

    posting = {"thread": [], "caller": []}
    for r in range(args.rounds):  # alternate which design goes first
        for name, comm in ((("thread", thread), ("caller", mpi)) if r % 2 == 0 else (("caller", mpi), ("thread", thread))):
            posting[name].append(posting_seconds(comm, product, lambda: None, rounds=3)[1])
    wake, cpu = thread_costs(thread, product, 3 * args.rounds)
    begin, test = caller_costs(mpi, product, 3 * args.rounds)
    us = lambda values: round(1e6 * statistics.median(values), 1)  # noqa: E731
    write_result(mpi, args.out, {
        "ranks": mpi.size, "rounds": args.rounds,
        "posting_cost_us": {"thread": us(posting["thread"]), "caller": us(posting["caller"])},
        "thread_wakeup_us": us(wake), "thread_cpu_per_collective_us": us(cpu),
        "caller_begin_us": us(begin), "caller_progress_us": us(test)})


if __name__ == "__main__":
    main()
