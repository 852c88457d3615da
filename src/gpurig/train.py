"""``gpurig train``, the main job: data-, model- or hybrid-parallel training of a reference model on all local ranks.

Two halves. :func:`launch_training` runs where the user typed the command: it
checks the configuration, starts N ranks through :mod:`gpurig.launch` and relays
rank 0's progress events. :func:`train_on_this_rank` runs in every rank: the
training loop, with the measured split of each step into computation,
communication not hidden under backward, waiting for slower ranks, and data
loading — the terms ``gpurig predict`` uses.

Run by hand, a rank is ``python -m gpurig.train CONFIG.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from gpurig import checkpoint, checkpoint_series
from gpurig.errors import UsageError
from gpurig.faults import Injector
from gpurig.launch.events import following
from gpurig.launch.processes import say

CHECKPOINT_FORMAT = "gpurig-train/1"
ENGINES = ("mpi", "torch")
PARALLEL = ("data", "model", "hybrid")


@dataclass
class TrainConfig:
    """Everything one ``gpurig train`` run depends on (the CLI flags, one to one)."""

    model: str = "mlp"
    data: str = "mnist"
    epochs: int = 5
    global_batch: int = 128
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    nprocs: int | None = None
    engine: str = "mpi"
    hosts: str | None = None
    mpi_args: str = ""
    bucket_mb: float | None = None
    compression: str = "auto"
    parallel: str = "data"
    checkpoint_dir: str = "runs/train"
    resume: bool = False
    predict: bool = True
    keep_checkpoints: int = checkpoint_series.KEEP
    on_nonfinite: str = "stop"
    iface: str | None = None
    failure_timeout: float | None = None
    stall_timeout: float | None = None
    events: str | None = None

    def feedback_path(self, rank: int, epoch: int) -> Path:
        """Where a rank keeps its error-feedback residuals after ``epoch`` (they differ per rank)."""
        return checkpoint_series.epoch_path(self.checkpoint_dir, epoch, f"feedback-rank{rank}")


def validate(config: TrainConfig, nprocs: int) -> None:
    """Raise :class:`UsageError` (one line) for a configuration that cannot run.

    >>> validate(TrainConfig(global_batch=2), nprocs=4)
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --global-batch 2 over 4 ranks leaves 2 rank(s) with no samples: use at least 4
    """
    from gpurig import datasets, models

    if config.model not in models.MODELS:
        raise UsageError(f"unknown model {config.model!r}; choose one of: {', '.join(models.MODELS)}")
    if config.data not in datasets.DATASETS:
        raise UsageError(f"unknown data set {config.data!r}; choose one of: {', '.join(datasets.DATASETS)}")
    if config.engine not in ENGINES:
        raise UsageError(f"unknown engine {config.engine!r}; choose one of: {', '.join(ENGINES)}")
    if nprocs < 1:
        raise UsageError(f"-n must be at least 1, got {nprocs}")
    if config.epochs < 1:
        raise UsageError(f"--epochs must be at least 1, got {config.epochs}")
    if config.global_batch < nprocs:
        raise UsageError(f"--global-batch {config.global_batch} over {nprocs} ranks leaves "
                         f"{nprocs - max(config.global_batch, 0)} rank(s) with no samples: use at least {nprocs}")
    if not 0 < config.lr < math.inf:
        raise UsageError(f"--lr must be a positive number, got {config.lr}")
    if not 0 <= config.momentum < 1:
        raise UsageError(f"--momentum must be in [0, 1), got {config.momentum}")
    from gpurig.parallel import auto
    from gpurig.parallel.compression import parse_method

    try:
        candidates = auto.parse(config.compression)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if candidates is None:
        try:
            parse_method(config.compression)
        except ValueError as e:
            raise UsageError(f"{e} (or auto)") from None
    if config.bucket_mb is not None and not 0 < config.bucket_mb < math.inf:
        raise UsageError(f"--bucket-mb must be a positive number, got {config.bucket_mb}")
    if config.resume and not checkpoint_series.saved_epochs(config.checkpoint_dir):
        raise UsageError(f"--resume: no checkpoint in {config.checkpoint_dir}")
    _validate_parallel(config, nprocs)
    _validate_reliability(config)


def _validate_parallel(config: TrainConfig, nprocs: int) -> None:
    """``--parallel``: a known mode, and for model/hybrid a plan that splits the model over ``nprocs`` ranks.

    >>> _validate_parallel(TrainConfig(model="cnn", parallel="model"), nprocs=3)
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --parallel model: plan: '8' (column) has 256 output features, which do not split evenly over 3 ranks
    """
    from gpurig import models
    from gpurig.parallel.plan import PlanError, krizhevsky_plan, resolve_plan

    if config.parallel not in PARALLEL:
        raise UsageError(f"unknown parallelism {config.parallel!r}; choose one of: {', '.join(PARALLEL)}")
    if config.parallel == "data":
        return
    from gpurig.parallel import auto

    if config.parallel == "model" and config.compression != "none" and auto.parse(config.compression) is None:
        raise UsageError(f"--compression {config.compression}: gradients are compressed when they are averaged, "
                         "and with --parallel model none are")
    if config.on_nonfinite == "skip":  # the split layers' gradients are not averaged, so nothing could skip them
        raise UsageError("--on-nonfinite skip works with --parallel data only (the guard sees averaged gradients)")
    with torch.device("meta"):  # the layout only: no memory, no initialisation
        model = models.build(config.model)
    try:
        resolve_plan(model, krizhevsky_plan(model), nprocs, hybrid=config.parallel == "hybrid")
    except PlanError as error:
        raise UsageError(f"--parallel {config.parallel}: {error}") from None


def _validate_reliability(config: TrainConfig) -> None:
    """``--keep-checkpoints``, ``--on-nonfinite``, ``--failure-timeout``, ``--iface``.

    >>> _validate_reliability(TrainConfig(on_nonfinite="retry"))
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --on-nonfinite must be one of stop, skip, ignore, got 'retry'
    """
    from gpurig.launch.iface import interface_address
    from gpurig.launch.settings import seconds
    from gpurig.parallel.numerics import ACTIONS

    if config.keep_checkpoints < 1:
        raise UsageError(f"--keep-checkpoints must be at least 1, got {config.keep_checkpoints}")
    if config.on_nonfinite not in ACTIONS:
        raise UsageError(f"--on-nonfinite must be one of {', '.join(ACTIONS)}, got {config.on_nonfinite!r}")
    for value, flag in ((config.failure_timeout, "--failure-timeout"), (config.stall_timeout, "--stall-timeout")):
        if value is not None:
            seconds(str(value), flag)
    if config.iface is not None:
        interface_address(config.iface)


# -- the launching side ------------------------------------------------------

def launch_training(config: TrainConfig, on_event=lambda event: None) -> tuple[int, list[dict]]:
    """Start ``config.nprocs`` ranks of :func:`train_on_this_rank`; return (exit code, rank 0's events).

    ``on_event`` sees each event as rank 0 emits it (``start``, ``step``,
    ``epoch``, ``done``), for progress display.

    >>> code, events = launch_training(TrainConfig(epochs=1))   # doctest: +SKIP
    >>> events[-1]["event"], code                              # doctest: +SKIP
    ('done', 0)
    """
    from gpurig import launch
    from gpurig.launch.env import detect_engine, in_launched_job
    from gpurig.launch.settings import job_environment

    if in_launched_job():
        # Started as one rank by gpurig run / gpurig emulate / mpirun / srun: train here, as that rank.
        config = dataclasses.replace(config, engine=detect_engine())
        validate(config, nprocs=1)
        summary = train_on_this_rank(config)
        return 0, ([{"event": "done", **summary}] if summary["rank"] == 0 else [])
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
    return code, seen


# -- the rank side -----------------------------------------------------------

class EventLog:
    """Rank 0's progress as JSON lines (a file the launcher follows), or nothing on other ranks."""

    def __init__(self, path: str | None, enabled: bool):
        self._file = open(path, "a") if (path and enabled) else None
        self._last_step = 0.0

    def emit(self, kind: str, **fields) -> None:
        if self._file is None:
            return
        if kind == "step":
            now = time.monotonic()
            if now - self._last_step < 0.1 and not fields.get("last"):
                return
            self._last_step = now
        self._file.write(json.dumps({"event": kind, **fields}) + "\n")
        self._file.flush()


@dataclass
class StepSplit:
    """Seconds spent in each part of the training steps of one epoch, on one rank."""

    compute: float = 0.0
    exposed: float = 0.0
    data: float = 0.0

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor([self.compute, self.exposed, self.data], dtype=torch.float64)


def split_across_ranks(per_rank: torch.Tensor, steps: int) -> dict[str, float]:
    """Milliseconds per step of compute, unhidden communication, waiting and data, averaged over ranks.

    ``per_rank`` holds one row ``[compute, exposed, data]`` (seconds) per rank.
    The end of backward waits (``exposed``) both for the network and for slower
    ranks; the part explained by this rank computing faster than the slowest
    one is waiting, the rest is communication.

    >>> split_across_ranks(torch.tensor([[1.0, 0.5, 0.0], [0.8, 0.7, 0.0]], dtype=torch.float64), steps=10)
    {'compute_ms': 90.0, 'comm_ms': 50.0, 'wait_ms': 10.0, 'data_ms': 0.0}
    """
    compute, exposed, data = per_rank[:, 0], per_rank[:, 1], per_rank[:, 2]
    waiting = torch.minimum(exposed, compute.max() - compute)
    per_step = 1000.0 / max(steps, 1)
    return {
        "compute_ms": round(compute.mean().item() * per_step, 3),
        "comm_ms": round((exposed - waiting).mean().item() * per_step, 3),
        "wait_ms": round(waiting.mean().item() * per_step, 3),
        "data_ms": round(data.mean().item() * per_step, 3),
    }


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, comm, split: bool = True) -> float:
    """Test accuracy over the whole test set, each rank scoring its slice (``split=False``: all of it).

    >>> evaluate(model, data.x_test, data.y_test, comm)    # doctest: +SKIP
    0.931
    """
    part, parts = (comm.rank, comm.size) if split else (0, 1)
    mine_x, mine_y = torch.tensor_split(x, parts)[part], torch.tensor_split(y, parts)[part]
    with torch.no_grad():
        correct = (model(mine_x.to(comm.device)).argmax(1).cpu() == mine_y).sum()
    counts = comm.allreduce(torch.tensor([float(correct), float(len(mine_y))], dtype=torch.float64), op="sum")
    return counts[0].item() / counts[1].item()


def train_on_this_rank(config: TrainConfig) -> dict:
    """The training loop every rank runs; returns the run's summary (the ``done`` event).

    >>> summary = train_on_this_rank(TrainConfig(epochs=1))   # one rank, no launcher  # doctest: +SKIP
    >>> summary["test_accuracy"] > 0.8                         # doctest: +SKIP
    True
    """
    import gpurig
    from gpurig import datasets, models
    from gpurig.parallel import optimizer_state_bytes, parameter_bytes

    comm = gpurig.init(config.engine)
    events = EventLog(config.events, enabled=comm.rank == 0)
    data = datasets.load(config.data)
    torch.manual_seed(config.seed)
    model = models.build(config.model).to(comm.device)
    start_epoch, history = 0, []
    if config.resume:
        state = resume_state(config, comm)
        model.load_state_dict(state["model"])
        start_epoch, history = state["epoch"], list(state["history"])
    elif comm.rank == 0:
        checkpoint_series.clear(config.checkpoint_dir)  # a fresh run starts a new series
    parameters, whole_bytes = sum(p.numel() for p in model.parameters()), parameter_bytes(model)
    wrapped = wrap_model(model, config, comm)
    # The DataParallel that averages gradients (all of them, or a hybrid model's replicated part), if any.
    dp = wrapped if isinstance(wrapped, gpurig.DataParallel) else wrapped.data_parallel
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=config.lr, momentum=config.momentum)
    if config.resume:
        optimizer.load_state_dict(state["optimizer"] if dp is wrapped
                                  else wrapped.local_optimizer_state(optimizer, state["optimizer"]))
    keeps_feedback = dp is not None and dp.compresses
    if config.resume and keeps_feedback:
        if state.get("ranks", comm.size) == comm.size and state.get("parallel", "data") == config.parallel:
            dp.load_compression_state_dict(checkpoint.load(config.feedback_path(comm.rank, start_epoch)))
        elif comm.rank == 0:  # residuals are per rank and per bucket layout: elsewhere error feedback starts afresh
            say(f"gpurig: the checkpoint is from {state['ranks']} ranks ({state.get('parallel', 'data')}), "
                f"this run has {comm.size} ({config.parallel}): compression's error-feedback residuals start from zero")
    profile_path = calibrate(comm, config) if config.predict else None
    batches = gpurig.shard((data.x_train, data.y_train), global_batch=config.global_batch, comm=comm,
                           seed=config.seed, split=config.parallel != "model")
    events.emit("start", ranks=comm.size, engine=comm.engine_name, model=config.model, compression=config.compression,
                parallel=config.parallel, parameters=parameters, parameter_bytes_whole=whole_bytes,
                parameter_bytes_per_rank=bytes_per_rank(comm, parameter_bytes(wrapped)),
                epochs=config.epochs, first_epoch=start_epoch, steps_per_epoch=len(batches),
                global_batch=config.global_batch)

    faults = Injector(comm.rank)
    for epoch in range(start_epoch, config.epochs):
        batches.set_epoch(epoch)
        comm.barrier()  # start together, so rank 0's checkpoint write is not timed as the others' waiting
        split, loss_sum, steps = StepSplit(), 0.0, 0
        epoch_start = time.perf_counter()
        loading = time.perf_counter()
        for x, y in batches:
            faults.step(epoch * len(batches) + steps)
            x, y = x.to(comm.device), y.to(comm.device)
            started = time.perf_counter()
            split.data += started - loading
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(wrapped(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
            steps += 1
            loading = time.perf_counter()
            exposed = wrapped.stats.last_exposed_s
            split.compute += loading - started - exposed
            split.exposed += exposed
            events.emit("step", epoch=epoch, step=steps, loss=loss.item(), last=steps == len(batches))
        wall = time.perf_counter() - epoch_start
        everyone = comm.allgather(split.as_tensor().view(1, -1))
        mean_loss = comm.allreduce(torch.tensor([loss_sum / max(steps, 1)], dtype=torch.float64)).item()
        record = {
            "epoch": epoch + 1,
            "loss": round(mean_loss, 5),
            "test_accuracy": round(evaluate(model, data.x_test, data.y_test, comm, split=config.parallel != "model"), 5),
            "samples_per_s": round(steps * config.global_batch / wall, 1),
            "step_ms": round(1000 * wall / max(steps, 1), 3),
            **split_across_ranks(everyone, steps),
        }
        history.append(record)
        if keeps_feedback:  # every rank's residuals first, then the checkpoint that points at them
            checkpoint.save(config.feedback_path(comm.rank, epoch + 1), dp.compression_state_dict())
            comm.barrier()
        model_state, optimizer_state = whole_state(wrapped, optimizer)
        if comm.rank == 0:  # the last --keep-checkpoints stay (older residuals go with them)
            checkpoint_series.save_epoch(config.checkpoint_dir, epoch + 1, {
                "format": CHECKPOINT_FORMAT, "model_name": config.model, "epoch": epoch + 1, "ranks": comm.size,
                "parallel": config.parallel, "model": model_state, "optimizer": optimizer_state, "history": history,
            }, keep=config.keep_checkpoints)
        events.emit("epoch", **record)

    stats = wrapped.stats
    summary = {
        "model": config.model, "data": config.data, "ranks": comm.size, "rank": comm.rank,
        "engine": comm.engine_name, "parallel": config.parallel, "compression": config.compression,
        "compression_choice": dp.auto_choice if dp is not None else None,
        "bytes_sent_per_step": stats.bytes_sent // max(stats.steps, 1),
        "global_batch": config.global_batch,
        "per_rank_batch": config.global_batch // (1 if config.parallel == "model" else comm.size),
        "parameter_bytes_whole": whole_bytes,
        "parameter_bytes_per_rank": bytes_per_rank(comm, parameter_bytes(wrapped)),
        "optimizer_state_bytes_per_rank": bytes_per_rank(comm, optimizer_state_bytes(optimizer)),
        "epochs": history, "test_accuracy": history[-1]["test_accuracy"] if history else None,
        "checkpoint": str(checkpoint_series.epoch_path(config.checkpoint_dir, config.epochs)),
        "skipped_steps": dp.stats.skipped_steps if dp is not None else 0,
        "weights_digest": weights_digest(whole_model_state(wrapped)),
    }
    if profile_path is not None and comm.rank == 0:
        summary["predicted"] = prediction(config, comm, profile_path, dp)
    events.emit("done", **summary)
    return summary


def resume_state(config: TrainConfig, comm) -> dict:
    """The newest good checkpoint in ``config.checkpoint_dir``, the same on every rank; damaged newer ones are
    reported (by rank 0) and passed over.

    >>> state = resume_state(TrainConfig(resume=True), gpurig.init())   # doctest: +SKIP
    """
    state, path, problems = checkpoint_series.load_newest(config.checkpoint_dir)
    if state.get("format") != CHECKPOINT_FORMAT or state.get("model_name") != config.model:
        raise checkpoint.CheckpointError(f"{path} is not a checkpoint of a {config.model} run")
    epochs = comm.allgather(torch.tensor([state["epoch"]], dtype=torch.int64), name="resume epoch").tolist()
    if len(set(epochs)) != 1:
        raise checkpoint.CheckpointError(f"the ranks found different newest checkpoints (epochs {epochs}): "
                                         f"is {config.checkpoint_dir} one directory shared by all of them?")
    if comm.rank == 0:
        for problem in problems:
            say(f"gpurig: {problem}; using an older checkpoint")
        if problems:
            say(f"gpurig: resuming from {path}")
    return state


def calibrate(comm, config: TrainConfig) -> str:
    """Measure this job's ranks and links (:mod:`gpurig.measure.calibrate`, about 10 s on CPU ranks); rank 0 saves the profile.

    Returns where: ``<checkpoint dir>/profile.json``, which ``gpurig predict --cluster`` also reads.
    """
    import json as json_

    from gpurig.measure.calibrate import job_profile
    from gpurig.parallel import auto

    # the compressed averages this run may use are timed whole, as gpurig bench does ("auto": each it may choose)
    candidates = auto.parse(config.compression)
    if config.parallel == "model" or config.compression == "none":
        compressed: tuple[str, ...] = ()
    else:
        compressed = candidates[1:] if candidates else (config.compression,)
    profile = job_profile(comm, compressed)
    path = Path(config.checkpoint_dir) / "profile.json"
    if comm.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json_.dumps(profile, indent=2))
    return str(path)


def prediction(config: TrainConfig, comm, profile_path: str, dp) -> dict:
    """``gpurig predict``'s step split for this run's configuration (rank 0), or why there is none."""
    from gpurig.parallel import auto
    from gpurig.predict import predicted_split

    method = config.compression
    if auto.parse(method) is not None:
        method = (dp.auto_choice or {}).get("codec", "none") if dp is not None else "none"
    try:
        split = predicted_split(config.model, profile_path, comm.size, config.global_batch // comm.size, method,
                                config.parallel, comm.engine_name)
    except Exception as error:  # a prediction must never cost the user the run
        return {"error": str(error).splitlines()[0]}
    return {**{k: round(v, 3) for k, v in split.items()}, "compression": method, "profile": profile_path}


def wrap_model(model: torch.nn.Module, config: TrainConfig, comm) -> torch.nn.Module:
    """The model as ``--parallel`` asks: DataParallel (data), split layers (model), or both (hybrid).

    model and hybrid split the fully connected layers with Krizhevsky's plan
    (:func:`gpurig.krizhevsky_plan`): for the MLP the two 1200-unit layers
    (column, row; the 10-way classifier stays whole), for the CNN the two dense
    layers. Hybrid runs what comes before them (the CNN's convolutions; for the MLP
    nothing, so its batch is gathered at the input) data-parallel on each rank's
    part of the batch, and what comes after (the MLP's classifier) too.

    >>> wrap_model(models.mlp(), TrainConfig(parallel="model"), gpurig.init())   # doctest: +SKIP
    """
    import gpurig

    if config.parallel == "data":
        return gpurig.DataParallel(model, comm, bucket_cap_mb=config.bucket_mb, compression=config.compression,
                                   nonfinite=config.on_nonfinite)
    hybrid = config.parallel == "hybrid"
    return gpurig.parallelize(model, gpurig.krizhevsky_plan(model), comm, hybrid=hybrid,
                              bucket_cap_mb=config.bucket_mb, compression=config.compression if hybrid else "none",
                              nonfinite=config.on_nonfinite)


def whole_model_state(wrapped: torch.nn.Module) -> dict:
    """The unsplit model's state dict (split layers gathered: call on every rank).

    >>> sorted(whole_model_state(gpurig.DataParallel(torch.nn.Linear(2, 2))))   # doctest: +SKIP
    ['bias', 'weight']
    """
    from gpurig.parallel import ModelParallel

    return wrapped.full_state_dict() if isinstance(wrapped, ModelParallel) else wrapped.state_dict()


def whole_state(wrapped: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """The unsplit model's and optimizer's state dicts (split layers gathered: call on every rank).

    A checkpoint holds them whole, so a run can resume with any ``--parallel`` and rank count.

    >>> model_state, optimizer_state = whole_state(wrapped, optimizer)    # doctest: +SKIP
    """
    from gpurig.parallel import ModelParallel

    split = isinstance(wrapped, ModelParallel)
    optimizer_state = wrapped.full_optimizer_state(optimizer) if split else optimizer.state_dict()
    return whole_model_state(wrapped), optimizer_state


def bytes_per_rank(comm, nbytes: int) -> list[int]:
    """Every rank's ``nbytes``, in rank order (a small allgather).

    >>> bytes_per_rank(gpurig.init(), 100)     # doctest: +SKIP
    [100, 100]
    """
    return [int(b) for b in comm.allgather(torch.tensor([nbytes], dtype=torch.int64)).tolist()]


def weights_digest(state: dict) -> str:
    """A short fingerprint of a state dict's weights, to compare runs (e.g. resumed vs uninterrupted).

    >>> len(weights_digest(torch.nn.Linear(2, 2).state_dict()))
    16
    """
    import hashlib

    h = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv: list[str]) -> int:
    """Entry point of one rank: ``python -m gpurig.train CONFIG.json``."""
    config = TrainConfig(**json.loads(Path(argv[0]).read_text()))
    train_on_this_rank(config)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
