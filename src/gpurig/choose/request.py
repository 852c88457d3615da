"""What ``gpurig choose`` is asked (the CLI flags, one to one), checked in one line each."""

from __future__ import annotations

from dataclasses import dataclass

from gpurig.errors import UsageError
from gpurig.perf.optimizer import check_optimizer
from gpurig.predict.request import check_batch

OBJECTIVES = ("cost", "time", "energy")
DEFAULT_HOURS = 336.0          # the hardware guide's two weeks of training
DEFAULT_PRICE_PER_KWH = 0.20   # the hardware guide's electricity price (it says €; gpurig prices in USD)
DEFAULT_MAX_GPUS = 4           # the guide: a board usually takes 4 GPUs at most
MAX_GPUS_IN_A_BOX = 8          # the most any one machine takes (a DGX / HGX board)


@dataclass(frozen=True)
class ChooseRequest:
    """A model, how it trains, the work and the money: what to rank candidates by."""

    model: str
    batch: int | None = None             # per GPU (predict's default when None)
    tokens: int | None = None
    sample: str | None = None            # a module:factory model's input of one sample (as predict)
    precision: str = "fp32"
    optimizer: str | None = None         # None: the one the model is trained with (as predict)
    optimizer_impl: str | None = None    # fused, foreach, for-loop (predict's default when None)
    budget: float | None = None          # USD, for the whole build (or the rent, with cloud)
    gpus: int | None = None              # exactly this many of each candidate
    max_gpus: int | None = None          # 1, 2, 4, … up to this many of each candidate
    hours: float | None = None           # the horizon: each option trains this long
    epochs: float | None = None          # or the work: epochs over dataset_size samples
    dataset_size: int | None = None
    candidates: tuple[str, ...] = ()     # catalog GPU names (default: the recent generations with a price)
    clusters: tuple[str, ...] = ()       # whole clusters, as predict takes them (descriptions or spec files)
    cloud: bool = False
    objective: str = "cost"
    price_per_kwh: float = DEFAULT_PRICE_PER_KWH
    prices: tuple[str, ...] = ()         # --price "NAME=USD" (or "NAME=USD/h" for a cloud GPU-hour)
    prices_file: str | None = None

    def __post_init__(self):
        """No optimizer named: the model's usual one (:func:`gpurig.models.default_optimizer`)."""
        if self.optimizer is None:
            from gpurig.models import default_optimizer

            object.__setattr__(self, "optimizer", default_optimizer(self.model))


def check(request: ChooseRequest) -> None:
    """Refuse, in one line, a request that cannot be ranked.

    >>> check(ChooseRequest(model="resnet50", gpus=2, max_gpus=4))
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: give --gpus N or --max-gpus N, not both
    >>> check(ChooseRequest(model="resnet50", epochs=3))
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --epochs needs --dataset-size (samples per epoch)
    """
    if request.objective not in OBJECTIVES:
        raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {request.objective!r}")
    check_batch(request.batch)
    check_optimizer(request.optimizer, request.optimizer_impl)
    if request.gpus is not None and request.max_gpus is not None:
        raise UsageError("give --gpus N or --max-gpus N, not both")
    for flag, value in (("--gpus", request.gpus), ("--max-gpus", request.max_gpus)):
        if value is not None and not 1 <= value <= MAX_GPUS_IN_A_BOX:
            raise UsageError(f"{flag} must be 1 to {MAX_GPUS_IN_A_BOX}: a candidate is one machine (give --cluster "
                             f"'2 nodes x 8 ..., InfiniBand HDR' for several), got {value}")
        if value is not None and request.clusters and not request.candidates:
            raise UsageError(f"{flag} counts the candidate GPUs, and --cluster gives whole clusters: add "
                             "--candidates, or leave it out")
    cloud_rates = [price for price in request.prices if price.strip().endswith("/h")]
    if cloud_rates and not request.cloud:
        raise UsageError(f"--price {cloud_rates[0]}: a rate per GPU-hour is what renting costs: add --cloud, or "
                         "give the price to buy it (NAME=USD)")
    if request.hours is not None and (request.epochs is not None or request.dataset_size is not None):
        raise UsageError("give --hours H or --epochs E --dataset-size S, not both")
    if (request.epochs is None) != (request.dataset_size is None):
        raise UsageError("--epochs needs --dataset-size (samples per epoch)" if request.epochs is not None else
                         "--dataset-size needs --epochs")
    for flag, value, top in (("--hours", request.hours, 1e6), ("--epochs", request.epochs, 1e6),
                             ("--dataset-size", request.dataset_size, 1e13), ("--budget", request.budget, 1e10)):
        if value is not None and not 0 < value <= top:
            raise UsageError(f"{flag} must be positive, at most {top:g}, got {value:g}")
    if request.epochs is not None and request.epochs * request.dataset_size < 1:
        raise UsageError(f"--epochs {request.epochs:g} of --dataset-size {request.dataset_size} is less than one "
                         "sample of work")
    if not 0 <= request.price_per_kwh <= 100:
        raise UsageError(f"--price-per-kwh must be 0 to 100, got {request.price_per_kwh:g}")


def counts(request: ChooseRequest) -> list[int]:
    """The GPU counts each candidate is priced at: ``--gpus N`` alone, else 1, 2, 4, … up to ``--max-gpus``.

    >>> counts(ChooseRequest(model="m")), counts(ChooseRequest(model="m", max_gpus=6)), counts(ChooseRequest(model="m", gpus=3))
    ([1, 2, 4], [1, 2, 4, 6], [3])
    """
    if request.gpus is not None:
        return [request.gpus]
    top = request.max_gpus or DEFAULT_MAX_GPUS
    return sorted({*[2**i for i in range(7) if 2**i <= top], top})


def work_of(request: ChooseRequest) -> dict:
    """The work each option is priced for: a number of hours, or epochs over a data set (``--json``'s ``work``).

    >>> work_of(ChooseRequest(model="m")), work_of(ChooseRequest(model="m", epochs=2, dataset_size=10))["samples"]
    ({'mode': 'hours', 'hours': 336.0}, 20)
    """
    if request.epochs is not None:
        return {"mode": "epochs", "epochs": request.epochs, "dataset_size": request.dataset_size,
                "samples": request.epochs * request.dataset_size}
    return {"mode": "hours", "hours": request.hours or DEFAULT_HOURS}
