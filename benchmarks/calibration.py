"""Calibration for the benchmarks that check gpurig predict: only micro-benchmarks, never training runs.

``calibrate_compute`` is ``gpurig bench``'s compute part (GEMMs over a grid of
shapes, memory bandwidth, per-layer overhead, real layers, optimizer steps, codec
costs; 1 rank and 2 ranks at once); ``calibrate_links`` measures allreduce by
message size in an environment (2 local ranks, or 2 emulated nodes behind a
link), each call isolated by a barrier as a step's buckets are, and fits latency
and bandwidth;
``profile_for`` writes the two together as a profile ``gpurig predict`` reads.

    compute = calibrate_compute(tmp)
    path = profile_for(compute, "1gbit", tmp)       # gpurig predict --cluster PATH
"""

import json
import subprocess
import sys
from pathlib import Path

from gpurig.measure.profile import SCHEMA, summarize_engine, summarize_overlap
from gpurig.launch.emulator import Cluster


def run_local(command: list[str], nprocs: int) -> None:
    done = subprocess.run([sys.executable, "-m", "gpurig", "run", "-n", str(nprocs), "--", *command])
    if done.returncode:
        raise SystemExit(f"job failed: {' '.join(command)}")


def run_env(env: str, command: list[str]) -> None:
    """Run ``command`` on 2 ranks of environment ``env`` (local, or emulated nodes at a rate)."""
    if env == "local":
        return run_local(command, 2)
    with Cluster(nodes=2, rate=env) as cluster:
        if cluster.run(command, engine="mpi"):
            raise SystemExit(f"job failed in {env}: {' '.join(command)}")


def calibrate_compute(tmp: Path) -> dict:
    """gpurig bench's compute part: 1 rank and 2 ranks at once."""
    out = tmp / "compute-profile.json"
    done = subprocess.run([sys.executable, "-m", "gpurig", "bench", "--parts", "compute", "-n", "2",
                           "--out", str(out), "--json"], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"gpurig bench failed: {done.stderr[-2000:]}")
    return json.loads(out.read_text())


def calibrate_links(env: str, tmp: Path) -> dict:
    """Allreduce by size in ``env`` (gpurig bench's comm measurement), fitted to latency and bandwidth."""
    events = tmp / f"comm-{env}.jsonl"
    config = tmp / f"comm-{env}.json"
    config.write_text(json.dumps({"events": str(events), "collectives": ["allreduce"], "p2p": False,
                                  "min_bytes": 4096, "max_bytes": 8 << 20, "budget_bytes": 64 << 20,
                                  "min_iterations": 5, "max_iterations": 100, "warmup": 3, "isolated": True,
                                  "overlap": True, "compressed": ["int8", "fp16", "powersgd"]}))
    run_env(env, [sys.executable, "-m", "gpurig.measure.comm", str(config)])
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    rows = [r for r in rows if r.get("event") == "row"]
    # emulated nodes are namespaces of this one machine: both ranks share its cores
    return {"ranks": 2, "nodes": 1 if env == "local" else 2, "ranks_per_machine": 2,
            "engines": {"mpi": summarize_engine(rows)}, "overlap": {"mpi": summarize_overlap(rows)}}


def profile_for(compute: dict, env: str, tmp: Path, comm: dict | None = None) -> Path:
    """A machine profile of ``compute`` (:func:`calibrate_compute`) and ``env``'s links (``comm``, as
    :func:`calibrate_links` gives them; measured now when not given), written under ``tmp``."""
    profile = {"schema": SCHEMA, "device": "cpu", "cpu": "this machine", **compute,
               "comm": calibrate_links(env, tmp) if comm is None else comm}
    path = tmp / f"profile-{env.replace(' ', '-')}.json"
    path.write_text(json.dumps(profile))
    return path
