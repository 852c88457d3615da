"""The numerical guard: NaN or Inf in the averaged gradients, found with one reduction per bucket.

After the allreduce every rank holds the same averaged gradients, so every
rank reaches the same verdict without exchanging a byte. A NaN or an Inf
anywhere makes a bucket's sum NaN or Inf; only then are the bucket's parameters
looked at one by one to name the first bad one (a sum that overflowed from
finite values is recognised there and let through).

DataParallel looks earlier where it can, at no extra pass: while each rank
copies its gradients into a bucket (:func:`copy_flagged`) it notes whether any
input is NaN, Inf or large enough (2^119) that an average could overflow, and
that note travels in one extra element of the bucket's own allreduce. Only a
bucket some rank flagged is then read again, averaged, as above; every rank
reads the same summed note, so all reach the same verdict.

What happens then is the caller's choice (``DataParallel(nonfinite=...)``):
``stop`` raises :class:`NonFiniteGradientError`, ``skip`` drops the step's
gradients so that the optimizer's next ``step()`` changes nothing, ``ignore``
does not look.
"""

from __future__ import annotations

import torch

from gpurig.parallel import native

ACTIONS = ("stop", "skip", "ignore")
FLAG_LIMIT = 2.0 ** 119  # an input this large may overflow the average (of up to 2^8 ranks); smaller ones cannot


class NonFiniteGradientError(FloatingPointError):
    """An averaged gradient holds NaN or Inf (raised on every rank, from ``backward()``).

    ``step`` (the data-parallel step, from 1), ``parameter`` and ``kind`` (``"NaN"`` or ``"Inf"``) say where.

    >>> error = NonFiniteGradientError("bad", step=3, parameter="fc.weight", kind="NaN")
    >>> error.step, error.parameter, error.kind
    (3, 'fc.weight', 'NaN')
    """

    def __init__(self, message: str, step: int | None = None, parameter: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.step, self.parameter, self.kind = step, parameter, kind


class NonFiniteGradientWarning(UserWarning):
    """A step was skipped because an averaged gradient held NaN or Inf."""


def check_action(action: str) -> str:
    """``action`` if it is one of :data:`ACTIONS`, else a ValueError naming them.

    >>> check_action("skip")
    'skip'
    """
    if action not in ACTIONS:
        raise ValueError(f"nonfinite must be one of {', '.join(ACTIONS)}, got {action!r}")
    return action


def all_finite(flats: list[torch.Tensor]) -> bool:
    """Whether every element of every tensor is finite, judged by one sum per tensor (a bad sum is checked again).

    >>> all_finite([torch.ones(4), torch.zeros(2)]), all_finite([torch.tensor([1.0, float("nan")])])
    (True, False)
    >>> all_finite([torch.full((4,), 3e38)])       # the sum overflows; the values are finite
    True
    """
    if not flats:
        return True
    sums = torch.stack([flat.sum() for flat in flats])
    if bool(torch.isfinite(sums).all()):
        return True
    return all(bool(torch.isfinite(flat).all()) for flat in flats)


def first_nonfinite(named: list[tuple[str, torch.Tensor]]) -> tuple[str, str] | None:
    """The first ``(name, "NaN" | "Inf")`` among named gradients, or None.

    >>> first_nonfinite([("w", torch.ones(2)), ("b", torch.tensor([float("inf")]))])
    ('b', 'Inf')
    """
    for name, grad in named:
        if grad is None or bool(torch.isfinite(grad).all()):
            continue
        return name, "NaN" if bool(torch.isnan(grad).any()) else "Inf"
    return None


def copy_flagged(grad: torch.Tensor, out: torch.Tensor, scale: float, flag: torch.Tensor) -> None:
    """``out = grad * scale``, adding 1 to ``flag`` (one element) where ``grad`` holds NaN, Inf or a magnitude of
    :data:`FLAG_LIMIT` or more: one pass in C on host memory, a max-norm beside the multiply elsewhere.

    >>> out, flag = torch.empty(3), torch.zeros(1)
    >>> copy_flagged(torch.tensor([1.0, 2.0, 4.0]), out, 0.5, flag); out.tolist(), flag.item()
    ([0.5, 1.0, 2.0], 0.0)
    >>> copy_flagged(torch.tensor([1.0, float("inf"), 4.0]), out, 0.5, flag); flag.item()
    1.0
    """
    lib = native.library() if (grad.device.type == "cpu" and grad.dtype == out.dtype == torch.float32
                               and grad.is_contiguous() and out.is_contiguous()) else None
    if lib is not None:
        if lib.scale_copy_flag(grad.data_ptr(), out.data_ptr(), grad.numel(), scale):
            flag += 1
        return
    torch.mul(grad.reshape(-1), scale, out=out)
    largest = torch.linalg.vector_norm(grad.detach().reshape(-1).float(), float("inf"))
    flag.add_(torch.logical_not(largest < FLAG_LIMIT).to(flag.dtype))  # NaN compares False: flagged (no sync)
