"""The training loop every rank runs: shard the data, step, measure the split, checkpoint each epoch.

Read it top to bottom: :func:`train_on_this_rank` is the whole loop; the
helpers it calls are in :mod:`gpurig.train.state` (wrapping and resuming),
:mod:`gpurig.train.metrics` (the step split, the event log) and
:mod:`gpurig.train.predicted` (the prediction printed beside the measurement).
Run by hand, a rank is ``python -m gpurig.train CONFIG.json``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import time
import warnings
from pathlib import Path

import torch

from gpurig import comm as comm_mod
from gpurig.launch import standby
from gpurig.launch.env import rank_from_env
from gpurig.launch.processes import say
from gpurig.launch.status import ended_by
from gpurig.parallel import (DataParallel, NonFiniteGradientError, ZeroRedundancyOptimizer, optimizer_state_bytes,
                             parameter_bytes, shard)
from gpurig.parallel.mixed_precision import MixedPrecision
from gpurig.train import checkpoints
from gpurig.train import data as datasets
from gpurig.train.config import TrainConfig, after_restart
from gpurig.train.faults import Injector
from gpurig.parallel.timeline import Timeline
from gpurig.train.optimizer import build as build_optimizer
from gpurig.train.metrics import EventLog, MetricsLog, StepSplit, split_across_ranks, step_metrics, waiting_fraction
from gpurig.train.predicted import calibrate, prediction
from gpurig.train.sources import build_model
from gpurig.train.step import train_step
from gpurig.train.utilization import BENCH_PROFILE, achieved, flops_per_step, peak_flops_per_s
from gpurig.train.state import (CannotResume, bytes_per_rank, restore_feedback, resume_state, weights_digest,
                                whole_model_state, whole_state, wrap_model)

WARMUP_STEPS = 1  # the run's first steps, trained but not timed in their epoch's step time and split


def train_on_this_rank(config: TrainConfig, on_event=None) -> dict:
    """The training loop every rank runs; returns the run's summary (the ``done`` event). ``on_event``: called with
    rank 0's progress events as it emits them (a rank started by a launcher shows them itself).

    >>> summary = train_on_this_rank(TrainConfig(epochs=1))   # one rank, no launcher  # doctest: +SKIP
    >>> summary["test_accuracy"] > 0.8                         # doctest: +SKIP
    True
    """
    data = datasets.load(config.data)
    standby.park()  # a standby rank of a job that may restart waits here: imports done, data loaded
    config = after_restart(config)  # started again: from the newest checkpoint
    comm = comm_mod.init(config.engine)
    events = EventLog(config.events, enabled=comm.rank == 0, listener=on_event)
    torch.manual_seed(config.seed)
    model = build_model(config.model).to(comm.device)
    start, history, carried_loss = checkpoints.Position(0), [], 0.0
    if config.resume:
        state = resume_state(config, comm)
        model.load_state_dict(state["model"])
        start, history = checkpoints.Position(state["epoch"], state.get("step", 0)), list(state["history"])
        carried_loss = state.get("epoch_loss_sum", 0.0)  # a mid-epoch checkpoint: the epoch's loss so far (ranks' mean)
        if comm.rank == 0:
            checkpoints.remove_leftovers(config.checkpoint_dir)  # what a write the failure cut short left
    elif comm.rank == 0:
        checkpoints.clear(config.checkpoint_dir)  # a fresh run starts a new series
    start_epoch = start.epochs
    newest = start  # the position of the newest checkpoint: the summary names it
    to_train = start_epoch < config.epochs  # resumed at or past --epochs: nothing to train, only said
    parameters, whole_bytes = sum(p.numel() for p in model.parameters()), parameter_bytes(model)
    model_flops = flops_per_step(model, data.x_train, config.global_batch)  # for TFLOP/s and MFU; None: unknown
    wrapped = wrap_model(model, config, comm)
    # The DataParallel that averages gradients (all of them, or a hybrid model's replicated part), if any.
    dp = wrapped if isinstance(wrapped, DataParallel) else wrapped.data_parallel
    trainable = [p for p in wrapped.parameters() if p.requires_grad]  # frozen weights stay as they are
    optimizer = build_optimizer(trainable, config.optimizer, config.optimizer_settings())
    if config.shard != "none":  # ZeRO: this rank's 1/N of the optimizer's state; state_dict() gathers it whole
        optimizer = ZeroRedundancyOptimizer(optimizer, dp)
    mixed = MixedPrecision(config.precision, comm, nonfinite=config.on_nonfinite,
                           check_finite=config.parallel != "data")  # split layers: no DataParallel guards them
    if config.resume:
        optimizer.load_state_dict(state["optimizer"] if dp is wrapped
                                  else wrapped.local_optimizer_state(optimizer, state["optimizer"]))
        mixed.load_state_dict(state.get("scaler", {}))
        for group in optimizer.param_groups:  # the state and the checkpoint's settings carry over, but for the flags given
            group.update(config.optimizer_flags())
    keeps_feedback = dp is not None and dp.compresses
    if config.resume and keeps_feedback:
        restore_feedback(dp, config, comm, state, start)
    predicting = config.predict and to_train
    if predicting:  # seconds with nothing else to show: say what the job is doing
        events.emit("calibrating", ranks=comm.size, device=comm.device.type)
    profile_path = calibrate(comm, config) if predicting else None
    peak, peak_source = peak_flops_per_s(comm.device, config, comm.local_size, (profile_path or "", BENCH_PROFILE))
    batches = shard((data.x_train, data.y_train), global_batch=config.global_batch, comm=comm,
                           seed=config.seed, split=config.parallel != "model")
    events.emit("start", ranks=comm.size, engine=comm.engine_name, model=config.model, compression=config.compression,
                parallel=config.parallel, shard=config.shard, parameters=parameters, parameter_bytes_whole=whole_bytes,
                parameter_bytes_per_rank=bytes_per_rank(comm, parameter_bytes(wrapped)),
                epochs=config.epochs, first_epoch=start_epoch, first_step=start.step, steps_per_epoch=len(batches),
                global_batch=config.global_batch, precision=config.precision, accumulate=config.accumulate)

    recorder = Timeline(config.timeline, comm) if config.timeline else None  # --timeline: None when off
    if recorder is not None and dp is not None:
        dp.timeline = recorder
    if recorder is not None and getattr(wrapped, "exchanges", None) is not None:  # model or hybrid parallelism
        wrapped.exchanges.timeline = recorder
    faults = Injector(comm.rank)
    metrics = MetricsLog(config.checkpoint_dir, config.logdir, enabled=comm.rank == 0, first_epoch=start_epoch,
                         first_step=start.global_step(len(batches)))
    sent_before = dp.stats.bytes_sent if dp is not None else 0

    def save(position: checkpoints.Position, **extra) -> None:
        """Every rank: the checkpoint at ``position`` (residuals per rank first, then rank 0's file naming them)."""
        if keeps_feedback:
            checkpoints.save(config.feedback_path(comm.rank, position), dp.compression_state_dict())
            comm.barrier()
        model_state, optimizer_state = whole_state(wrapped, optimizer)
        if comm.rank == 0:  # the last --keep-checkpoints stay (older residuals go with them)
            checkpoints.save_checkpoint(config.checkpoint_dir, position, {
                "format": checkpoints.CHECKPOINT_FORMAT, "model_name": config.model, "optimizer_name": config.optimizer,
                "feedback": keeps_feedback, "global_batch": config.global_batch, "seed": config.seed,
                "epoch": position.epochs,
                "step": position.step, "ranks": comm.size, "parallel": config.parallel, "model": model_state,
                "optimizer": optimizer_state, "history": history, "scaler": mixed.state_dict(), **extra,
            }, keep=config.keep_checkpoints)

    for epoch in range(start_epoch, config.epochs):
        batches.set_epoch(epoch)
        comm.barrier()  # start together, so rank 0's checkpoint write is not timed as the others' waiting
        skip = start.step if epoch == start_epoch else 0  # resumed from a step: the epoch's batches before it are done
        split, loss_sum, steps = StepSplit(), (carried_loss if skip else 0.0), skip
        epoch_sent = dp.stats.bytes_sent if dp is not None else 0
        epoch_start = time.perf_counter()
        loading = time.perf_counter()
        timed_from = skip  # the steps before it are not timed (a resumed epoch's earlier ones, this run's warm-up)
        for x, y in itertools.islice(batches, skip, None):
            faults.step(epoch * len(batches) + steps)
            x, y = x.to(comm.device), y.to(comm.device)
            started = time.perf_counter()
            data_s = started - loading
            split.data += data_s
            if recorder is not None:
                recorder.add("data loading", loading, started, step=epoch * len(batches) + steps + 1)
            optimizer.zero_grad(set_to_none=True)
            try:
                outcome = train_step(wrapped, dp, optimizer, x, y, config.accumulate, mixed, recorder)
            except NonFiniteGradientError as error:  # raised on every rank at the same step
                raise Diverged(epoch * len(batches) + steps + 1, epoch + 1, error, config,
                               lr=optimizer.param_groups[0]["lr"]) from None
            loss = outcome.loss
            loss_sum += loss
            steps += 1
            loading = time.perf_counter()
            exposed = wrapped.stats.last_exposed_s
            split.compute += loading - started - exposed
            split.exposed += exposed
            events.emit("step", epoch=epoch, step=steps, loss=loss, last=steps == len(batches))
            sent = dp.stats.bytes_sent if dp is not None else 0
            metrics.step(epoch + 1, epoch * len(batches) + steps, **step_metrics(
                outcome, config.global_batch, loading - started, exposed, data_s, sent - sent_before,
                _codec(dp, config), mixed.scale_value if mixed.scaling else None))
            sent_before = sent
            if epoch == start_epoch and steps - skip == WARMUP_STEPS and steps < len(batches):
                # The run's first step loads kernels and grows the allocator (on a GPU about a second, lazy CUDA
                # modules and cuDNN's and cuBLAS's handles): the epoch's times start after it, as benchmarks do.
                split, epoch_start, epoch_sent, timed_from = StepSplit(), loading, sent, steps
            done = epoch * len(batches) + steps
            if config.checkpoint_every and done % config.checkpoint_every == 0 and steps < len(batches):
                mean_sum = comm.allreduce(torch.tensor([loss_sum], dtype=torch.float64)).item()  # ranks' mean
                save(checkpoints.Position(epoch, steps), epoch_loss_sum=mean_sum)
                if recorder is not None:
                    recorder.add("checkpoint", loading, time.perf_counter())
                loading = time.perf_counter()  # the checkpoint is not data loading
        wall = time.perf_counter() - epoch_start
        ran = steps - timed_from  # the steps timed in this run
        everyone = comm.allgather(split.as_tensor().view(1, -1))
        if recorder is not None:  # this epoch's waits, split as the step split splits them
            recorder.name_waits(waiting_fraction(everyone, comm.rank))
        mean_loss = comm.allreduce(torch.tensor([loss_sum / max(steps, 1)], dtype=torch.float64)).item()
        record = {
            "epoch": epoch + 1,
            "loss": round(mean_loss, 5),
            "test_accuracy": round(evaluate(model, data.x_test, data.y_test, comm, split=config.parallel != "model",
                                            autocast=mixed.autocast), 5),
            "samples_per_s": round(ran * config.global_batch / wall, 1),
            "step_ms": round(1000 * wall / max(ran, 1), 3),
            **split_across_ranks(everyone, ran),
            **achieved(model_flops, wall / max(ran, 1), peak, comm.size),
        }
        history.append(record)
        sent = (dp.stats.bytes_sent - epoch_sent) // max(ran, 1) if dp is not None else 0
        metrics.epoch({**record, "bytes_sent_per_step": sent, "codec": _codec(dp, config)},
                      step=(epoch + 1) * len(batches))
        saving = time.perf_counter()
        newest = checkpoints.Position(epoch + 1)
        save(newest)
        if recorder is not None:
            recorder.add("checkpoint", saving, time.perf_counter())
        events.emit("epoch", **record)

    metrics.close()
    if recorder is not None:
        recorder.close()  # every rank's events to rank 0, which writes the trace
    stats = wrapped.stats
    summary = {
        "model": config.model, "data": config.data, "ranks": comm.size, "rank": comm.rank,
        "engine": comm.engine_name, "parallel": config.parallel, "compression": config.compression,
        "shard": config.shard,
        "compression_choice": dp.auto_choice if dp is not None else None,
        "bytes_sent_per_step": stats.bytes_sent // max(stats.steps, 1),
        "global_batch": config.global_batch,
        "per_rank_batch": config.global_batch // (1 if config.parallel == "model" else comm.size),
        "parameter_bytes_whole": whole_bytes,
        "parameter_bytes_per_rank": bytes_per_rank(comm, parameter_bytes(wrapped)),
        "optimizer": config.optimizer,
        "optimizer_state_bytes_per_rank": bytes_per_rank(comm, optimizer_state_bytes(optimizer)),
        "epochs": history, "test_accuracy": history[-1]["test_accuracy"] if history else None,
        "checkpoint": str(checkpoints.checkpoint_path(config.checkpoint_dir, newest)),
        "nothing_to_train": not to_train,
        "precision": config.precision, "accumulate": config.accumulate,
        "skipped_steps": (dp.stats.skipped_steps if dp is not None else 0) + mixed.skipped_steps,
        "loss_scale": mixed.scale_value if mixed.scaling else None,
        "weights_digest": weights_digest(whole_model_state(wrapped)),
        "timeline": config.timeline,
        "flops_per_step": model_flops, "peak": peak_source, "peak_flops_per_s": peak,
    }
    if profile_path is not None and comm.rank == 0:
        summary["predicted"] = prediction(config, comm, profile_path, dp, tuple(data.x_train.shape[1:]))
    events.emit("done", **summary)
    return summary


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, comm, split: bool = True,
             autocast=contextlib.nullcontext) -> float:
    """Test accuracy over the whole test set, each rank scoring its slice (``split=False``: all of it), in the
    precision it trains in (``autocast``).

    >>> evaluate(model, data.x_test, data.y_test, comm)    # doctest: +SKIP
    0.931
    """
    part, parts = (comm.rank, comm.size) if split else (0, 1)
    mine_x, mine_y = torch.tensor_split(x, parts)[part], torch.tensor_split(y, parts)[part]
    averaged = model if isinstance(model, DataParallel) else getattr(model, "data_parallel", None)
    if averaged is not None and averaged.broadcast_buffers:  # every rank scores with rank 0's statistics
        averaged.sync_buffers()
    with torch.no_grad(), autocast():
        correct = (model(mine_x.to(comm.device)).argmax(1).cpu() == mine_y).sum()
    counts = comm.allreduce(torch.tensor([float(correct), float(len(mine_y))], dtype=torch.float64), op="sum")
    return counts[0].item() / counts[1].item()


def _codec(dp, config: TrainConfig) -> str:
    """How the gradients travel now: the method carrying most of them (auto's choice), or none."""
    if dp is None:
        return "none"
    return (dp.auto_choice or {}).get("codec", "none") if dp.auto else config.compression


class Diverged(Exception):
    """Every rank stops at the same step: the averaged gradients (or fp16's even unscaled) hold NaN or Inf."""

    def __init__(self, step: int, epoch: int, error: NonFiniteGradientError, config: TrainConfig,
                 lr: float | None = None):
        super().__init__(step, epoch, error)
        self.step, self.epoch, self.error, self.config = step, epoch, error, config
        self.lr = config.optimizer_settings()["lr"] if lr is None else lr
        newest = checkpoints.saved(config.checkpoint_dir)
        self.kept = checkpoints.checkpoint_path(config.checkpoint_dir, newest[0]).name if newest else None

    def __str__(self) -> str:
        """The one line a user reads.

        >>> error = NonFiniteGradientError("", step=87, parameter="1.weight", kind="NaN")
        >>> print(Diverged(87, 1, error, TrainConfig(lr=0.05, precision="bf16", checkpoint_dir="/nonexistent")))
        training diverged at step 87 (epoch 1): the gradient of '1.weight' holds NaN. Try a lower --lr (this run: 0.05), --precision fp32, or --on-nonfinite skip
        """
        where = f"the gradient of {self.error.parameter!r} holds {self.error.kind}" if self.error.parameter \
            else str(self.error)
        tries = [f"a lower --lr (this run: {self.lr:g})"]
        if self.config.precision != "fp32":
            tries.append("--precision fp32")
        tries.append("--on-nonfinite skip")
        kept = f"; {self.kept} is untouched" if self.kept else ""
        return (f"training diverged at step {self.step} (epoch {self.epoch}): {where}{kept}. "
                f"Try {', '.join(tries[:-1])}, or {tries[-1]}")


def run_rank(config: TrainConfig, on_event=None) -> dict:
    """:func:`train_on_this_rank`, with the stops every rank agrees on turned into rank 0's ``error`` event instead
    of a traceback on each rank: :class:`Diverged` (exit code 1) and :class:`~gpurig.train.state.CannotResume`
    (exit code 2: the user's checkpoint directory). Returns the ``done`` or ``error`` event.

    >>> run_rank(TrainConfig(lr=1e9))["message"]        # doctest: +SKIP
    "training diverged at step 2 (epoch 1): the gradient of '1.weight' holds NaN; ..."
    """
    try:
        return {"event": "done", **train_on_this_rank(config, on_event)}
    except (Diverged, CannotResume) as stop:
        event = {"event": "error", "code": 1 if isinstance(stop, Diverged) else 2, "message": str(stop)}
        EventLog(config.events, enabled=comm_mod.current().rank == 0).emit("error", code=event["code"],
                                                                          message=event["message"])
        return event


def warnings_from_rank_zero(rank: int | None) -> None:
    """Warnings as one line (``gpurig: warning: ...``), printed by rank 0 only: the ranks would all say the same."""
    def show(message, category, filename, lineno, file=None, line=None):
        if not rank:
            say(f"gpurig: warning: {message}")
    warnings.showwarning = show


def main(argv: list[str]) -> int:
    """Entry point of one rank: ``python -m gpurig.train CONFIG.json``.

    An agreed stop exits 0 on every rank — they all reached it together, nothing
    failed underneath — and the launcher reads the run's exit code from rank 0's
    ``error`` event, so the user sees one line, not one traceback per rank.
    """
    config = TrainConfig(**json.loads(Path(argv[0]).read_text()))
    warnings_from_rank_zero(rank_from_env())
    try:
        run_rank(config)
    except KeyboardInterrupt as error:  # Ctrl-C reached every rank: the launcher says it; finished epochs are kept
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher's own SIGINT follows the terminal's: shut down
        ended_by(error)   # the others say this rank was interrupted, not that it "finished its program"
        return 130
    return 0
