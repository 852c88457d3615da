"""Chaos with restarts: a random rank killed or stopped at a random step, and the job goes on by itself.

    .venv/bin/python benchmarks/restart_chaos.py --runs 20 --seed 3 --out /tmp/restart_chaos.md
    .venv/bin/python benchmarks/restart_chaos.py --runs 20 --seed 3 --nodes 2 --out /tmp/restart_chaos_nodes.md

Each run is ``gpurig train -n 2 --max-restarts 3`` (MPI and Gloo in turn) with a
fault drawn from the seed (:func:`chaos.draw`: rank, SIGKILL or SIGSTOP, step,
delay; ``GPURIG_FAULT``), then the same training and the same fault under
``torchrun --nproc-per-node 2 --max-restarts 3 -m gpurig train`` (torch.distributed
over Gloo, torchrun's elastic agent restarting). Both resume from the newest
epoch checkpoint. Every run must finish (exit 0) with the weights of an
uninterrupted run; the time from the fault to the first step after the restart
(``GPURIG_FAULT_LOG``) is compared. The failure timeout (heartbeats) is the same
for both, ``--failure-timeout`` seconds.

With ``--nodes N`` (root: network namespaces) the gpurig runs are
``gpurig emulate --nodes N --max-restarts 3 -- gpurig train ...`` instead, one
rank per emulated node (:func:`chaos.emulate_line`, as ``benchmarks/chaos.py``
runs them); torchrun, which runs on one machine, is left out. With 2 ranks every
engine and node layout sums the same two numbers, so one uninterrupted run on
this machine is the reference for all.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import chaos
from chaos import Plan

MAX_RESTARTS = 3


@dataclass
class Outcome:
    run: int
    launcher: str
    fault: str
    exit_code: int | str
    restarts: int | None
    weights_match: bool
    fault_to_step_s: float | None
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.weights_match


def command(launcher: str, plan: Plan, directory: Path, emulated: bool = False) -> list[str]:
    """The command line of one run under ``launcher`` (gpurig-mpi, gpurig-torch or torchrun); ``emulated``: the
    gpurig launchers on ``plan.nodes`` emulated nodes."""
    train = chaos.train_args(plan, directory)
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(plan.ranks), "--max-restarts",
                str(MAX_RESTARTS), "-m", "gpurig", *train]
    engine = launcher.removeprefix("gpurig-")
    if emulated:
        return chaos.emulate_line(plan, engine, MAX_RESTARTS) + [sys.executable, "-m", "gpurig", *train]
    return [sys.executable, "-m", "gpurig", *train, "-n", str(plan.ranks), "--engine", engine, "--max-restarts",
            str(MAX_RESTARTS)]


def run_once(launcher: str, plan: Plan, directory: Path, fault=None, log: Path | None = None,
             timeout: float = 600, emulated: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "GPURIG_FAILURE_TIMEOUT": str(plan.failure_timeout)}
    if fault is not None:
        env.update({"GPURIG_FAULT": str(fault), "GPURIG_FAULT_LOG": str(log)})
    started = time.monotonic()
    try:
        done = subprocess.run(command(launcher, plan, directory, emulated), capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as expired:  # a hang: a failed run, not the end of the benchmark
        text = [t.decode() if isinstance(t, bytes) else (t or "") for t in (expired.stdout, expired.stderr)]
        done = subprocess.CompletedProcess(expired.cmd, "timeout", *text)
    return done, time.monotonic() - started


def summary(done: subprocess.CompletedProcess) -> dict | None:
    """Rank 0's JSON summary, or None when the run failed."""
    if done.returncode != 0 or "{" not in done.stdout:
        return None
    return json.loads(done.stdout[done.stdout.index("{"):done.stdout.rindex("}") + 1])


def fault_to_step(log: Path) -> float | None:
    """Seconds from the fault to the first step of the restarted job (from ``GPURIG_FAULT_LOG``)."""
    if not log.exists():
        return None
    lines = log.read_text().split()
    try:
        fired = float(lines[0])
        resumed = [float(lines[i + 1]) for i, word in enumerate(lines) if word == "resumed"]
    except (IndexError, ValueError):
        return None
    return round(min(resumed) - fired, 2) if resumed else None


def table(outcomes: list[Outcome], plan: Plan, seed: int, emulated: bool = False) -> str:
    """The runs, and per launcher the runs that finished right and the median time from fault to step, as Markdown."""
    where = (f"on {plan.nodes} emulated nodes x {plan.ranks_per_node} rank(s) at {plan.rate}" if emulated
             else f"{plan.ranks} ranks")
    head = (f"**Chaos with restarts: seed {seed}, gpurig train (mlp, {plan.epochs} epochs, global batch "
            f"{plan.global_batch}, {plan.steps} steps, {where}), --max-restarts {MAX_RESTARTS}, failure timeout "
            f"{plan.failure_timeout:g} s**\n\n| run | fault (rank, step, signal, delay s) | launcher | exit | restarts | "
            "weights = uninterrupted | fault to first step after restart, s |\n|---:|---|---|---:|---:|---|---:|\n")
    rows = [f"| {o.run} | {o.fault} | {o.launcher} | {o.exit_code} | {o.restarts if o.restarts is not None else '-'} | "
            f"{'yes' if o.weights_match else 'NO'} | {o.fault_to_step_s if o.fault_to_step_s is not None else '-'} |"
            for o in outcomes]
    foot = ["", "| launcher | runs | finished with the same weights | median fault to step, s (SIGKILL / SIGSTOP) |",
            "|---|---:|---:|---|"]
    for launcher in dict.fromkeys(o.launcher for o in outcomes):
        mine = [o for o in outcomes if o.launcher == launcher]
        medians = []
        for signal in ("", "SIGKILL", "SIGSTOP"):
            times = [o.fault_to_step_s for o in mine if signal in o.fault and o.fault_to_step_s is not None]
            medians.append(f"{statistics.median(times):.1f}" if times else "-")
        foot.append(f"| {launcher} | {len(mine)} | {sum(o.ok for o in mine)} | {medians[0]} ({medians[1]} / "
                    f"{medians[2]}) |")
    return head + "\n".join(rows) + "\n" + "\n".join(foot) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=20, help="faults drawn (each run under gpurig and under torchrun)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engines", default="mpi,torch", help="gpurig's engines, taking turns")
    p.add_argument("--no-torchrun", action="store_true", help="skip the torchrun side")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--failure-timeout", type=float, default=3.0)
    p.add_argument("--nodes", type=int, default=0,
                   help="run gpurig's side on this many emulated nodes, one rank each (needs root); no torchrun then")
    p.add_argument("--rate", default="10gbit", help="the emulated links' rate (with --nodes)")
    p.add_argument("--out", default=None, help="write the table as Markdown here (and the JSON beside it)")
    args = p.parse_args(argv)
    emulated = args.nodes > 0
    if emulated and args.nodes < 2:
        p.error("--nodes must be at least 2")
    plan = Plan(nodes=args.nodes if emulated else 2, rate=args.rate, epochs=args.epochs,
                global_batch=args.global_batch, failure_timeout=args.failure_timeout)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    drawn = chaos.draw(random.Random(args.seed), plan, args.runs, engines)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="gpurig-restart-chaos-") as tmp:
        work = Path(tmp)
        reference = summary(run_once("gpurig-mpi", plan, work / "reference")[0])["weights_digest"]
        for number, (engine, fault) in enumerate(drawn, start=1):
            for launcher in [f"gpurig-{engine}"] + ([] if args.no_torchrun or emulated else ["torchrun"]):
                directory, log = work / f"run{number}-{launcher}", work / f"run{number}-{launcher}.fault"
                done, wall = run_once(launcher, plan, directory, fault, log, emulated=emulated)
                result = summary(done)
                outcome = Outcome(number, launcher, str(fault), done.returncode,
                                  result.get("restarts") if result else None,
                                  result is not None and result["weights_digest"] == reference, fault_to_step(log),
                                  round(wall, 1))
                outcomes.append(outcome)
                print(f"run {number} {launcher} {fault}: {'ok' if outcome.ok else 'FAILED'}, fault to step "
                      f"{outcome.fault_to_step_s} s", file=sys.stderr, flush=True)
                if not outcome.ok:
                    print(done.stderr[-1500:], file=sys.stderr, flush=True)
                if args.out:  # as it goes: a long run cut short still leaves its runs
                    Path(args.out).with_suffix(".json").write_text(json.dumps(
                        {"seed": args.seed, "plan": asdict(plan), "emulated": emulated, "reference": reference,
                         "runs": [asdict(o) for o in outcomes]}, indent=2))
    text = table(outcomes, plan, args.seed, emulated)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if all(o.ok for o in outcomes if o.launcher != "torchrun") else 1


if __name__ == "__main__":
    sys.exit(main())
