"""What a rank measures of its steps, and how rank 0 reports it: the step split and the event log.

The split is ``gpurig predict``'s terms (compute, communication not hidden
under backward, waiting for slower ranks, data loading), so the measured and
predicted steps sit side by side.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import torch


class EventLog:
    """Rank 0's progress as JSON lines (a file the launcher follows), or nothing on other ranks."""

    def __init__(self, path: str | None, enabled: bool):
        self._file = open(path, "a") if (path and enabled) else None
        self._last_step = 0.0

    def emit(self, kind: str, **fields) -> None:
        if self._file is None:
            return
        if kind == "step":
            now = time.monotonic()
            if now - self._last_step < 0.1 and not fields.get("last"):
                return
            self._last_step = now
        self._file.write(json.dumps({"event": kind, **fields}) + "\n")
        self._file.flush()


@dataclass
class StepSplit:
    """Seconds spent in each part of the training steps of one epoch, on one rank."""

    compute: float = 0.0
    exposed: float = 0.0
    data: float = 0.0

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor([self.compute, self.exposed, self.data], dtype=torch.float64)


def split_across_ranks(per_rank: torch.Tensor, steps: int) -> dict[str, float]:
    """Milliseconds per step of compute, unhidden communication, waiting and data, averaged over ranks.

    ``per_rank`` holds one row ``[compute, exposed, data]`` (seconds) per rank.
    The end of backward waits (``exposed``) both for the network and for slower
    ranks; the part explained by this rank computing faster than the slowest
    one is waiting, the rest is communication.

    >>> split_across_ranks(torch.tensor([[1.0, 0.5, 0.0], [0.8, 0.7, 0.0]], dtype=torch.float64), steps=10)
    {'compute_ms': 90.0, 'comm_ms': 50.0, 'wait_ms': 10.0, 'data_ms': 0.0}
    """
    compute, exposed, data = per_rank[:, 0], per_rank[:, 1], per_rank[:, 2]
    waiting = torch.minimum(exposed, compute.max() - compute)
    per_step = 1000.0 / max(steps, 1)
    return {
        "compute_ms": round(compute.mean().item() * per_step, 3),
        "comm_ms": round((exposed - waiting).mean().item() * per_step, 3),
        "wait_ms": round(waiting.mean().item() * per_step, 3),
        "data_ms": round(data.mean().item() * per_step, 3),
    }
