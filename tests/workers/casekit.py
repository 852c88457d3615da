"""A tiny harness for code that runs on every rank: record each case's outcome as JSON.

A worker script calls ``case(name)(fn)`` for each check; rank r writes
``<outdir>/rank<r>.json`` with ``{name: "ok" | "error message"}``. The pytest side
launches the job once and turns every case into its own test.
"""

import json
import os
import sys
import traceback

RESULTS: dict[str, str] = {}


def case(name):
    def run(fn):
        try:
            fn()
            RESULTS[name] = "ok"
        except Exception:
            RESULTS[name] = traceback.format_exc(limit=4)
        return fn
    return run


def write(rank: int) -> None:
    outdir = os.environ["CASE_DIR"]
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(RESULTS, f)
    sys.stdout.flush()
