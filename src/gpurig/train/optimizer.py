"""The optimizer ``gpurig train`` steps with (``--optimizer``, ``--lr``, ``--momentum``, ``--weight-decay``): torch.optim's,
with its defaults where the flag is left out.

The names are ``gpurig predict``'s (:mod:`gpurig.perf.optimizer`), so a run and its prediction price the same
update; LAMB, which predict prices, is not in torch.optim and is refused here.

>>> settings("adamw")
{'lr': 0.001, 'weight_decay': 0.01}
>>> build([torch.nn.Parameter(torch.zeros(2))], "momentum", settings("momentum"))
SGD (
...
    momentum: 0.9
...
)
"""

from __future__ import annotations

import torch

from gpurig.errors import UsageError

# name: (torch.optim class, its arguments left out: torch's defaults, but for SGD's the source's lr and momentum)
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.05, "weight_decay": 0.0}),
    "momentum": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0}),
    "adam": (torch.optim.Adam, {"lr": 1e-3, "weight_decay": 0.0}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 1e-2}),
}


def settings(name: str, lr: float | None = None, momentum: float | None = None,
             weight_decay: float | None = None) -> dict:
    """The arguments ``name`` is built with: those given, the defaults for the rest; one line for a flag this
    optimizer has no use for (taken, it would be ignored).

    >>> settings("momentum", lr=0.1)
    {'lr': 0.1, 'momentum': 0.9, 'weight_decay': 0.0}
    >>> settings("adam", momentum=0.9)
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --momentum is SGD's: use --optimizer momentum, or leave it out with --optimizer adam
    """
    check(name)
    if momentum is not None and name != "momentum":
        raise UsageError(f"--momentum is SGD's: use --optimizer momentum, or leave it out with --optimizer {name}")
    given = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
    return {key: default if given[key] is None else given[key] for key, default in OPTIMIZERS[name][1].items()}


def check(name: str) -> None:
    """Refuse an optimizer ``gpurig train`` cannot step with, in one line.

    >>> check("lamb")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --optimizer lamb: torch.optim has no LAMB (gpurig predict prices it); train with sgd, momentum, adam or adamw
    """
    if name == "lamb":
        raise UsageError("--optimizer lamb: torch.optim has no LAMB (gpurig predict prices it); train with "
                         "sgd, momentum, adam or adamw")
    if name not in OPTIMIZERS:
        raise UsageError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


def build(params, name: str, arguments: dict) -> torch.optim.Optimizer:
    """torch.optim's ``name`` over ``params`` with ``arguments`` (:func:`settings`)."""
    return OPTIMIZERS[name][0](params, **arguments)
