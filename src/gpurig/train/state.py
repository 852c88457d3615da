"""What a rank holds: the model as ``--parallel`` wraps it, its whole state for a checkpoint, where a resumed run starts."""

from __future__ import annotations

import torch

from gpurig.launch.processes import say
from gpurig.train import checkpoints
from gpurig.train.config import TrainConfig, resume_problem


def wrap_model(model: torch.nn.Module, config: TrainConfig, comm) -> torch.nn.Module:
    """The model as ``--parallel`` asks: DataParallel (data), split layers (model), or both (hybrid).

    model and hybrid split the fully connected layers with Krizhevsky's plan
    (:func:`gpurig.parallel.krizhevsky_plan`): for the MLP the two 1200-unit layers
    (column, row; the 10-way classifier stays whole), for the CNN the two dense
    layers. Hybrid runs what comes before them (the CNN's convolutions; for the MLP
    nothing, so its batch is gathered at the input) data-parallel on each rank's
    part of the batch, and what comes after (the MLP's classifier) too.

    >>> wrap_model(models.mlp(), TrainConfig(parallel="model"), gpurig.init())   # doctest: +SKIP
    """
    from gpurig.parallel import DataParallel, krizhevsky_plan, parallelize

    # fp16's loss scaler judges overflowing gradients itself (after unscaling them), every rank together
    nonfinite = "ignore" if config.precision == "fp16" else config.on_nonfinite
    if config.parallel == "data":
        return DataParallel(model, comm, bucket_cap_mb=config.bucket_mb, compression=config.compression,
                            nonfinite=nonfinite, shard=config.shard,
                            find_unused_parameters=config.find_unused_parameters)
    hybrid = config.parallel == "hybrid"
    return parallelize(model, krizhevsky_plan(model), comm, hybrid=hybrid, bucket_cap_mb=config.bucket_mb,
                       compression=config.compression if hybrid else "none", nonfinite=nonfinite)


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


class CannotResume(checkpoints.CheckpointError):
    """Every rank found that the run cannot resume (raised on all of them together, after they compared notes)."""


def resume_state(config: TrainConfig, comm) -> dict:
    """The newest good checkpoint in ``config.checkpoint_dir``, the same on every rank; damaged newer ones are
    reported (by rank 0) and passed over. Raises :class:`CannotResume` on every rank when any rank cannot.

    >>> state = resume_state(TrainConfig(resume=True), gpurig.init())   # doctest: +SKIP
    """
    try:
        state, path, problems = checkpoints.load_newest(config.checkpoint_dir)
        problem = resume_problem(state, path, config)
    except checkpoints.CheckpointError as error:
        state, path, problems, problem = {}, None, [], str(error)
    found = comm.allgather(torch.tensor([[problem is None, state.get("epoch", 0), state.get("step", 0)]],
                                        dtype=torch.int64), name="resume position").tolist()
    failed = [rank for rank, (ok, _, _) in enumerate(found) if not ok]
    if failed:  # every rank stops here, together; each says what it found, rank 0's line is the one shown
        raise CannotResume(problem or f"rank {failed[0]} cannot resume from {config.checkpoint_dir}: is it one "
                                      "directory shared by all the ranks?")
    if len({tuple(position) for position in found}) != 1:
        positions = [str(checkpoints.Position(*position[1:])) for position in found]
        raise CannotResume(f"the ranks found different newest checkpoints ({', '.join(positions)}): "
                           f"is {config.checkpoint_dir} one directory shared by all of them?")
    if comm.rank == 0:
        for passed_over in problems:
            say(f"gpurig: {passed_over}; using an older checkpoint")
        if problems:
            say(f"gpurig: resuming from {path}")
    return state


def restore_feedback(dp, config: TrainConfig, comm, state: dict, start: checkpoints.Position) -> None:
    """Load each rank's error-feedback residuals saved with the checkpoint ``state`` at ``start`` into ``dp``, on
    every rank or on none: residuals are per rank and per bucket layout, and the methods they carry must agree
    across the ranks. Where the checkpoint's run did not compress, ran on other ranks, compressed otherwise, or a
    rank's file is missing or damaged, error feedback starts from zero, and the run says why.

    >>> restore_feedback(model, TrainConfig(resume=True), gpurig.init(), state, Position(2))   # doctest: +SKIP
    """
    # a checkpoint from before "feedback" was recorded: its residuals are there if this rank's file is
    if not state.get("feedback", config.feedback_path(comm.rank, start).exists()):
        if comm.rank == 0:
            say("gpurig: the checkpoint's run did not compress gradients: compression's error-feedback residuals "
                "start from zero")
        return
    if state.get("ranks", comm.size) != comm.size or state.get("parallel", "data") != config.parallel:
        if comm.rank == 0:
            say(f"gpurig: the checkpoint is from {state['ranks']} ranks ({state.get('parallel', 'data')}), "
                f"this run has {comm.size} ({config.parallel}): compression's error-feedback residuals start from zero")
        return
    saved, problem = None, None
    try:
        saved = checkpoints.load(config.feedback_path(comm.rank, start))
        problem = dp.compression_state_problem(saved)
    except checkpoints.CheckpointError as error:
        problem = str(error)
    usable = comm.allgather(torch.tensor([[problem is None]], dtype=torch.int64), name="feedback restored")
    if bool(usable.all()):
        dp.load_compression_state_dict(saved)
    elif problem is not None:  # each rank that cannot says why; all start afresh
        say(f"gpurig: rank {comm.rank}: {problem}: compression's error-feedback residuals start from zero on every "
            f"rank")
