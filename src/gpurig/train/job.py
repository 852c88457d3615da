"""``gpurig train`` where the user typed it: check the configuration, start N ranks, relay rank 0's progress.

Each rank runs :func:`gpurig.train.loop.train_on_this_rank` (``python -m gpurig.train CONFIG.json``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from gpurig.errors import UsageError
from gpurig.launch.env import RESTART_VARIABLES
from gpurig.launch.events import following
from gpurig.launch.standby import PARKS_ITSELF_VARIABLE
from gpurig.train import checkpoints
from gpurig.train.config import STARTED_VARIABLE, TrainConfig, after_restart, validate
from gpurig.train.metrics import last_step


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
    from gpurig.launch.env import (detect_engine, in_launched_job, launched_by_mpi, rank_from_env, restart_count,
                                   size_from_env)
    from gpurig.launch.settings import job_environment

    if in_launched_job() and not launched_by_mpi() and not ({"MASTER_ADDR", "MASTER_PORT"} & set(os.environ)):
        # torchrun, gpurig run and srun all name the rendezvous: RANK and WORLD_SIZE alone are another job's
        raise UsageError(f"RANK={os.environ.get('RANK')} and WORLD_SIZE={os.environ.get('WORLD_SIZE')} are set but "
                         "no MASTER_ADDR or MASTER_PORT: left over from another job? Unset RANK and WORLD_SIZE to "
                         "start the job from here (this rank would wait for ever for its peers)")
    if in_launched_job():
        # Started as one rank by gpurig run / gpurig emulate / mpirun / srun / torchrun: train here, as that rank
        # (started again by a launcher's restart: from the newest checkpoint, train_on_this_rank decides).
        config = dataclasses.replace(config, engine=detect_engine())
        validate(config, nprocs=1)
        size = size_from_env()
        # else it silently trains on ``size`` ranks; a restart may have fewer (the hosts that remain)
        if config.nprocs is not None and size is not None and config.nprocs != size and not restart_count():
            raise UsageError(f"-n {config.nprocs}: this rank's launcher started {size} ranks (gpurig emulate "
                             f"--nodes / --ranks-per-node, mpirun -n, torchrun --nproc-per-node): drop -n here")
        if config.max_restarts:  # a flag this rank cannot act on would be a silent mistake
            raise UsageError("--max-restarts: this rank was started by another launcher, which restarts the job "
                             "or not (gpurig run --max-restarts, torchrun --max-restarts)")
        from gpurig import comm
        from gpurig.train.loop import run_rank, warnings_from_rank_zero

        warnings_from_rank_zero(rank_from_env())
        event = run_rank(config, on_event)
        if event.get("event") == "done":  # the launcher restarted the job this many times (gpurig's, torchrun's)
            event["restarts"] = restart_count()
        code = event.get("code", 0)
        if code:  # rank 0 says why; every rank's wrapper need not add "exited with code 1"
            from gpurig.launch.progress import ProgressWriter

            ProgressWriter().reported(event["message"])
        return code, ([event] if comm.current().rank == 0 else [])
    nprocs = config.nprocs if config.nprocs is not None else launch.default_nprocs(config.hosts)
    validate(config, nprocs)
    with _holding(config.checkpoint_dir), _no_input(), tempfile.TemporaryDirectory(prefix="gpurig-train-") as run_dir:
        events_path = Path(run_dir) / "events.jsonl"
        rank_config = dataclasses.replace(config, nprocs=nprocs, events=str(events_path),
                                          checkpoint_dir=str(Path(config.checkpoint_dir).resolve()),
                                          timeline=str(Path(config.timeline).resolve()) if config.timeline else None)
        config_path = Path(run_dir) / "config.json"
        config_path.write_text(json.dumps(dataclasses.asdict(rank_config)))
        seen: list[dict] = []

        def relay(event):
            seen.append(event)
            on_event(event)

        restarts, since = [], time.time()

        def restart(count, failure):
            """Before the job starts again (its ranks resume from the newest checkpoint: after_restart)."""
            again = after_restart(rank_config, {**env, **dict.fromkeys(RESTART_VARIABLES, str(count))})
            restarts.append(count)
            newest = checkpoints.saved(again.checkpoint_dir)[:1] if again.resume else []
            position = newest[0] if newest else checkpoints.Position(0)
            per_epoch = next((e["steps_per_epoch"] for e in reversed(seen) if e["event"] == "start"), 0)
            resumed_at = position.global_step(per_epoch)
            relay({"event": "restart", "restart": count, "max_restarts": config.max_restarts, "failure": str(failure),
                   "from_epoch": position.epochs, "from_step": resumed_at,
                   "checkpoint": checkpoints.checkpoint_path(again.checkpoint_dir, position).name if newest else None,
                   "resumes_at": str(position) if newest else None,
                   "lost_steps": max(last_step(again.checkpoint_dir) - resumed_at, 0)})

        env = job_environment(failure_timeout=config.failure_timeout, stall_timeout=config.stall_timeout,
                              stall_shutdown=config.stall_shutdown)
        env[PARKS_ITSELF_VARIABLE] = "1"  # a standby rank waits in the loop, its data loaded (launch.standby.park)
        env[STARTED_VARIABLE] = str(since)
        with following(events_path, relay):
            code = launch.run_job([sys.executable, "-m", "gpurig.train", str(config_path)], nprocs,
                                  engine=config.engine, hosts=config.hosts, mpi_args=config.mpi_args, env=env,
                                  iface=config.iface, max_restarts=config.max_restarts, on_restart=restart)
    stopped = [event for event in seen if event["event"] == "error"]
    if code == 0 and stopped:  # the ranks agreed to stop (see gpurig.train.loop.main): rank 0 said why
        code = stopped[-1]["code"]
    for event in seen:
        if event["event"] == "done":
            event["restarts"] = len(restarts)
    return code, seen



@contextlib.contextmanager
def _no_input():
    """The ranks' standard input is /dev/null: training reads none, and Open MPI would pass rank 0 the caller's,
    draining a shell loop's list (``while read cfg; do gpurig train ...; done < list``)."""
    try:
        saved = os.dup(0)
    except OSError:  # no standard input at all
        yield
        return
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.close(nothing)
    try:
        yield
    finally:
        os.dup2(saved, 0)
        os.close(saved)


@contextlib.contextmanager
def _holding(directory: str):
    """The checkpoint directory held for this job (:class:`gpurig.train.checkpoints.lock`); another job on it is
    one line, before any rank starts."""
    try:
        with checkpoints.lock(directory):
            yield
    except checkpoints.DirectoryInUse as error:
        raise UsageError(f"--checkpoint-dir {error}") from None


def restart_line(event: dict) -> str:
    """What a ``restart`` event means to the user, in one line: where the job resumes and what it lost.

    >>> print(restart_line({"restart": 1, "max_restarts": 2, "failure": "rank 1 was killed (SIGKILL)",
    ...     "checkpoint": "checkpoint-epoch2-step3.pt", "resumes_at": "step 3 of epoch 2", "lost_steps": 2}))
    restart 1 of 2 after rank 1 was killed (SIGKILL): resuming from step 3 of epoch 2 (checkpoint-epoch2-step3.pt); lost: the 2 steps since, run again
    >>> print(restart_line({"restart": 1, "max_restarts": 1, "failure": "rank 0 stopped", "checkpoint": None,
    ...     "lost_steps": 5}))
    restart 1 of 1 after rank 0 stopped: starting again from the first step (no checkpoint yet); lost: the 5 steps done, run again
    """
    lost = event.get("lost_steps", 0)
    steps = f"{lost} step{'s' * (lost != 1)}"
    if event.get("checkpoint"):
        where = f"resuming from {event['resumes_at']} ({event['checkpoint']})"
        lost_text = f"the {steps} since, run again" if lost else "nothing"
    else:
        where = "starting again from the first step (no checkpoint yet)"
        lost_text = f"the {steps} done, run again" if lost else "nothing"
    return f"restart {event['restart']} of {event['max_restarts']} after {event['failure']}: {where}; lost: {lost_text}"
