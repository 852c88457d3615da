"""``gpurig bench``: measure this machine and save a machine profile (JSON) for ``gpurig predict``.

Parts (``--parts``): ``comm`` — allreduce, allgather and broadcast by message
size on N ranks of a real job (:mod:`gpurig.measure.comm`), per engine, as
nccl-tests' algbw and busbw, with latency and bandwidth (alpha, beta) fitted;
``p2p`` — rank 0 ↔ rank 1 bandwidth; ``compute`` — what the predictor calibrates
from, measured on 1 rank and on N ranks at once (:mod:`gpurig.measure.compute`:
GEMMs over a grid of shapes, memory bandwidth, per-layer overhead, codec costs); ``gemm`` — matrix-multiply throughput by
batch size (the tile effect); ``copy`` — host↔device, pinned vs pageable (GPU
only); ``loading`` — blocking vs prefetching data loading; ``disk`` —
sequential read speed. The profile's schema is in docs/hardware.md.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from gpurig.errors import UsageError
from gpurig.launch.job import check_ranks_here
from gpurig.launch.mpirun import mpi_arg_words
from gpurig.measure.profile import SCHEMA, median_profile, summarize_engine, summarize_overlap

PARTS = ("comm", "p2p", "compute", "gemm", "copy", "loading", "disk")
ENGINES = ("mpi", "torch")


@dataclass
class BenchConfig:
    """What to measure and how much; :meth:`quick` is the small version (seconds, for tests and a first look)."""

    nprocs: int = 2
    engines: tuple[str, ...] = ("mpi",)
    parts: tuple[str, ...] = PARTS
    collectives: tuple[str, ...] = ("allreduce", "allgather", "broadcast")
    min_bytes: int = 1 << 10
    max_bytes: int = 64 << 20
    budget_bytes: float = 256 << 20
    min_iterations: int = 5
    max_iterations: int = 200
    warmup: int = 3
    gemm_batches: tuple[int, ...] = (16, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128, 129, 192, 255, 256)
    gemm_k: int = 1024
    copy_sizes: tuple[int, ...] = (1 << 20, 16 << 20, 256 << 20)
    loading_batch_bytes: int = 16 << 20
    loading_steps: int = 20
    disk_bytes: int = 256 << 20
    directory: str | None = None
    mpi_args: str = ""
    quick: bool = False
    repeat: int = 1  # the compute and gemm parts, taken this many times turn about; medians kept

    @classmethod
    def quick_config(cls, **overrides) -> "BenchConfig":
        """Small sizes and few iterations: a whole run in well under a minute on 2 cores."""
        small = dict(max_bytes=1 << 20, budget_bytes=32 << 20, min_iterations=5, max_iterations=30, warmup=2,
                     gemm_batches=(31, 32, 33, 63, 64, 65, 128), gemm_k=256, copy_sizes=(1 << 20, 16 << 20),
                     loading_batch_bytes=4 << 20, loading_steps=8, disk_bytes=32 << 20, quick=True)
        return cls(**{**small, **overrides})


def validate(config: BenchConfig) -> None:
    """Refuse an impossible configuration as one line."""
    if config.nprocs < 1:
        raise UsageError(f"-n must be at least 1, got {config.nprocs}")
    if not 1 <= config.repeat <= 20:
        raise UsageError(f"--repeat must be from 1 to 20, got {config.repeat}")
    if config.nprocs < 2 and ("comm" in config.parts or "p2p" in config.parts):
        raise UsageError(f"-n must be at least 2 to measure communication, got {config.nprocs}")
    check_ranks_here(config.nprocs, "bench measures this one machine (run it on each of the others)")
    mpi_arg_words(config.mpi_args)
    for engine in config.engines:
        if engine not in ENGINES:
            raise UsageError(f"unknown engine {engine!r}: choose from {', '.join(ENGINES)}")
    for part in config.parts:
        if part not in PARTS:
            raise UsageError(f"unknown part {part!r}: choose from {', '.join(PARTS)}")
    if not config.parts:
        raise UsageError(f"--parts names no part: choose from {', '.join(PARTS)}")
    if not config.engines and ("comm" in config.parts or "p2p" in config.parts):
        raise UsageError(f"--engine names no engine to measure communication over: choose from {', '.join(ENGINES)}")
    if config.repeat != 1 and not {"compute", "gemm"} & set(config.parts):
        raise UsageError(f"--repeat takes the compute and gemm parts again, and --parts {','.join(config.parts)} "
                         "has neither")
    if not 4 <= config.min_bytes <= config.max_bytes:
        raise UsageError(f"message sizes must satisfy 4 <= min <= max, got {config.min_bytes}..{config.max_bytes}")
    if config.directory is not None:
        check_work_directory(config.directory)


def check_work_directory(directory: str) -> None:
    """``--dir``, where the loading and disk parts write their files: it must already be a writable directory
    (bench measures that disk, so it does not make one elsewhere), checked before anything is measured.

    >>> check_work_directory("/nonexistent/bench")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --dir /nonexistent/bench: no such directory
    """
    path = Path(directory)
    if not directory:
        raise UsageError("--dir '': want a directory")
    if not path.exists():
        raise UsageError(f"--dir {directory}: no such directory")
    if not path.is_dir():
        raise UsageError(f"--dir {directory}: not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"--dir {directory}: not writable")


def _comm_job(config: BenchConfig, engine: str, on_event) -> list[dict]:
    """Run :mod:`gpurig.measure.comm` on ``config.nprocs`` ranks of ``engine``; return its rows."""
    from gpurig import launch
    from gpurig.measure.comm import COMPRESSED_VALUES
    from gpurig.launch.events import following

    with tempfile.TemporaryDirectory(prefix="gpurig-bench-") as tmp:
        events = Path(tmp) / "events.jsonl"
        rank_config = {"events": str(events), "collectives": list(config.collectives) if "comm" in config.parts else [],
                       "p2p": "p2p" in config.parts, "min_bytes": config.min_bytes, "max_bytes": config.max_bytes,
                       "budget_bytes": config.budget_bytes, "min_iterations": config.min_iterations,
                       "max_iterations": config.max_iterations, "warmup": config.warmup,
                       "overlap": "comm" in config.parts,
                       "compressed": ["fp16", "bf16", "int8", "int8-dynamic", "powersgd"] if "comm" in config.parts else [],
                       "compressed_values": COMPRESSED_VALUES[:2] if config.quick else COMPRESSED_VALUES,
                       "compressed_iterations": 3 if config.quick else 7}
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(rank_config))
        rows: list[dict] = []

        def relay(event):
            if event["event"] == "row":
                rows.append(event)
            on_event(event)

        with following(events, relay):
            code = launch.run_job([sys.executable, "-m", "gpurig.measure.comm", str(path)], config.nprocs,
                                  engine=engine, mpi_args=config.mpi_args)
    if code != 0:
        raise UsageError(f"the {engine} benchmark job failed (exit code {code})")
    return rows


def _compute_job(config: BenchConfig, nprocs: int) -> dict:
    """Run :mod:`gpurig.measure.compute` on ``nprocs`` local ranks (each with its share of the cores)."""
    from gpurig import launch

    with tempfile.TemporaryDirectory(prefix="gpurig-bench-") as tmp:
        out, path = Path(tmp) / "compute.json", Path(tmp) / "config.json"
        path.write_text(json.dumps({"out": str(out), "quick": config.quick}))
        code = launch.run_job([sys.executable, "-m", "gpurig.measure.compute", str(path)], nprocs, engine="mpi",
                              mpi_args=config.mpi_args)
        if code != 0 or not out.exists():
            raise UsageError(f"the compute benchmark job on {nprocs} rank(s) failed (exit code {code})")
        return json.loads(out.read_text())


def _cpu_name() -> str:
    from gpurig.hardware.probe.system import cpu

    return cpu()["model"] or platform.processor()


def bench(config: BenchConfig, on_event=lambda event: None) -> dict:
    """Run every part of ``config``; return the machine profile. ``on_event`` sees progress events."""
    import torch

    validate(config)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    profile: dict = {
        "schema": SCHEMA, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "cpu": _cpu_name(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "quick": config.quick, "config": {k: v for k, v in asdict(config).items()},
    }
    from gpurig.measure import local

    if "comm" in config.parts or "p2p" in config.parts:
        engines, overlap = {}, {}
        for engine in config.engines:
            on_event({"event": "part", "part": f"comm ({engine})"})
            rows = _comm_job(config, engine, on_event)
            name = rows[0]["engine"] if rows else engine
            engines[name] = summarize_engine(rows)
            if summarize_overlap(rows):
                overlap[name] = summarize_overlap(rows)
        profile["comm"] = {"ranks": config.nprocs, "engines": engines, "overlap": overlap}
    # A shared machine's speed drifts by 10-30 % over minutes: with --repeat the compute measurements are
    # taken several times, turn about, and each number is the median of its takes.
    if "compute" in config.parts:
        takes: dict = {}
        for take in range(config.repeat):
            counts = sorted({1, config.nprocs})
            for ranks in counts[::-1] if take % 2 else counts:
                on_event({"event": "part", "part": f"compute ({ranks} rank{'s' if ranks > 1 else ''})"
                                                   + (f", take {take + 1} of {config.repeat}" if config.repeat > 1 else "")})
                takes.setdefault(str(ranks), []).append(_compute_job(config, ranks))
        profile["compute"] = {ranks: median_profile(takes[ranks]) for ranks in sorted(takes)}
    if "gemm" in config.parts:
        on_event({"event": "part", "part": "gemm"})
        rows = [local.gemm(list(config.gemm_batches), config.gemm_k, config.gemm_k, device) for _ in range(config.repeat)]
        profile["gemm"] = {"device": profile["device"], "dtype": "float32", "rows": median_profile(rows)}
    if "copy" in config.parts:
        on_event({"event": "part", "part": "copy"})
        profile["host_device"] = local.host_device(list(config.copy_sizes))
    if "loading" in config.parts:
        on_event({"event": "part", "part": "loading"})
        profile["loading"] = local.loading(config.loading_batch_bytes, config.loading_steps, directory=config.directory)
    if "disk" in config.parts:
        on_event({"event": "part", "part": "disk"})
        profile["disk"] = local.disk_read(config.disk_bytes, config.directory)
    return profile
