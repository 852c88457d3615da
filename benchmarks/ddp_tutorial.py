"""PyTorch's DDP tutorial script, unmodified, many times under each launcher: how many runs fail.

    .venv/bin/python benchmarks/ddp_tutorial.py --runs 100                  # gpurig run, both engines
    .venv/bin/python benchmarks/ddp_tutorial.py --runs 24 --launchers torchrun

Each run is ``gpurig run -n 2 --engine E -- python examples/ddp_tutorial.py``
(or ``torchrun --nproc-per-node 2 examples/ddp_tutorial.py``); a run fails when
it exits non-zero or a rank did not print its "Finished" line. The abort at exit
(SIGABRT, "terminate called without an active exception", Gloo's threads
meeting the interpreter's teardown) counts as a failure. Prints a Markdown
table, and with ``--out`` writes it and the JSON beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "ddp_tutorial.py"
LAUNCHERS = {
    "gpurig-mpi": [sys.executable, "-m", "gpurig", "run", "-n", "2", "--engine", "mpi", "--", "python", str(SCRIPT)],
    "gpurig-torch": [sys.executable, "-m", "gpurig", "run", "-n", "2", "--engine", "torch", "--", "python",
                     str(SCRIPT)],
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT)],
}


def one_run(launcher: str, timeout: float = 120) -> dict:
    """Run the script once under ``launcher``: its exit code, whether both ranks finished, the last line of stderr."""
    started = time.monotonic()
    try:
        done = subprocess.run(LAUNCHERS[launcher], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        code, out, err = "timeout", expired.stdout or "", expired.stderr or ""
        out, err = (out.decode() if isinstance(out, bytes) else out), (err.decode() if isinstance(err, bytes) else err)
    finished = sum(f"Finished running basic DDP example on rank {r}." in out for r in range(2))
    lines = [line for line in err.splitlines() if line.strip()]
    return {"launcher": launcher, "exit": code, "finished_ranks": finished, "seconds": round(time.monotonic() - started, 2),
            "ok": code == 0 and finished == 2, "aborted": "terminate called without an active exception" in err
            or "SIGABRT" in err, "last_line": lines[-1] if lines else ""}


def table(results: list[dict]) -> str:
    """Failures per launcher, as Markdown."""
    rows = ["| launcher | runs | failed | of which SIGABRT at exit | median s per run |", "|---|---:|---:|---:|---:|"]
    for launcher in dict.fromkeys(r["launcher"] for r in results):
        mine = [r for r in results if r["launcher"] == launcher]
        seconds = sorted(r["seconds"] for r in mine)
        rows.append(f"| {launcher} | {len(mine)} | {sum(not r['ok'] for r in mine)} | "
                    f"{sum(r['aborted'] for r in mine)} | {seconds[len(seconds) // 2]:.1f} |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=100, help="runs per launcher (default 100)")
    p.add_argument("--launchers", default="gpurig-mpi,gpurig-torch", help=f"any of {', '.join(LAUNCHERS)}")
    p.add_argument("--out", default=None, help="write the table as Markdown here (and the JSON beside it)")
    args = p.parse_args(argv)
    launchers = [name.strip() for name in args.launchers.split(",") if name.strip()]
    unknown = [name for name in launchers if name not in LAUNCHERS]
    if unknown or args.runs < 1:
        p.error(f"unknown launcher {unknown}" if unknown else "--runs must be at least 1")
    results = []
    for number in range(args.runs):  # launchers take turns, so the machine's noise hits them alike
        for launcher in launchers:
            result = one_run(launcher)
            results.append(result)
            print(f"run {number + 1} {launcher}: {'ok' if result['ok'] else 'FAILED'} ({result['exit']})"
                  f"{'' if result['ok'] else ': ' + result['last_line']}", file=sys.stderr, flush=True)
            if args.out:  # as it goes: a long run cut short still leaves its count
                Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=2))
    text = table(results)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
