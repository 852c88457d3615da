"""CPU training steps with glibc's allocator as it comes vs as ``gpurig run`` sets it (``HOST_ALLOCATOR``).

    .venv/bin/python benchmarks/host_allocator.py             # ~4 min on 2 cores
    .venv/bin/python benchmarks/host_allocator.py --passes 5

glibc serves large blocks with a fresh mmap and trims its heap, so a CPU step's
activations arrive as new pages, each faulted in and zeroed by the kernel.
``gpurig run`` gives every rank ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` (:data:`gpurig.launch.rank_env.HOST_ALLOCATOR`) so
the memory is kept for the next step. Here the same training steps
(``benchmarks/predict_validation_ranks.py``: 4 warm-up steps, then the mean of
20, the slower rank's) run in jobs of one configuration each started by mpirun directly, which differ only
in those two variables; the two take turns, ``--passes`` times each, and the
medians are compared. 1 rank, and 2 local ranks with gpurig.DataParallel.
Results go to benchmarks/results/host_allocator.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpurig.launch.mpirun import find_mpirun
from gpurig.launch.rank_env import HOST_ALLOCATOR, host_defaults

HERE = Path(__file__).resolve().parent
CASES = [{"model": m, "batch": b, "compression": "none"} for m in ("cnn", "mlp") for b in (32, 128)]
VARIANTS = {"glibc as it comes": {}, "kept (gpurig run)": HOST_ALLOCATOR}


def job(ranks: int, case: dict, allocator: dict, tmp: Path) -> float:
    """``case``'s step time (ms) in a fresh mpirun job of ``ranks`` local ranks with ``allocator``'s variables.

    One configuration per job, as a training run is: glibc's thresholds move with what the process freed
    before, so a job that trained another model first would measure its history, not its allocator.
    """
    out = tmp / "steps.json"
    config = tmp / "cases.json"
    config.write_text(json.dumps({"cases": [case], "warmup": 4, "steps": 20, "out": str(out)}))
    env = {name: value for name, value in host_defaults(os.environ, ranks).items() if name not in HOST_ALLOCATOR}
    env.update(allocator, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    subprocess.run([find_mpirun(), "-n", str(ranks), "--oversubscribe", sys.executable,
                    str(HERE / "predict_validation_ranks.py"), str(config)], env=env, check=True)
    return json.loads(out.read_text())[0]["mean_step_ms"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passes", type=int, default=3, help="jobs per allocator and rank count, taken turn about")
    args = p.parse_args()
    steps: dict = {}
    with tempfile.TemporaryDirectory(prefix="gpurig-allocator-") as tmp_name:
        for ranks in (1, 2):
            for k in range(args.passes):
                for case in CASES:
                    for name in (list(VARIANTS) if k % 2 == 0 else list(VARIANTS)[::-1]):
                        steps.setdefault((ranks, case["model"], case["batch"], name), []).append(
                            job(ranks, case, VARIANTS[name], Path(tmp_name)))
    rows = []
    table = Table(title=f"CPU step time (ms), medians of {args.passes} jobs each")
    for column in ("ranks", "model", "batch/rank", *VARIANTS, "speed-up"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for ranks in (1, 2):
        for case in CASES:
            ms = [statistics.median(steps[(ranks, case["model"], case["batch"], name)]) for name in VARIANTS]
            rows.append({"ranks": ranks, "model": case["model"], "batch": case["batch"],
                         **dict(zip(VARIANTS, ms)), "speedup": ms[0] / ms[1]})
            table.add_row(str(ranks), case["model"], str(case["batch"]), *(f"{m:.1f}" for m in ms),
                          f"{ms[0] / ms[1]:.2f}x")
    Console(width=None if sys.stdout.isatty() else 120).print(table)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "host_allocator.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
