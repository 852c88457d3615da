"""A model and a data set of your own, trained by ``gpurig train`` with no gpurig code in them.

From this folder::

    gpurig train --model digits:build --data digits:load

``build`` returns a ``torch.nn.Module``; ``load`` returns ``(train, test)``, each a pair
``(inputs, labels)`` (tensors or arrays) or a ``torch.utils.data.Dataset``. The data: the
1,797 8x8 handwritten digits that ship inside scikit-learn (no download).
"""

import torch
from torch import nn


def build(hidden: int = 128) -> nn.Module:
    """A small MLP for 8x8 images: 64 inputs, 10 classes."""
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def load():
    """Every fifth image for testing, the rest for training; pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x, y = torch.tensor(images / 16.0, dtype=torch.float32), torch.tensor(labels)
    test = torch.arange(len(y)) % 5 == 0
    return (x[~test], y[~test]), (x[test], y[test])
