"""Where ``gpurig train``'s model comes from: a reference one by name, or the user's ``module:factory``.

The data's counterpart is :func:`gpurig.train.data.load`.
"""

from __future__ import annotations

import torch

from gpurig import models


def is_users(name: str) -> bool:
    """Whether ``--model`` / ``--data`` names the user's own ``module:function`` rather than a reference one.

    >>> is_users("mnist"), is_users("my_pkg.data:load")
    (False, True)
    """
    return ":" in name


def build_model(name: str) -> torch.nn.Module:
    """A reference model by name (``mlp``, ``cnn``, ``wide-cnn``), or the user's from ``module:factory``, with its
    initial weights (seed first: every rank builds the same).

    >>> type(build_model("mlp")).__name__, type(build_model("torch.nn:Flatten")).__name__
    ('Sequential', 'Flatten')
    """
    return models.load_factory(name, device=None) if is_users(name) else models.build(name)
