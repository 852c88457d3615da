"""``gpurig train`` where the user typed it: check the configuration, start N ranks, relay rank 0's progress.

Each rank runs :func:`gpurig.train.loop.train_on_this_rank` (``python -m gpurig.train CONFIG.json``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from gpurig.launch.events import following
from gpurig.train.config import TrainConfig, validate


def launch_training(config: TrainConfig, on_event=lambda event: None) -> tuple[int, list[dict]]:
    """Start ``config.nprocs`` ranks of :func:`~gpurig.train.loop.train_on_this_rank`; return (exit code, rank 0's events).

    ``on_event`` sees each event as rank 0 emits it (``start``, ``step``,
    ``epoch``, ``done``; ``error`` when the ranks stopped together, with the
    exit code and the one line to print), for progress display.

    >>> code, events = launch_training(TrainConfig(epochs=1))   # doctest: +SKIP
    >>> events[-1]["event"], code                              # doctest: +SKIP
    ('done', 0)
    """
    from gpurig import launch
    from gpurig.launch.env import detect_engine, in_launched_job, rank_from_env
    from gpurig.launch.settings import job_environment

    if in_launched_job():
        # Started as one rank by gpurig run / gpurig emulate / mpirun / srun: train here, as that rank.
        config = dataclasses.replace(config, engine=detect_engine())
        validate(config, nprocs=1)
        from gpurig import comm
        from gpurig.train.loop import run_rank, warnings_from_rank_zero

        warnings_from_rank_zero(rank_from_env())
        event = run_rank(config)
        code = event.get("code", 0)
        if code:  # rank 0 says why; every rank's wrapper need not add "exited with code 1"
            from gpurig.launch.progress import ProgressWriter

            ProgressWriter().reported(event["message"])
        return code, ([event] if comm.current().rank == 0 else [])
    nprocs = config.nprocs if config.nprocs is not None else launch.default_nprocs(config.hosts)
    validate(config, nprocs)
    with tempfile.TemporaryDirectory(prefix="gpurig-train-") as run_dir:
        events_path = Path(run_dir) / "events.jsonl"
        rank_config = dataclasses.replace(config, nprocs=nprocs, events=str(events_path),
                                          checkpoint_dir=str(Path(config.checkpoint_dir).resolve()))
        config_path = Path(run_dir) / "config.json"
        config_path.write_text(json.dumps(dataclasses.asdict(rank_config)))
        seen: list[dict] = []

        def relay(event):
            seen.append(event)
            on_event(event)

        env = job_environment(failure_timeout=config.failure_timeout, stall_timeout=config.stall_timeout)
        with following(events_path, relay):
            code = launch.run_job([sys.executable, "-m", "gpurig.train", str(config_path)], nprocs,
                                  engine=config.engine, hosts=config.hosts, mpi_args=config.mpi_args, env=env,
                                  iface=config.iface)
    stopped = [event for event in seen if event["event"] == "error"]
    if code == 0 and stopped:  # the ranks agreed to stop (see gpurig.train.loop.main): rank 0 said why
        code = stopped[-1]["code"]
    return code, seen
