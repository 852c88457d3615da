"""What ``gpurig predict`` is asked: the model, the hardware and how it runs (the CLI flags, one to one), checked."""

from __future__ import annotations

from dataclasses import dataclass

from gpurig.errors import UsageError
from gpurig.perf.precision import check as check_precision
from gpurig.perf.precision import check_memory_format
from gpurig.perf.software import check as check_software
from gpurig.perf.optimizer import check_optimizer
from gpurig.perf.optimizer import default_implementation

PARALLEL = ("data", "model", "hybrid")
PARALLEL_WHY = {
    "data": "each GPU its part of the batch; every gradient averaged over the network",
    "model": "the fully connected layers split: their activations travel instead of their gradients, "
             "but every GPU computes the rest on the whole batch",
    "hybrid": "Krizhevsky's scheme: convolutions data-parallel, fully connected layers split on the gathered batch",
}
DEFAULT_BATCH = {"mnist-mlp": 64, "mnist-cnn": 64, "mnist-wide-cnn": 64}  # per GPU; else the source's 64-per-GPU rule of thumb


@dataclass(frozen=True)
class PredictRequest:
    """What to predict (the CLI flags, one to one)."""

    model: str
    cluster: str | None = None       # a cluster spec (.toml), a machine profile (.json) or a one-line description
    profile: str | None = None       # a machine profile to calibrate a spec's devices and links with
    batch: int | None = None         # per GPU
    tokens: int | None = None
    sample: str | None = None
    parallel: str = "data"
    compression: str = "none"
    precision: str = "fp32"
    engine: str = "mpi"              # which engine's measurements a profile's links come from
    gpus: int | None = None          # predict up to this many (default: the whole cluster)
    algorithm: str = "best"
    bucket_mb: float | None = None
    optimizer: str | None = None     # None: the one the model is trained with (gpurig.models.default_optimizer)
    # how the optimizer runs (gpurig.perf.optimizer): fused, foreach, for-loop; None: torch.optim's default
    optimizer_impl: str | None = None
    shard: str = "none"              # ZeRO: none, optimizer (stage 1), gradients (stage 2)
    prefetch: bool = True
    pinned: bool = True
    network_efficiency: float | None = None  # of the network's data rate; default by kind (docs/predict.md)
    software: str = "current"        # the framework release that runs it (gpurig.perf.software)
    memory_format: str = "contiguous"  # convolutions' activation layout (gpurig.perf.precision.MEMORY_FORMATS)

    def __post_init__(self):
        """No optimizer named: the model's usual one.

        >>> PredictRequest(model="bert-base").optimizer, PredictRequest(model="resnet50").optimizer
        ('adamw', 'momentum')
        """
        if self.optimizer is None:
            from gpurig.models import default_optimizer   # the model registry imports torch: only when needed

            object.__setattr__(self, "optimizer", default_optimizer(self.model))


def optimizer_impl(request: PredictRequest, gpu: bool = True) -> str:
    """How the request's optimizer runs: as asked, else torch.optim's default for its software on a GPU
    (:func:`gpurig.perf.optimizer.default_implementation`), and one tensor at a time on CPU ranks.

    >>> optimizer_impl(PredictRequest(model="mlp")), optimizer_impl(PredictRequest(model="mlp", software="pytorch-1.7"))
    ('foreach', 'for-loop')
    >>> optimizer_impl(PredictRequest(model="mlp"), gpu=False), optimizer_impl(PredictRequest(model="mlp", optimizer_impl="fused"))
    ('for-loop', 'fused')
    """
    if request.optimizer_impl is not None:
        return request.optimizer_impl
    return default_implementation(request.software) if gpu else "for-loop"


MAX_BATCH = 10 ** 9  # per GPU: far past any GPU's memory (predict says what fits), short of integer overflow


def check_batch(batch: int | None) -> None:
    """Refuse a per-GPU batch below 1 or beyond :data:`MAX_BATCH` (None: the default batch).

    >>> check_batch(10 ** 20)
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --batch must be at most 1,000,000,000 per GPU, got 100000000000000000000
    """
    if batch is not None and batch < 1:
        raise UsageError(f"--batch must be at least 1 per GPU, got {batch}")
    if batch is not None and batch > MAX_BATCH:
        raise UsageError(f"--batch must be at most {MAX_BATCH:,} per GPU, got {batch}")


def check(request: PredictRequest) -> None:
    """Refuse, in one line, a request that cannot be predicted.

    >>> check(PredictRequest(model="mlp", batch=0))
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --batch must be at least 1 per GPU, got 0
    >>> check(PredictRequest(model="mlp", optimizer="adagrad"))
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --optimizer must be one of sgd, momentum, adam, adamw, lamb, got 'adagrad'
    """
    from gpurig.parallel.compression import parse_method

    check_precision(request.precision)
    check_software(request.software, request.precision)
    check_memory_format(request.memory_format)
    check_optimizer(request.optimizer, request.optimizer_impl)
    if request.parallel not in PARALLEL:
        raise UsageError(f"--parallel must be one of {', '.join(PARALLEL)}, got {request.parallel!r}")
    try:
        parse_method(request.compression)
    except ValueError as error:
        raise UsageError(str(error)) from None
    from gpurig.parallel.zero import SHARD_MODES, check_shard

    if request.shard not in SHARD_MODES:
        raise UsageError(f"--shard must be one of {', '.join(SHARD_MODES)}, got {request.shard!r}")
    if request.shard != "none" and request.parallel != "data":
        raise UsageError(f"--shard {request.shard} shards data parallelism's optimizer state: use --parallel data")
    try:
        check_shard(request.shard, request.compression)
    except ValueError as error:
        raise UsageError(f"--shard {request.shard}: {error}") from None
    check_batch(request.batch)
    if request.gpus is not None and request.gpus < 1:
        raise UsageError(f"--gpus must be at least 1, got {request.gpus}")
    if request.network_efficiency is not None and not 0 < request.network_efficiency <= 1:
        raise UsageError(f"--network-efficiency must be in (0, 1], got {request.network_efficiency}")
    from gpurig.perf.collectives import ALGORITHMS

    if request.algorithm not in ("best", *ALGORITHMS):
        raise UsageError(f"--algorithm must be one of best, {', '.join(ALGORITHMS)}, got {request.algorithm!r}")
    if request.engine not in ("mpi", "torch"):
        raise UsageError(f"--engine must be mpi or torch, got {request.engine!r}")
    if request.tokens is not None and ":" in request.model:  # its sample's shape is what --sample says
        raise UsageError(f"--tokens sizes the built-in transformers' sequences; {request.model}'s input is --sample "
                         f"(e.g. --sample {request.tokens}:int64 for {request.tokens} token ids)")
    if request.algorithm != "best" and request.parallel != "data":
        raise UsageError(f"--algorithm {request.algorithm} prices data parallelism's allreduce; --parallel "
                         f"{request.parallel}'s exchanges are priced as the split layers make them: leave it out")
    if request.engine != "mpi" and not uses_profile(request):  # a flag taken and then ignored is a silent mistake
        raise UsageError(f"--engine {request.engine} chooses whose link measurements a profile supplies; "
                         f"--cluster {request.cluster!r} is no profile: leave --engine out")


def uses_profile(request: PredictRequest) -> bool:
    """Whether the hardware comes from a ``gpurig bench`` profile (``--cluster X.json`` or ``--profile``).

    >>> uses_profile(PredictRequest(model="mlp", cluster="runs/bench/profile.json"))
    True
    """
    return request.profile is not None or (request.cluster or "").endswith(".json")
