"""What a rank measures of its steps, and how rank 0 reports it: the step split, the event log, the metrics log.

The split is ``gpurig predict``'s terms (compute, communication not hidden
under backward, waiting for slower ranks, data loading), so the measured and
predicted steps sit side by side.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch


class EventLog:
    """Rank 0's progress as JSON lines (a file the launcher follows), or nothing on other ranks."""

    def __init__(self, path: str | None, enabled: bool, listener=None):
        self._file = open(path, "a") if (path and enabled) else None
        # a rank started by a launcher shows its own progress: the events go to its view in this process
        self._listener = listener if enabled else None
        self._last_step = 0.0

    def emit(self, kind: str, **fields) -> None:
        if self._file is None and self._listener is None:
            return
        if kind == "step":
            now = time.monotonic()
            if now - self._last_step < 0.1 and not fields.get("last"):
                return
            self._last_step = now
        if self._file is not None:
            self._file.write(json.dumps({"event": kind, **fields}) + "\n")
            self._file.flush()
        if self._listener is not None:
            self._listener({"event": kind, **fields})


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
    waiting = waiting_per_rank(per_rank)
    per_step = 1000.0 / max(steps, 1)
    return {
        "compute_ms": round(compute.mean().item() * per_step, 3),
        "comm_ms": round((exposed - waiting).mean().item() * per_step, 3),
        "wait_ms": round(waiting.mean().item() * per_step, 3),
        "data_ms": round(data.mean().item() * per_step, 3),
    }


def waiting_per_rank(per_rank: torch.Tensor) -> torch.Tensor:
    """Seconds each rank waited for slower ones: of its waits at the end of backward, the part explained by its
    computing faster than the slowest rank (``per_rank``: rows ``[compute, exposed, data]``).

    >>> [round(s, 6) for s in waiting_per_rank(torch.tensor([[1.0, 0.5, 0.0], [0.8, 0.7, 0.0]], dtype=torch.float64)).tolist()]
    [0.0, 0.2]
    """
    compute, exposed = per_rank[:, 0], per_rank[:, 1]
    return torch.minimum(exposed, compute.max() - compute)


def waiting_fraction(per_rank: torch.Tensor, rank: int) -> float:
    """The share of ``rank``'s waits at the end of backward that was waiting for slower ranks (the rest:
    communication), as :func:`split_across_ranks` splits them.

    >>> round(waiting_fraction(torch.tensor([[1.0, 0.5, 0.0], [0.8, 0.7, 0.0]], dtype=torch.float64), 1), 4)
    0.2857
    """
    exposed = per_rank[rank, 1].item()
    return waiting_per_rank(per_rank)[rank].item() / exposed if exposed > 0 else 0.0


METRICS_FILE = "metrics.jsonl"


def step_metrics(outcome, global_batch: int, seconds: float, exposed: float, data_s: float, bytes_sent: int,
                 codec: str, loss_scale: float | None = None) -> dict:
    """One step's line of ``metrics.jsonl``: ``outcome`` (a :class:`~gpurig.train.step.StepOutcome`, this rank's
    part of the batch), the step's seconds (``exposed`` of them waiting at the end of backward), the data's.

    >>> from gpurig.train.step import StepOutcome
    >>> step_metrics(StepOutcome(2.3, 16, 64, True), 128, 0.05, 0.01, 0.001, 4096, "int8")
    {'loss': 2.3, 'accuracy': 0.25, 'samples_per_s': 2560.0, 'compute_ms': 40.0, 'comm_wait_ms': 10.0, 'data_ms': 1.0, 'bytes_sent': 4096, 'codec': 'int8', 'stepped': True}
    """
    record = {"loss": round(outcome.loss, 6), "accuracy": round(outcome.correct / outcome.samples, 5),
              "samples_per_s": round(global_batch / max(seconds, 1e-12), 1),
              "compute_ms": round(1000 * (seconds - exposed), 3), "comm_wait_ms": round(1000 * exposed, 3),
              "data_ms": round(1000 * data_s, 3), "bytes_sent": bytes_sent, "codec": codec,
              "stepped": outcome.stepped}
    return record if loss_scale is None else {**record, "loss_scale": loss_scale}


class MetricsLog:
    """Rank 0's per-step and per-epoch metrics, where people look: ``metrics.jsonl`` beside the checkpoints (one
    JSON object a line) and, with ``logdir``, TensorBoard event files (``torch.utils.tensorboard``).

    A fresh run starts the file anew; a resumed one keeps the lines up to where it
    resumes (``first_epoch`` epochs and ``first_step`` steps done) and appends. Other ranks write nothing.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> log = MetricsLog(d, logdir=None, enabled=True, first_epoch=0)
    >>> log.step(epoch=1, step=1, loss=2.3, accuracy=0.1)
    >>> log.close(); open(f"{d}/metrics.jsonl").read()
    '{"kind": "step", "epoch": 1, "step": 1, "loss": 2.3, "accuracy": 0.1}\\n'
    """

    def __init__(self, directory: str, logdir: str | None, enabled: bool, first_epoch: int,
                 first_step: int | None = None):
        self._file = self._writer = None
        if not enabled:
            return
        path = Path(directory) / METRICS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if (first_epoch or first_step) and path.is_file():  # what was logged before the resumed-from checkpoint
            kept = [line for line, record in _records(path) if _before(record, first_epoch, first_step)]
        path.write_text("".join(line + "\n" for line in kept))
        self._file = open(path, "a")
        if logdir:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(logdir, purge_step=None)
        self._codec = None

    def step(self, epoch: int, step: int, **values) -> None:
        """One optimizer step (``step`` counted over the run, from 1): numbers, and ``codec`` when it changes."""
        self._write({"kind": "step", "epoch": epoch, "step": step, **values}, "step", step)

    def epoch(self, record: dict, step: int) -> None:
        """One epoch's record (``gpurig train``'s table row, plus whatever else it holds)."""
        self._write({"kind": "epoch", **record}, "epoch", step)

    def _write(self, record: dict, group: str, step: int) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._writer is None:
            return
        for key, value in record.items():
            if key in ("kind", "epoch", "step"):
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(f"{group}/{key}", value, step)
            elif key == "codec" and value != self._codec:
                self._writer.add_text("compression/codec", str(value), step)
                self._codec = value

    def close(self) -> None:
        """Flush and close the file and the event writer."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _before(record: dict, first_epoch: int, first_step: int | None) -> bool:
    """Whether a ``metrics.jsonl`` line was logged before the position a run resumes from (later ones are run again).

    >>> _before({"kind": "step", "epoch": 2, "step": 9}, 1, 10), _before({"kind": "epoch", "epoch": 2}, 1, 10)
    (True, False)
    """
    if record.get("kind") == "step" and first_step is not None:
        return record.get("step", 0) <= first_step
    return record.get("epoch", 0) <= first_epoch


def last_step(directory: str) -> int:
    """The last step rank 0 finished (counted over the run) by ``metrics.jsonl`` in ``directory``; 0 if none.

    >>> last_step("/nonexistent")
    0
    """
    path = Path(directory) / METRICS_FILE
    if not path.is_file():
        return 0
    last = 0
    for _, record in _records(path):
        if record.get("kind") == "step":
            last = record.get("step", last)
    return last


def _records(path: Path) -> list[tuple[str, dict]]:
    """Each line of a ``metrics.jsonl`` with its record; a line a failure cut short (or any that is not a JSON
    object) is left out: the run it came from is resumed, not its log."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append((line, record))
    return out
