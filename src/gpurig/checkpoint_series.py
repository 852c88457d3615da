"""A directory of checkpoints, one per epoch: the last few kept, the newest good one found on resume.

``checkpoint-epoch3.pt`` is the state after epoch 3, written atomically with its
checksum (:mod:`gpurig.checkpoint`); ``latest`` names the newest, also written
atomically. The last ``keep`` checkpoints stay (and any per-rank files of the
same epochs, ``feedback-rank1-epoch3.pt``); older ones go. On resume the newest
checkpoint that verifies is used: a truncated or corrupt one is reported and
the one before it taken, so a crash while writing, or a damaged disk block,
costs at most the epochs since the previous good checkpoint.

>>> import tempfile; d = tempfile.mkdtemp()
>>> _ = save_epoch(d, 1, {"epoch": 1}); _ = save_epoch(d, 2, {"epoch": 2})
>>> _ = open(epoch_path(d, 2), "r+b").truncate(50)
>>> state, path, problems = load_newest(d)
>>> state["epoch"], len(problems)
(1, 1)
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from gpurig.checkpoint import CheckpointError, load, save

LATEST = "latest"
KEEP = 3
_EPOCH_FILE = re.compile(r"(.+)-epoch(\d+)\.pt")


def epoch_path(directory: str | os.PathLike, epoch: int, stem: str = "checkpoint") -> Path:
    """Where the state after ``epoch`` lives (``stem`` for per-rank files such as ``feedback-rank1``).

    >>> epoch_path("runs/train", 3).name, epoch_path("runs/train", 3, "feedback-rank1").name
    ('checkpoint-epoch3.pt', 'feedback-rank1-epoch3.pt')
    """
    return Path(directory) / f"{stem}-epoch{epoch}.pt"


def saved_epochs(directory: str | os.PathLike) -> list[int]:
    """The epochs with a checkpoint file in ``directory``, newest first (good or not).

    >>> saved_epochs("/nonexistent")
    []
    """
    found = []
    for path in Path(directory).glob("checkpoint-epoch*.pt"):
        match = _EPOCH_FILE.fullmatch(path.name)
        if match and match.group(1) == "checkpoint":
            found.append(int(match.group(2)))
    return sorted(found, reverse=True)


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_epoch(directory: str | os.PathLike, epoch: int, state: dict, keep: int = KEEP) -> Path:
    """Write the checkpoint of ``epoch``, point ``latest`` at it, and drop what is older than the last ``keep``.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> [save_epoch(d, e, {"epoch": e}, keep=2).name for e in (1, 2, 3)][-1], saved_epochs(d)
    ('checkpoint-epoch3.pt', [3, 2])
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    path = save(epoch_path(directory, epoch), state)
    _write_atomically(Path(directory) / LATEST, path.name + "\n")
    kept = set(saved_epochs(directory)[:keep])
    for old in Path(directory).glob("*-epoch*.pt"):
        match = _EPOCH_FILE.fullmatch(old.name)
        if match and int(match.group(2)) not in kept:
            old.unlink(missing_ok=True)
    return path


def clear(directory: str | os.PathLike) -> None:
    """Remove a series' files (a fresh run starts a new series; epochs must grow within one).

    >>> import tempfile; d = tempfile.mkdtemp(); _ = save_epoch(d, 1, {}); clear(d); saved_epochs(d)
    []
    """
    directory = Path(directory)
    for path in [*directory.glob("*-epoch*.pt"), directory / LATEST]:
        if path.name == LATEST or _EPOCH_FILE.fullmatch(path.name):
            path.unlink(missing_ok=True)


def load_newest(directory: str | os.PathLike) -> tuple[dict, Path, list[str]]:
    """The newest checkpoint that verifies: (its state, its path, one line per newer one that did not).

    Raises :class:`CheckpointError` when there is none.

    >>> import tempfile; d = tempfile.mkdtemp(); _ = save_epoch(d, 1, {"epoch": 1})
    >>> load_newest(d)[0]["epoch"], load_newest(d)[2]
    (1, [])
    """
    problems = []
    for epoch in saved_epochs(directory):
        path = epoch_path(directory, epoch)
        try:
            return load(path), path, problems
        except CheckpointError as error:
            problems.append(str(error))
    if problems:
        raise CheckpointError(f"no good checkpoint in {directory}: {'; '.join(problems)}")
    raise CheckpointError(f"no checkpoint in {directory}")


def damaged(directory: str | os.PathLike) -> dict[str, str]:
    """Every checkpoint file in ``directory`` that does not verify, with what is wrong (per-rank files too).

    >>> import tempfile; d = tempfile.mkdtemp(); _ = save_epoch(d, 1, {}); damaged(d)
    {}
    """
    from gpurig.checkpoint import verify

    found = {}
    for path in sorted(Path(directory).glob("*-epoch*.pt")):
        try:
            verify(path)
        except CheckpointError as error:
            found[path.name] = str(error)
    return found
