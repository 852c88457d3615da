"""Chaos: training runs on emulated nodes where a random rank is killed or stopped at a random step.

    .venv/bin/python benchmarks/chaos.py --runs 20 --seed 7          # needs root (network namespaces)
    .venv/bin/python benchmarks/chaos.py --runs 4 --seed 1 --out docs/chaos.md

Each run is ``gpurig train`` on ``gpurig emulate`` nodes (MPI and Gloo in
turn). From the seed it draws the rank, the signal (SIGKILL or SIGSTOP), the
step and a delay into that step, and the rank sends it to itself then
(``GPURIG_FAULT``, :mod:`gpurig.train.faults`), wherever that lands: forward,
backward, a bucket's allreduce, a checkpoint write. Every run must

1. end, non-zero, within the failure timeout plus ``--grace`` seconds of the fault,
2. name the right rank and its node in its last line (killed by SIGKILL /
   stopped responding),
3. leave no damaged checkpoint (each verifies its SHA-256),
4. resume (``--resume``; from scratch when no epoch had finished) to the same
   weights as the uninterrupted run on the same engine and nodes.

The table is printed, and with ``--out`` written as Markdown (with the JSON beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gpurig.train.checkpoints import damaged, saved_epochs
from gpurig.train.faults import Fault

SIGNALS = ("SIGKILL", "SIGSTOP")
TRAIN_SAMPLES = 4000  # the reference data set's training part


@dataclass
class Plan:
    """The job every run trains: small enough for many runs, long enough to be hit mid-way."""

    nodes: int = 2
    ranks_per_node: int = 1
    rate: str = "10gbit"
    epochs: int = 3
    global_batch: int = 256
    failure_timeout: float = 10.0
    grace: float = 20.0

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def steps(self) -> int:
        return self.epochs * (TRAIN_SAMPLES // self.global_batch)  # gpurig.shard drops a last partial batch

    def node_of(self, rank: int) -> str:
        return f"node{rank // self.ranks_per_node + 1}"


@dataclass
class Outcome:
    run: int
    engine: str
    fault: str
    exit_code: int
    ended_after_s: float | None
    last_line: str
    named_right: bool
    within_bound: bool
    damaged: dict
    resumed_from: int
    weights_match: bool

    @property
    def ok(self) -> bool:
        return (self.exit_code != 0 and self.named_right and self.within_bound and not self.damaged
                and self.weights_match)


def draw(rng: random.Random, plan: Plan, runs: int, engines: list[str]) -> list[tuple[str, Fault]]:
    """Each run's engine (taking turns) and fault (rank, signal, step, delay), from ``rng``.

    >>> [(e, f.signal) for e, f in draw(random.Random(1), Plan(), 2, ["mpi", "torch"])]
    [('mpi', 'SIGKILL'), ('torch', 'SIGSTOP')]
    """
    return [(engines[i % len(engines)],
             Fault(rng.randrange(plan.ranks), rng.randint(2, plan.steps - 1), rng.choice(SIGNALS),
                   round(rng.uniform(0, 0.05), 4))) for i in range(runs)]


def train_args(plan: Plan, directory: Path) -> list[str]:
    """``gpurig train``'s words for the plan: without the prediction's measurements (10-15 s a run here, and a
    fault is never drawn before the first steps).

    >>> train_args(Plan(epochs=1), Path("ck"))[:3]
    ['train', '--epochs', '1']
    """
    return ["train", "--epochs", str(plan.epochs), "--global-batch", str(plan.global_batch), "--compression", "none",
            "--no-predict", "--json", "--checkpoint-dir", str(directory)]


def emulate_line(plan: Plan, engine: str, max_restarts: int = 0) -> list[str]:
    """``gpurig emulate`` on the plan's nodes, up to the ``--`` before the job's own command.

    >>> emulate_line(Plan(), "torch", max_restarts=3)[3:]
    ['emulate', '--nodes', '2', '--ranks-per-node', '1', '--rate', '10gbit', '--engine', 'torch', '--max-restarts', '3', '--']
    """
    return [sys.executable, "-m", "gpurig", "emulate", "--nodes", str(plan.nodes), "--ranks-per-node",
            str(plan.ranks_per_node), "--rate", plan.rate, "--engine", engine, "--max-restarts", str(max_restarts),
            "--"]


def train(plan: Plan, engine: str, directory: Path, resume: bool = False, env: dict | None = None,
          timeout: float = 600) -> subprocess.CompletedProcess:
    """``gpurig train`` on emulated nodes, as ``gpurig emulate`` runs it."""
    line = emulate_line(plan, engine) + [sys.executable, "-m", "gpurig", *train_args(plan, directory)]
    if resume:
        line.append("--resume")
    return subprocess.run(line, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "GPURIG_FAILURE_TIMEOUT": str(plan.failure_timeout), **(env or {})})


def summary(done: subprocess.CompletedProcess) -> dict:
    """The JSON summary rank 0 printed."""
    if done.returncode != 0:
        raise RuntimeError(f"training failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout[done.stdout.index("{"):])


def expected_line(plan: Plan, fault: Fault) -> str:
    """How the last line must begin.

    >>> expected_line(Plan(), Fault(1, 5, "SIGSTOP"))
    'gpurig run: rank 1 on host node2 stopped responding'
    """
    how = "was killed by SIGKILL" if fault.signal == "SIGKILL" else "stopped responding"
    return f"gpurig run: rank {fault.rank} on host {plan.node_of(fault.rank)} {how}"


def one_run(number: int, engine: str, fault: Fault, plan: Plan, reference: str, work: Path) -> Outcome:
    directory, log = work / f"run{number}", work / f"run{number}.fault"
    hit = train(plan, engine, directory, env={"GPURIG_FAULT": str(fault), "GPURIG_FAULT_LOG": str(log)})
    ended = time.time()
    lines = [line for line in hit.stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    after = ended - float(log.read_text()) if log.exists() else None
    problems = damaged(directory)
    start = (saved_epochs(directory) or [0])[0]  # no epoch finished: the run starts again from scratch
    again = summary(train(plan, engine, directory, resume=start > 0))
    return Outcome(number, engine, str(fault), hit.returncode, None if after is None else round(after, 1), last,
                   last.startswith(expected_line(plan, fault)),
                   after is not None and after <= plan.failure_timeout + plan.grace, problems, start,
                   again["weights_digest"] == reference)


def table(outcomes: list[Outcome], plan: Plan, seed: int) -> str:
    """The results as Markdown."""
    head = (f"**Chaos: {len(outcomes)} runs, seed {seed}: gpurig train (mlp, {plan.epochs} epochs, global batch "
            f"{plan.global_batch}, {plan.steps} steps) on {plan.nodes} emulated nodes x {plan.ranks_per_node} "
            f"rank(s) at {plan.rate}, failure timeout {plan.failure_timeout:g} s**\n\n"
            "| run | engine | fault (rank, step, signal, delay s) | exit | ended after s | last line names it | "
            "checkpoints damaged | resumed from epoch | weights = uninterrupted |\n"
            "|---:|---|---|---:|---:|---|---:|---:|---|\n")
    rows = []
    for o in outcomes:
        rows.append(f"| {o.run} | {o.engine} | {o.fault} | {o.exit_code} | {o.ended_after_s} | "
                    f"{'yes' if o.named_right else 'NO: ' + o.last_line} | {len(o.damaged)} | {o.resumed_from} | "
                    f"{'yes' if o.weights_match else 'NO'} |")
    good = sum(o.ok for o in outcomes)
    times = [o.ended_after_s for o in outcomes if o.ended_after_s is not None]
    foot = (f"\n\n{good} of {len(outcomes)} runs passed every check; ended {min(times):.1f}–{max(times):.1f} s after "
            f"the fault (bound {plan.failure_timeout + plan.grace:g} s).\n" if times else "\n")
    return head + "\n".join(rows) + foot


def run_chaos(runs: int, seed: int, plan: Plan, engines: list[str],
              references: dict[str, str] | None = None) -> tuple[list[Outcome], dict[str, str]]:
    """Draw and make ``runs`` runs; return their outcomes and the uninterrupted runs' weight digests per engine.

    ``references`` (engine -> digest) saves the uninterrupted runs: with 2 ranks every engine sums the same two
    numbers (a + b, in either order), so one run on one machine serves all engines and node layouts.
    """
    drawn = draw(random.Random(seed), plan, runs, engines)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="gpurig-chaos-") as tmp:
        work = Path(tmp)
        if references is None:
            references = {e: summary(train(plan, e, work / f"reference-{e}"))["weights_digest"] for e in engines}
            print(f"uninterrupted runs: {references}", file=sys.stderr, flush=True)
        for number, (engine, fault) in enumerate(drawn, start=1):
            outcome = one_run(number, engine, fault, plan, references[engine], work)
            outcomes.append(outcome)
            print(f"run {number}: {engine} {fault}: {'ok' if outcome.ok else 'FAILED'} "
                  f"(ended {outcome.ended_after_s} s after the fault)", file=sys.stderr, flush=True)
    return outcomes, references


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engines", default="mpi,torch")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=1)
    p.add_argument("--rate", default="10gbit")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--failure-timeout", type=float, default=10.0)
    p.add_argument("--grace", type=float, default=20.0, help="seconds beyond the failure timeout a run may take to end")
    p.add_argument("--out", default=None, help="write the table as Markdown here (and the JSON beside it)")
    args = p.parse_args(argv)
    plan = Plan(args.nodes, args.ranks_per_node, args.rate, args.epochs, args.global_batch, args.failure_timeout,
                args.grace)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    outcomes, references = run_chaos(args.runs, args.seed, plan, engines)
    text = table(outcomes, plan, args.seed)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(
            {"seed": args.seed, "plan": asdict(plan), "references": references,
             "runs": [asdict(o) for o in outcomes]}, indent=2))
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
