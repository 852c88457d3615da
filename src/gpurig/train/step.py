"""One optimizer step of ``gpurig train``: K micro-batches (gradients averaged on the last only), autocast, the step.

``--accumulate K`` cuts each rank's part of the global batch into K micro-batches.
Each one's loss is weighted by its share of the samples, so the accumulated
gradient is the mean over the whole batch — the same update as one step on all
of it, with a K-th of the activations in memory. The first K-1 backward passes
run inside ``DataParallel.no_sync()``: no communication until the last, as DDP
and Horovod's ``backward_passes_per_step`` do.

>>> model = torch.nn.Linear(4, 3); optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
>>> x, y = torch.randn(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
>>> outcome = train_step(model, None, optimizer, x, y, accumulate=2, mixed=MixedPrecision("fp32"))
>>> outcome.stepped, round(outcome.loss, 4) == round(outcome.loss, 4)
(True, True)
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpurig.parallel.mixed_precision import MixedPrecision


@dataclass
class StepOutcome:
    """What one optimizer step did: its loss (mean over this rank's samples), how many it got right, whether the
    weights changed (an fp16 overflow or ``--on-nonfinite skip`` leaves them alone)."""

    loss: float
    correct: int
    samples: int
    stepped: bool


def micro_batches(x: torch.Tensor, y: torch.Tensor, accumulate: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's batch cut into ``accumulate`` nearly equal micro-batches (none empty).

    >>> [len(b) for _, b in micro_batches(torch.zeros(10, 2), torch.zeros(10), 3)]
    [4, 3, 3]
    """
    return [(a, b) for a, b in zip(torch.tensor_split(x, accumulate), torch.tensor_split(y, accumulate)) if len(b)]


def train_step(wrapped: torch.nn.Module, dp, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               accumulate: int, mixed: MixedPrecision, timeline=None) -> StepOutcome:
    """Forward and backward over ``accumulate`` micro-batches of ``(x, y)``, then ``optimizer``'s step.

    ``dp`` is the :class:`~gpurig.parallel.DataParallel` that averages the
    gradients (None when nothing does): all but the last micro-batch run in its
    ``no_sync()``. ``mixed`` autocasts the forward passes and, for fp16, scales the
    loss and decides (with the other ranks) whether the step is taken. ``timeline``
    (a :class:`~gpurig.parallel.timeline.Timeline`, or None) records forward,
    backward and optimizer back to back, so they tile the step.
    """
    parts = micro_batches(x, y, accumulate)
    clock = time.perf_counter() if timeline is not None else 0.0
    loss_sum = correct = None
    for i, (xs, ys) in enumerate(parts):
        quiet = dp.no_sync() if dp is not None and i < len(parts) - 1 else contextlib.nullcontext()
        with quiet:
            with mixed.autocast():
                logits = wrapped(xs)
                loss = F.cross_entropy(logits.float(), ys)
                if len(parts) > 1:  # the micro-batch's mean weighted by its share: the sum is the batch's mean
                    loss = loss * (len(ys) / len(y))
            if timeline is not None:
                clock = _record(timeline, "forward", clock)
            mixed.scale(loss).backward()
            if timeline is not None:
                clock = _record(timeline, "backward", clock)
        right = (logits.detach().argmax(1) == ys).sum()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        correct = right if correct is None else correct + right
    stepped = mixed.step(optimizer, wrapped) if (dp is None or dp.finite) else False
    # one read for both: on a GPU each read waits for the device to finish the step
    loss_value, right_value = torch.stack([loss_sum.double(), correct.double()]).tolist()
    outcome = StepOutcome(loss_value, int(right_value), len(y), stepped)
    if timeline is not None:
        _record(timeline, "optimizer", clock)
    return outcome


def _record(timeline, phase: str, since: float) -> float:
    """``phase`` from ``since`` to now on the timeline (backward less the waits inside it); returns now."""
    now = time.perf_counter()
    timeline.add_around_waits(phase, since, now)
    return now
