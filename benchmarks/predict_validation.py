"""Does gpurig predict get it right? Predicted vs measured step time over a grid of configurations.

    .venv/bin/python benchmarks/predict_validation.py            # needs root (emulated nodes); ~26 min on 2 cores
    .venv/bin/python benchmarks/predict_validation.py --quick    # fewer configurations
    .venv/bin/python benchmarks/predict_validation.py --envs "1 rank" local   # some environments only
    .venv/bin/python benchmarks/predict_validation.py --again benchmarks/results/predict_validation.json
                                # today's predict on a run's own measurements and profiles (seconds, no root)

The model is calibrated only from micro-benchmarks, never from training runs:
``gpurig bench``'s compute part (GEMMs over a grid of shapes, memory bandwidth,
per-layer overhead, real layers of each kind timed forward and backward, an
optimizer step, codec costs; on 1 rank and on 2 ranks at once) and, per
environment, its allreduce measurements by message size, each call after a
barrier (latency and bandwidth fitted), the compressed average timed the same
way per codec, and how much slower computing runs while a collective is in
flight. Everything is calibrated again in each environment, and the
calibration and the measurement are repeated turn about (``--passes``, 5 by
default; medians kept, so one pass taken while the machine ran slow does not
move them), as this shared machine's speed drifts. Then, per
environment — 1 rank; 2 ranks on this machine (MPI, shared memory); 2 emulated nodes behind 1 Gbit/s and 10 Gbit/s links — every
configuration (model × per-rank batch × compression) is trained for a few
steps and predicted. Printed: predicted vs measured step time (the slower
rank's median step; the error against the mean step too), the error, the range
of the passes' own measurements (the machine's noise), the bottleneck each
names, and whether the configurations' ranking is preserved.
Rank 0's numbers go to benchmarks/results/predict_validation.json, and each
environment's profile (the medians predict was given) to
benchmarks/results/predict_validation-profiles/, so ``--again`` can hold a
change to the time model against the run without measuring again.
"""

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from calibration import calibrate_compute, calibrate_links, profile_for, run_env, run_local
from gpurig.measure.profile import median_profile
from gpurig.launch.emulator import unavailable
from predict_validation_ranks import REFERENCE
from gpurig.predict import PredictRequest, predict

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PROFILES = RESULTS / "predict_validation-profiles"
ENVIRONMENTS = ["1 rank", "local", "1gbit", "10gbit"]
console = Console(width=None if sys.stdout.isatty() else 170)


def measure(env: str, cases: list[dict], tmp: Path, steps: int) -> list[dict]:
    out = tmp / f"measured-{env}.json"
    config = tmp / f"cases-{env}.json"
    config.write_text(json.dumps({"cases": cases, "warmup": 4, "steps": steps, "out": str(out)}))
    command = [sys.executable, str(HERE / "predict_validation_ranks.py"), str(config)]
    if env == "1 rank":
        run_local(command, 1)
    else:
        run_env(env, command)
    return json.loads(out.read_text())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer configurations")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--passes", type=int, default=5,
                   help="calibrations and measurement passes per environment, taken turn about (medians kept)")
    p.add_argument("--envs", nargs="+", choices=ENVIRONMENTS, default=ENVIRONMENTS, metavar="ENV",
                   help=f"environments to validate, of {', '.join(map(repr, ENVIRONMENTS))} (default: all)")
    p.add_argument("--again", metavar="JSON", help="predict again the rows of an earlier run (its saved profiles): "
                   "nothing is measured")
    args = p.parse_args()
    if args.again:
        rows = [predicted_row(row, row["profile"], row["ranks"]) for row in json.loads(Path(args.again).read_text())]
        report(rows)
        return
    reason = unavailable()
    envs = [env for env in args.envs if reason is None or env in ("1 rank", "local")]
    if reason and envs != args.envs:
        console.print(f"[yellow]no emulated nodes ({reason}): local environments only[/]")
    models, batches = ("mlp", "cnn"), ((32, 128) if args.quick else (32, 64, 128))
    codecs = ("none", "int8") if args.quick else ("none", "int8", "powersgd")
    RESULTS.mkdir(exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpurig-validate-") as tmp_name:
        tmp = Path(tmp_name)
        single = [{"model": m, "batch": b, "compression": "none"} for m, b in itertools.product(models, batches)]
        grid = [{"model": m, "batch": b, "compression": c} for m, b, c in itertools.product(models, batches, codecs)]
        plan = [(env, single if env == "1 rank" else grid) for env in envs]
        for env, cases in plan:
            console.print(f"[bold]{env}[/]: {args.passes} passes of calibrating, then {len(cases)} configurations")
            # Calibrated again in each environment, and calibrations and measurements interleaved: this machine's
            # speed drifts by 10-30 % over minutes, so each side is the median of passes taken turn about
            # (the configurations in reverse order every other pass).
            # The links too (latency, bandwidth, the codecs' chains, computing under a collective and the cost
            # of posting one, which varies by 2x between calibrations): 1 rank has none.
            computes, links, passes = [], [], []
            for k in range(args.passes):
                computes.append(calibrate_compute(tmp))
                if env != "1 rank":
                    links.append(calibrate_links(env, tmp))
                passes.append(measure(env, cases[::-1] if k % 2 else cases, tmp, args.steps))
            compute, comm = median_profile(computes), median_profile(links) if links else {}
            path = profile_for(compute, env, tmp, comm=comm)
            gpus = 1 if env == "1 rank" else 2
            overlap = (comm.get("overlap") or {}).get("mpi") or {}
            reference = next(r["seconds"] for r in compute["compute"][str(gpus)]["gemm"]
                             if (r["m"], r["n"], r["k"]) == REFERENCE)
            kept = PROFILES / f"{env.replace(' ', '-')}.json"
            PROFILES.mkdir(exist_ok=True)
            kept.write_text(Path(path).read_text())
            for case in median_cases(passes):
                case = {"env": env, **case, "reference_drift": case["reference_s"] / reference,
                        "posted_ms": 1e3 * overlap.get("posted_s", 0.0), "slowdown": overlap.get("slowdown", 1.0)}
                rows.append(predicted_row(case, str(kept.relative_to(HERE.parent)), gpus))
    report(rows)
    (RESULTS / "predict_validation.json").write_text(json.dumps(rows, indent=2))


def predicted_row(case: dict, profile: str, ranks: int) -> dict:
    """A measured configuration with what predict says of it from ``profile`` (a path from the repository root,
    or absolute), and the errors."""
    path = Path(profile) if Path(profile).is_absolute() else HERE.parent / profile
    predicted = predict(PredictRequest(model=f"mnist-{case['model']}", cluster=str(path), gpus=ranks,
                                       batch=case["batch"], compression=case["compression"]))
    step = predicted["step"]
    measured_compute = case["step_ms"] - case["comm_ms"]
    # the same GEMM, timed by bench at calibration and again right after this configuration ran
    drift = case["reference_drift"]
    corrected = step["step_ms"] + (drift - 1) * step["compute_ms"]
    return {**case, "profile": profile, "ranks": ranks, "predicted_ms": step["step_ms"],
            "predicted_comm_ms": step["comm_ms"], "drift": drift, "corrected_ms": corrected,
            "corrected_error": corrected / case["step_ms"] - 1,
            "error": step["step_ms"] / case["step_ms"] - 1,
            "mean_error": step["step_ms"] / case["mean_step_ms"] - 1,
            "measured_bottleneck": "communication" if case["comm_ms"] > measured_compute else "compute",
            "predicted_bottleneck": "communication" if step["comm_ms"] > step["compute_ms"] else "compute"}


def median_cases(passes: list[list[dict]]) -> list[dict]:
    """One row per configuration: the median of its passes' measurements (passes may list them in any order)."""
    runs: dict = {}
    for rows in passes:
        for case in rows:
            runs.setdefault((case["model"], case["batch"], case["compression"]), []).append(case)
    # each pass's step too: how far this machine's own measurements of one configuration lie apart
    return [{**median_profile(seen), "passes_ms": [case["step_ms"] for case in seen]} for seen in runs.values()]


def ranking_kept(rows: list[dict], predicted: str = "predicted_ms", measured: str = "step_ms") -> float:
    """Of all pairs of configurations in one environment, the share the prediction orders as measured."""
    kept = total = 0
    for env in dict.fromkeys(r["env"] for r in rows):
        group = [r for r in rows if r["env"] == env]
        for a, b in itertools.combinations(group, 2):
            if abs(a[measured] / b[measured] - 1) < 0.05:
                continue  # measured within noise of each other: no order to keep
            total += 1
            kept += (a[measured] < b[measured]) == (a[predicted] < b[predicted])
    return kept / total if total else 1.0


def report(rows: list[dict]) -> None:
    table = Table(title="gpurig predict vs measured, per step (ms)")
    for column in ("environment", "model", "batch/rank", "compression", "measured", "predicted", "error",
                   "passes", "comm meas.", "comm pred.", "bottleneck meas.", "pred."):
        table.add_column(column, justify="left" if column in ("environment", "model", "compression") else "right")
    for r in rows:
        same = r["measured_bottleneck"] == r["predicted_bottleneck"]
        table.add_row(r["env"], r["model"], str(r["batch"]), r["compression"], f"{r['step_ms']:.1f}",
                      f"{r['predicted_ms']:.1f}", f"{r['error']:+.0%}",
                      f"{min(r['passes_ms']):.1f}-{max(r['passes_ms']):.1f}", f"{r['comm_ms']:.1f}",
                      f"{r['predicted_comm_ms']:.1f}", r["measured_bottleneck"],
                      r["predicted_bottleneck"] if same else f"[red]{r['predicted_bottleneck']}[/]")
    console.print(table)
    errors = [abs(r["error"]) for r in rows]
    corrected = [abs(r["corrected_error"]) for r in rows]
    right = sum(r["measured_bottleneck"] == r["predicted_bottleneck"] for r in rows)
    console.print(f"{len(rows)} configurations: median |error| {statistics.median(errors):.1%}, worst "
                  f"{max(errors):.1%}; bottleneck right in {right}/{len(rows)}; pairwise ranking kept "
                  f"{ranking_kept(rows):.0%}")
    console.print(f"with the prediction's compute scaled by the machine's drift since calibration (bench's "
                  f"{'x'.join(map(str, REFERENCE))} GEMM timed again after each configuration, "
                  f"{min(r['drift'] for r in rows):.2f}-{max(r['drift'] for r in rows):.2f}x): median |error| "
                  f"{statistics.median(corrected):.1%}, worst {max(corrected):.1%}; pairwise ranking kept "
                  f"{ranking_kept(rows, 'corrected_ms'):.0%}")
    spreads = [max(r["passes_ms"]) / min(r["passes_ms"]) - 1 for r in rows]
    console.print(f"the measurements themselves: a configuration's slowest pass over its fastest, median "
                  f"+{statistics.median(spreads):.0%}, largest +{max(spreads):.0%}")
    means = [abs(r["mean_error"]) for r in rows]
    console.print(f"against each configuration's mean step (the runs before 2026-11-23; this machine's stalls "
                  f"included): median |error| {statistics.median(means):.1%}, worst {max(means):.1%}; pairwise "
                  f"ranking kept {ranking_kept(rows, measured='mean_step_ms'):.0%}")


if __name__ == "__main__":
    main()
