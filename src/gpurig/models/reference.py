"""Reference models for ``gpurig train`` and the benchmarks.

``mlp`` is the source's MNIST network, 784-1200-1200-10 (2.4 M parameters, 9.6
MB of fp32 gradients: large enough that a 1 Gbit/s network, not the CPU, limits
data parallelism). ``cnn`` is a small LeNet-style convolutional net (0.3 M
parameters), compute-heavy for its size.
"""

from __future__ import annotations

import torch  # noqa: F401 (docstring examples)
from torch import nn


def mlp(inputs: int = 784, hidden: int = 1200, classes: int = 10) -> nn.Module:
    """The source's MNIST net: two hidden layers of 1200 ReLU units.

    >>> sum(p.numel() for p in mlp().parameters())
    2395210
    """
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(inputs, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def cnn(classes: int = 10, hidden: int = 256) -> nn.Module:
    """A LeNet-style net for 28×28 grey images: two 5×5 convolutions, two dense layers.

    ``hidden`` widens the first dense layer: at 4096 (4.2 M parameters, 97 % of
    the net) it is AlexNet-like, a small convolutional front with a large fully
    connected head — the model Krizhevsky's hybrid scheme is for.

    >>> cnn()(torch.zeros(2, 784)).shape
    torch.Size([2, 10])
    """
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 4 * 4, hidden), nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def wide_cnn(classes: int = 10) -> nn.Module:
    """:func:`cnn` with a 4096-unit dense layer (4.3 M parameters, 98 % in the dense head): ``--model wide-cnn``,
    the model for which model and hybrid parallelism beat data parallelism on a slow link (docs/benchmarks.md).

    >>> sum(p.numel() for p in wide_cnn().parameters())
    4291466
    """
    return cnn(classes, hidden=4096)
