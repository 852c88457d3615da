"""``gpurig train``'s configuration: every flag in one dataclass, and the checks that refuse what cannot run.

>>> validate(TrainConfig(model="mlp", global_batch=128), nprocs=2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from gpurig.errors import UsageError, check_directory, check_writable
from gpurig.launch.hosts import check_hosts
from gpurig.train import checkpoints

ENGINES = ("mpi", "torch")
PARALLEL = ("data", "model", "hybrid")


@dataclass
class TrainConfig:
    """Everything one ``gpurig train`` run depends on (the CLI flags, one to one)."""

    model: str = "mlp"
    data: str = "mnist"
    epochs: int = 5
    global_batch: int = 128
    optimizer: str = "momentum"      # torch.optim's (gpurig.train.optimizer.OPTIMIZERS)
    lr: float | None = None          # None: the optimizer's default (0.05 for SGD, the source's; torch's for Adam)
    momentum: float | None = None    # SGD's (0.9 with --optimizer momentum)
    weight_decay: float | None = None
    seed: int = 0
    nprocs: int | None = None
    engine: str = "mpi"
    hosts: str | None = None
    mpi_args: str = ""
    bucket_mb: float | None = None
    compression: str = "auto"
    shard: str = "none"
    parallel: str = "data"
    checkpoint_dir: str = "runs/train"
    resume: bool = False
    predict: bool = True
    keep_checkpoints: int = checkpoints.KEEP
    checkpoint_every: int | None = None
    timeline: str | None = None
    on_nonfinite: str = "stop"
    find_unused_parameters: bool = False
    precision: str = "fp32"
    accumulate: int = 1
    logdir: str | None = None
    iface: str | None = None
    failure_timeout: float | None = None
    stall_timeout: float | None = None
    stall_shutdown: float | None = None
    max_restarts: int = 0
    events: str | None = None

    def optimizer_settings(self) -> dict:
        """The optimizer's arguments, defaults filled in.

        >>> TrainConfig().optimizer_settings(), TrainConfig(optimizer="adam").optimizer_settings()["lr"]
        ({'lr': 0.05, 'momentum': 0.9, 'weight_decay': 0.0}, 0.001)
        """
        from gpurig.train.optimizer import settings

        return settings(self.optimizer, self.lr, self.momentum, self.weight_decay)

    def optimizer_flags(self) -> dict:
        """The optimizer's arguments this run was given (what ``--resume`` changes in the checkpoint's).

        >>> TrainConfig(lr=0.01).optimizer_flags(), TrainConfig().optimizer_flags()
        ({'lr': 0.01}, {})
        """
        given = {"lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay}
        return {key: value for key, value in given.items() if value is not None}

    def feedback_path(self, rank: int, position: checkpoints.Position) -> Path:
        """Where a rank keeps its error-feedback residuals at ``position`` (they differ per rank)."""
        return checkpoints.checkpoint_path(self.checkpoint_dir, position, f"feedback-rank{rank}")


def validate(config: TrainConfig, nprocs: int) -> None:
    """Raise :class:`UsageError` (one line) for a configuration that cannot run.

    >>> validate(TrainConfig(global_batch=2), nprocs=4)
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --global-batch 2 over 4 ranks leaves 2 rank(s) with no samples: use at least 4
    """
    from gpurig import models
    from gpurig.train import data
    from gpurig.train.sources import is_users

    if config.model not in models.TRAINABLE and not is_users(config.model):
        raise UsageError(f"unknown model {config.model!r}; choose one of: {', '.join(models.TRAINABLE)}, "
                         "or your own as module:factory")
    if config.data not in data.DATASETS and not is_users(config.data):
        raise UsageError(f"unknown data set {config.data!r}; choose one of: {', '.join(data.DATASETS)}, "
                         "or your own as module:loader")
    if config.engine not in ENGINES:
        raise UsageError(f"unknown engine {config.engine!r}; choose one of: {', '.join(ENGINES)}")
    check_hosts(config.hosts)
    if nprocs < 1:
        raise UsageError(f"-n must be at least 1, got {nprocs}")
    if config.epochs < 1:
        raise UsageError(f"--epochs must be at least 1, got {config.epochs}")
    if config.global_batch < nprocs:
        raise UsageError(f"--global-batch {config.global_batch} over {nprocs} ranks leaves "
                         f"{nprocs - max(config.global_batch, 0)} rank(s) with no samples: use at least {nprocs}")
    if config.lr is not None and not 0 < config.lr < math.inf:
        raise UsageError(f"--lr must be a positive number, got {config.lr}")
    if config.momentum is not None and not 0 <= config.momentum < 1:
        raise UsageError(f"--momentum must be in [0, 1), got {config.momentum}")
    if config.weight_decay is not None and not 0 <= config.weight_decay < math.inf:
        raise UsageError(f"--weight-decay must be a number ≥ 0, got {config.weight_decay}")
    config.optimizer_settings()   # a known optimizer, and no flag it would ignore
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
    try:
        dataset = data.load(config.data)
    except data.DatasetUnavailable as error:
        raise UsageError(str(error)) from None
    samples = len(dataset.x_train)
    check_fits(config, dataset)
    if config.global_batch > samples:  # every step would be cut from nothing: no step at all
        raise UsageError(f"--global-batch {config.global_batch} is larger than the {config.data} training set "
                         f"({samples} samples): use at most {samples}")
    steps = samples // config.global_batch * config.epochs
    if config.checkpoint_every is not None and config.checkpoint_every >= steps:
        raise UsageError(f"--checkpoint-every {config.checkpoint_every}: the run has {steps} steps, so it would "
                         f"never checkpoint between epochs (every epoch's end is checkpointed anyway): "
                         f"use at most {max(steps - 1, 1)}")
    if config.resume:
        _validate_resume(config)
    check_directory(config.checkpoint_dir, "--checkpoint-dir")
    if config.logdir is not None:
        check_directory(config.logdir, "--logdir")
    if config.timeline is not None:
        check_writable(config.timeline, "--timeline")
    _validate_parallel(config, nprocs, dataset.x_train[:2])
    _validate_shard(config)
    _validate_reliability(config)
    _validate_step(config, nprocs)
    # made and removed again: root's access() says yes to /proc and /sys, making a directory there says no
    check_directory(config.checkpoint_dir, "--checkpoint-dir", probe=True)
    if config.logdir is not None:
        check_directory(config.logdir, "--logdir", probe=True)


def resume_problem(state: dict, path, config: TrainConfig) -> str | None:
    """Why the checkpoint ``state`` (read from ``path``) cannot resume the run ``config``, or None when it can: another
    model, another optimizer (a checkpoint that names none is from before ``--optimizer``: SGD with momentum), or,
    mid-epoch, another global batch or seed (the epoch's remaining samples would not be the ones left).

    >>> state = {"format": checkpoints.CHECKPOINT_FORMAT, "model_name": "mlp"}
    >>> resume_problem(state, "ck/checkpoint-epoch2.pt", TrainConfig(model="cnn"))
    'ck/checkpoint-epoch2.pt was written by a run of --model mlp, not cnn: resume with --model mlp, or use another --checkpoint-dir'
    >>> resume_problem({**state, "step": 30, "global_batch": 120}, "ck/checkpoint-epoch1-step30.pt", TrainConfig())
    "ck/checkpoint-epoch1-step30.pt is 30 steps into an epoch at --global-batch 120: resume with --global-batch 120 (or from an epoch's end)"
    """
    if state.get("format") != checkpoints.CHECKPOINT_FORMAT:
        return f"{path} is not a checkpoint of gpurig train (format {state.get('format')!r})"
    if state.get("model_name") != config.model:
        return (f"{path} was written by a run of --model {state.get('model_name')}, not {config.model}: resume with "
                f"--model {state.get('model_name')}, or use another --checkpoint-dir")
    saved = state.get("optimizer_name", "momentum")
    if saved != config.optimizer:
        return (f"{path} holds the state of --optimizer {saved}, not {config.optimizer}: resume with --optimizer "
                f"{saved}, or use another --checkpoint-dir")
    step = state.get("step", 0)
    for flag, key in (("--global-batch", "global_batch"), ("--seed", "seed")):
        if step and state.get(key, getattr(config, key)) != getattr(config, key):
            return (f"{path} is {step} steps into an epoch at {flag} {state[key]}: resume with {flag} {state[key]} "
                    "(or from an epoch's end)")
    return None


def _validate_resume(config: TrainConfig) -> None:
    """``--resume``: a good checkpoint in ``--checkpoint-dir``, of a run of this ``--model`` (the ranks read it again).

    >>> _validate_resume(TrainConfig(resume=True, checkpoint_dir="/nonexistent"))
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --resume: no checkpoint in /nonexistent
    """
    try:
        state, path, _ = checkpoints.load_newest(config.checkpoint_dir)
    except checkpoints.CheckpointError as error:
        raise UsageError(f"--resume: {error}") from None
    problem = resume_problem(state, path, config)
    if problem:
        raise UsageError(f"--resume: {problem}")


def _validate_step(config: TrainConfig, nprocs: int) -> None:
    """``--precision`` (one these ranks' devices and this torch can run) and ``--accumulate`` (every rank at least
    one sample per micro-batch).

    >>> _validate_step(TrainConfig(global_batch=128, accumulate=48), nprocs=4)
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --accumulate 48 cuts each rank's 32 samples per step into 48 micro-batches: use at most 32 (or a larger --global-batch)
    >>> _validate_step(TrainConfig(precision="fp8"), nprocs=2)
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --precision fp8 needs NVIDIA's Transformer Engine, which gpurig train does not use: use bf16 or fp16
    """
    from gpurig.parallel.mixed_precision import check_supported

    check_supported(config.precision, "cuda" if torch.cuda.is_available() else "cpu")
    if config.precision == "fp16" and config.on_nonfinite == "ignore":
        raise UsageError("--precision fp16 checks every step's gradients for overflow (its loss scaler): "
                         "use --on-nonfinite stop or skip")
    if config.logdir is not None:
        try:
            import tensorboard  # noqa: F401  (torch.utils.tensorboard writes through it)
        except ImportError:
            raise UsageError("--logdir writes TensorBoard event files: pip install tensorboard") from None
    if config.accumulate < 1:
        raise UsageError(f"--accumulate must be at least 1, got {config.accumulate}")
    per_rank = config.global_batch // (1 if config.parallel == "model" else nprocs)
    if config.accumulate > per_rank:
        raise UsageError(f"--accumulate {config.accumulate} cuts each rank's {per_rank} samples per step into "
                         f"{config.accumulate} micro-batches: use at most {per_rank} (or a larger --global-batch)")


def check_fits(config: TrainConfig, dataset) -> None:
    """The model builds, has weights to train, takes the data's inputs and gives a score per class (at least as
    many as the largest label + 1: more are fine, a data set may lack the top classes); one line saying which part
    does not.

    >>> from gpurig.train import data
    >>> check_fits(TrainConfig(model="torch.nn:Flatten"), data.load("mnist"))
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --model torch.nn:Flatten has no weights to train (no parameter that requires grad)
    """
    from gpurig.errors import one_line
    from gpurig.train.sources import build_model

    torch.manual_seed(config.seed)
    model = build_model(config.model)
    if not any(p.requires_grad for p in model.parameters()):
        raise UsageError(f"--model {config.model} has no weights to train (no parameter that requires grad)")
    try:
        with torch.no_grad():
            out = model(dataset.x_train[:2])
    except Exception as error:  # the user's model on the user's data: any failure is reported, in one line
        raise UsageError(f"--data {config.data} does not fit --model {config.model}: {one_line(error)}") from None
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 2:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UsageError(f"--model {config.model} gives {shape} for 2 samples of {config.data}: want one row of "
                         f"class scores per sample")
    if out.shape[1] < dataset.classes:
        raise UsageError(f"--model {config.model} gives {out.shape[1]} outputs per sample, and the labels of "
                         f"{config.data} go up to {dataset.classes - 1}: its last layer should have at least "
                         f"{dataset.classes}")


def _validate_parallel(config: TrainConfig, nprocs: int, example: torch.Tensor | None = None) -> None:
    """``--parallel``: a known mode, and for model/hybrid a plan that splits the model over ``nprocs`` ranks and
    that the model's forward pass runs as planned (checked on ``example``, a few inputs, when given).

    >>> _validate_parallel(TrainConfig(model="cnn", parallel="model"), nprocs=3)
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --parallel model: plan: '8' (column) has 256 output features, which do not split evenly over 3 ranks
    >>> _validate_parallel(TrainConfig(model="gpurig.models.text:gpt2", parallel="model"), nprocs=2)  # each MLP split
    """
    from gpurig.parallel.layer_plan import PlanError, check_forward, krizhevsky_plan, left_whole, resolve_plan

    if config.parallel not in PARALLEL:
        raise UsageError(f"unknown parallelism {config.parallel!r}; choose one of: {', '.join(PARALLEL)}")
    if config.parallel == "data":
        return
    from gpurig.parallel import auto

    if config.parallel == "model" and config.bucket_mb is not None:  # a flag taken and then ignored
        raise UsageError("--bucket-mb: gradients travel in buckets when they are averaged, and with --parallel model "
                         "none are")
    if config.parallel == "model" and config.compression != "none" and auto.parse(config.compression) is None:
        raise UsageError(f"--compression {config.compression}: gradients are compressed when they are averaged, "
                         "and with --parallel model none are")
    from gpurig.train.sources import build_model

    torch.manual_seed(config.seed)
    with torch.device("cpu" if example is not None else "meta"):  # meta: the layout only, no memory
        model = build_model(config.model)
    plan, hybrid = krizhevsky_plan(model), config.parallel == "hybrid"
    if not plan:
        why = next(iter(left_whole(model).values()), "it has no nn.Linear layer")
        raise UsageError(f"--parallel {config.parallel}: --model {config.model} has no pair of nn.Linear layers "
                         f"gpurig can split (one followed by another in an nn.Sequential, only activations or dropout "
                         f"between them): {why}; use --parallel data")
    try:
        resolve_plan(model, plan, nprocs, hybrid=hybrid)
        if example is not None:
            check_forward(model, plan, example, hybrid=hybrid)
    except PlanError as error:
        raise UsageError(f"--parallel {config.parallel}: {error}") from None


def _validate_shard(config: TrainConfig) -> None:
    """``--shard``: a known stage, data parallelism, and a compression that reduce-scatters.

    >>> _validate_shard(TrainConfig(shard="gradients", compression="powersgd"))
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --shard gradients: compression 'powersgd' cannot be sharded (its low-rank factors do not cut into shards): use none, fp16, bf16, int8 or int8-dynamic
    """
    from gpurig.parallel.zero import SHARD_MODES, check_shard

    if config.shard not in SHARD_MODES:
        raise UsageError(f"unknown --shard {config.shard!r}; choose one of: {', '.join(SHARD_MODES)}")
    if config.shard != "none" and config.parallel != "data":
        raise UsageError(f"--shard {config.shard} shards data parallelism's optimizer state: use --parallel data")
    try:
        check_shard(config.shard, config.compression)
    except ValueError as error:
        raise UsageError(f"--shard {config.shard}: {error}") from None
    if config.find_unused_parameters and (config.shard != "none" or config.parallel != "data"):
        flag = f"--shard {config.shard}" if config.shard != "none" else f"--parallel {config.parallel}"
        raise UsageError(f"--find-unused-parameters is data parallelism's, unsharded: not with {flag}")


def _validate_reliability(config: TrainConfig) -> None:
    """``--keep-checkpoints``, ``--checkpoint-every``, ``--max-restarts``, ``--on-nonfinite``, ``--failure-timeout``,
    ``--iface``.

    >>> _validate_reliability(TrainConfig(on_nonfinite="retry"))
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --on-nonfinite must be one of stop, skip, ignore, got 'retry'
    """
    from gpurig.launch.iface import interface_address
    from gpurig.launch.settings import seconds
    from gpurig.parallel.numerics import ACTIONS

    if config.max_restarts < 0:
        raise UsageError(f"--max-restarts must be 0 or more, got {config.max_restarts}")
    if config.keep_checkpoints < 1:
        raise UsageError(f"--keep-checkpoints must be at least 1, got {config.keep_checkpoints}")
    if config.checkpoint_every is not None and config.checkpoint_every < 1:
        raise UsageError(f"--checkpoint-every must be at least 1 step, got {config.checkpoint_every}")
    if config.on_nonfinite not in ACTIONS:
        raise UsageError(f"--on-nonfinite must be one of {', '.join(ACTIONS)}, got {config.on_nonfinite!r}")
    for value, flag in ((config.failure_timeout, "--failure-timeout"), (config.stall_timeout, "--stall-timeout"),
                        (config.stall_shutdown, "--stall-shutdown")):
        if value is not None:
            seconds(str(value), flag)
    if config.iface is not None:
        interface_address(config.iface)


STARTED_VARIABLE = "GPURIG_TRAIN_STARTED"  # when gpurig train started the job (time.time()), for its restarts


def after_restart(config: TrainConfig, env=None) -> TrainConfig:
    """The configuration a rank trains with: in a job started again (``--max-restarts``, torchrun's too), resuming
    from this run's newest checkpoint when there is one (one written before the run began is another run's).

    >>> after_restart(TrainConfig(checkpoint_dir="/nonexistent"), {"GPURIG_RESTART_COUNT": "1"}).resume
    False
    """
    import dataclasses
    import os

    from gpurig.launch.env import restart_count

    env = os.environ if env is None else env
    newest = checkpoints.saved(config.checkpoint_dir)[:1]
    if config.resume or restart_count(env) == 0 or not newest:
        return config
    written = checkpoints.checkpoint_path(config.checkpoint_dir, newest[0]).stat().st_mtime
    return dataclasses.replace(config, resume=written >= float(env.get(STARTED_VARIABLE, "0")))
