"""Checkpoints: files that are never half-written and say when they are damaged, and the series of them a run keeps.

One file
--------

A checkpoint is written to a temporary file in the same directory, flushed to
disk, then renamed over the old one: a crash leaves either the old or the new
file, never a torn one. The file is what ``torch.save`` writes followed by one
line, ``#gpurig-checkpoint sha256=<hex> bytes=<n>``, which ``torch.load`` ignores
(so the file still loads with plain torch) and :func:`load` checks: a truncated
file, a flipped bit or bytes appended are reported as such, in one line.
Loading uses ``torch.load(weights_only=True)``, which unpickles tensors and plain
containers only: a file crafted to run code is refused.

The series
----------

``checkpoint-epoch3.pt`` is the state after epoch 3, ``checkpoint-epoch4-step5.pt``
the state after step 5 of epoch 4 (``gpurig train --checkpoint-every``), each written
atomically with its checksum; ``latest`` names the newest, also written
atomically. The last ``keep`` checkpoints stay (and any per-rank files of the
same epochs, ``feedback-rank1-epoch3.pt``); older ones go. On resume the newest
checkpoint that verifies is used: a truncated or corrupt one is reported and
the one before it taken, so a crash while writing, or a damaged disk block,
costs at most the steps since the previous good checkpoint.

>>> import tempfile; d = tempfile.mkdtemp()
>>> _ = save_epoch(d, 1, {"epoch": 1}); _ = save_epoch(d, 2, {"epoch": 2})
>>> _ = open(epoch_path(d, 2), "r+b").truncate(50)
>>> state, path, problems = load_newest(d)
>>> state["epoch"], len(problems)
(1, 1)
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from gpurig.files import temporary_beside

_TRAILER = re.compile(rb"\n#gpurig-checkpoint sha256=([0-9a-f]{64}) bytes=(\d{20})\n\Z")
_TRAILER_BYTES = len(b"\n#gpurig-checkpoint sha256= bytes=\n") + 64 + 20
_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, damaged, unsafe or not a gpurig checkpoint."""


def _digest(path: Path, length: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = length
        while left > 0:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def save(path: str | os.PathLike, state: dict) -> Path:
    """Write ``state`` to ``path`` atomically (temporary file, checksum line, fsync, rename).

    >>> save("/tmp/ck.pt", {"epoch": 1, "model": {"w": torch.ones(2)}})
    PosixPath('/tmp/ck.pt')
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temporary_beside(path, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            length = f.tell()
            f.write(b"\n#gpurig-checkpoint sha256=%s bytes=%020d\n" % (_digest(Path(tmp), length).encode(), length))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def verify(path: str | os.PathLike) -> None:
    """Raise :class:`CheckpointError` saying what is wrong with ``path``'s bytes; return if its checksum holds.

    >>> verify(save("/tmp/ck.pt", {"epoch": 1}))
    >>> _ = open("/tmp/ck.pt", "r+b").truncate(100)
    >>> verify("/tmp/ck.pt")
    Traceback (most recent call last):
    ...
    gpurig.train.checkpoints.CheckpointError: /tmp/ck.pt has no gpurig checksum line: it was cut short, or not written by gpurig
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - _TRAILER_BYTES))
        match = _TRAILER.search(f.read())
    if match is None:
        raise CheckpointError(f"{path} has no gpurig checksum line: it was cut short, or not written by gpurig")
    expected, length = match.group(1).decode(), int(match.group(2))
    if length != size - _TRAILER_BYTES:
        raise CheckpointError(f"{path} holds {size - _TRAILER_BYTES} bytes before its checksum line, "
                              f"which says {length}: it was cut or added to")
    if _digest(path, length) != expected:
        raise CheckpointError(f"{path} is corrupt: its SHA-256 does not match the one written with it")


def load(path: str | os.PathLike) -> dict:
    """Read a checkpoint written by :func:`save` after :func:`verify`; no code in the file is executed.

    >>> path = save("/tmp/ck.pt", {"epoch": 1})
    >>> load(path)["epoch"]
    1
    """
    path = Path(path)
    verify(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        reason = str(e).strip().strip("'").splitlines()
        unsafe = next((line.strip() for line in reason if "unsupported global" in line.lower()), None)
        if unsafe or "Weights only load failed" in str(e):
            unsafe = unsafe or "a type outside tensors and plain containers"
            raise CheckpointError(f"{path} was refused: it asks to run code or build objects a checkpoint may "
                                  f"not ({unsafe.rstrip('.')})") from e
        raise CheckpointError(f"cannot read checkpoint {path}: {reason[0] if reason else e!r}") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a gpurig checkpoint")
    return state


# -- the series of a run: one checkpoint per epoch (and every --checkpoint-every steps), the last few kept ----

LATEST = "latest"
CHECKPOINT_FORMAT = "gpurig-train/1"  # what gpurig train's checkpoints say they are (their "format")
KEEP = 3
_FILE = re.compile(r"(?P<stem>.+?)-epoch(?P<epoch>\d+)(?:-step(?P<step>\d+))?\.pt")


@dataclass(frozen=True, order=True)
class Position:
    """Where in a run a checkpoint was taken: ``epochs`` finished, then ``step`` steps of the next epoch.

    Positions sort in the order of the run. The file of epoch 3's end is ``checkpoint-epoch3.pt``; the one
    taken after step 5 of epoch 4 (``Position(3, 5)``) is ``checkpoint-epoch4-step5.pt``.

    >>> sorted([Position(3, 5), Position(4), Position(3)])
    [Position(epochs=3, step=0), Position(epochs=3, step=5), Position(epochs=4, step=0)]
    >>> str(Position(3)), str(Position(3, 5))
    ('the end of epoch 3', 'step 5 of epoch 4')
    """

    epochs: int
    step: int = 0

    def __str__(self) -> str:
        return f"step {self.step} of epoch {self.epochs + 1}" if self.step else f"the end of epoch {self.epochs}"

    def global_step(self, steps_per_epoch: int) -> int:
        """Steps of the run done at this position (``Position(1, 2).global_step(7)`` is 9)."""
        return self.epochs * steps_per_epoch + self.step


def checkpoint_path(directory: str | os.PathLike, position: Position, stem: str = "checkpoint") -> Path:
    """Where the state at ``position`` lives (``stem`` for per-rank files such as ``feedback-rank1``).

    >>> checkpoint_path("runs/train", Position(3)).name, checkpoint_path("runs/train", Position(3, 5)).name
    ('checkpoint-epoch3.pt', 'checkpoint-epoch4-step5.pt')
    """
    if position.step:
        return Path(directory) / f"{stem}-epoch{position.epochs + 1}-step{position.step}.pt"
    return Path(directory) / f"{stem}-epoch{position.epochs}.pt"


def epoch_path(directory: str | os.PathLike, epoch: int, stem: str = "checkpoint") -> Path:
    """Where the state after ``epoch`` lives (``stem`` for per-rank files such as ``feedback-rank1``).

    >>> epoch_path("runs/train", 3).name, epoch_path("runs/train", 3, "feedback-rank1").name
    ('checkpoint-epoch3.pt', 'feedback-rank1-epoch3.pt')
    """
    return checkpoint_path(directory, Position(epoch), stem)


def _position(name: str) -> tuple[str, Position] | None:
    """The stem and position a checkpoint file's name says, or None for another file."""
    match = _FILE.fullmatch(name)
    if match is None:
        return None
    epoch, step = int(match.group("epoch")), int(match.group("step") or 0)
    return match.group("stem"), (Position(epoch - 1, step) if step else Position(epoch))


def saved(directory: str | os.PathLike) -> list[Position]:
    """The positions with a checkpoint file in ``directory``, newest first (good or not; epochs' ends and
    ``--checkpoint-every``'s steps).

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> _ = save_checkpoint(d, Position(1), {}); _ = save_checkpoint(d, Position(1, 4), {}); saved(d)
    [Position(epochs=1, step=4), Position(epochs=1, step=0)]
    """
    found = []
    for path in Path(directory).glob("checkpoint-epoch*.pt"):
        named = _position(path.name)
        if named and named[0] == "checkpoint":
            found.append(named[1])
    return sorted(found, reverse=True)


def saved_epochs(directory: str | os.PathLike) -> list[int]:
    """The epochs with an end-of-epoch checkpoint file in ``directory``, newest first (good or not).

    >>> saved_epochs("/nonexistent")
    []
    """
    return [position.epochs for position in saved(directory) if not position.step]


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = temporary_beside(path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(directory: str | os.PathLike, position: Position, state: dict, keep: int = KEEP) -> Path:
    """Write the checkpoint at ``position``, point ``latest`` at it, and drop what is older than the last ``keep``
    (per-rank files of the dropped positions with them).

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> [save_checkpoint(d, Position(0, s), {}, keep=2).name for s in (2, 4)][-1], saved(d)
    ('checkpoint-epoch1-step4.pt', [Position(epochs=0, step=4), Position(epochs=0, step=2)])
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    path = save(checkpoint_path(directory, position), state)
    _write_atomically(Path(directory) / LATEST, path.name + "\n")
    kept = set(saved(directory)[:keep])
    for old in Path(directory).glob("*-epoch*.pt"):
        named = _position(old.name)
        if named and named[1] not in kept:
            old.unlink(missing_ok=True)
    return path


def save_epoch(directory: str | os.PathLike, epoch: int, state: dict, keep: int = KEEP) -> Path:
    """Write the checkpoint of ``epoch``, point ``latest`` at it, and drop what is older than the last ``keep``.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> [save_epoch(d, e, {"epoch": e}, keep=2).name for e in (1, 2, 3)][-1], saved_epochs(d)
    ('checkpoint-epoch3.pt', [3, 2])
    """
    return save_checkpoint(directory, Position(epoch), state, keep)


def clear(directory: str | os.PathLike) -> None:
    """Remove a series' files (a fresh run starts a new series; positions must grow within one), and what a write
    cut short left (:func:`remove_leftovers`).

    >>> import tempfile; d = tempfile.mkdtemp(); _ = save_epoch(d, 1, {}); clear(d); saved_epochs(d)
    []
    """
    directory = Path(directory)
    for path in [*directory.glob("*-epoch*.pt"), directory / LATEST]:
        if path.name == LATEST or _position(path.name):
            path.unlink(missing_ok=True)
    remove_leftovers(directory)


def remove_leftovers(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of writes a crash cut short (:func:`save` renames a whole file into place, so
    one is never a checkpoint); return them. Only while no run writes to ``directory`` (:func:`lock`).

    >>> import tempfile; d = Path(tempfile.mkdtemp()); _ = (d / ".checkpoint-epoch1.pt.x1y2.tmp").write_bytes(b"x")
    >>> [p.name for p in remove_leftovers(d)]
    ['.checkpoint-epoch1.pt.x1y2.tmp']
    """
    directory = Path(directory)
    left = [p for p in [*directory.glob(".*-epoch*.pt.*.tmp"), *directory.glob(f".{LATEST}.*")] if p.is_file()]
    for path in left:
        path.unlink(missing_ok=True)
    return left


class DirectoryInUse(CheckpointError):
    """Another run holds the checkpoint directory (:func:`lock`)."""


class lock:
    """Hold ``directory`` for one run while it is open: a second run on the same directory would clear or
    overwrite the first one's series. An advisory lock (``flock``) on ``.gpurig-lock`` in it, released when the
    holder exits, however it ends. Raises :class:`DirectoryInUse`, naming the holder's process, when taken.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> with lock(d):
    ...     lock(d).__enter__()
    Traceback (most recent call last):
    ...
    gpurig.train.checkpoints.DirectoryInUse: ... is in use by another gpurig train (process ...): give another --checkpoint-dir, or let that run end
    """

    FILE = ".gpurig-lock"

    def __init__(self, directory: str | os.PathLike):
        self.path = Path(directory) / self.FILE
        self._fd: int | None = None

    def __enter__(self) -> "lock":
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DirectoryInUse(f"{self.path.parent} is in use by another gpurig train (process {holder}): give "
                                 f"another --checkpoint-dir, or let that run end") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


def load_newest(directory: str | os.PathLike) -> tuple[dict, Path, list[str]]:
    """The newest checkpoint that verifies: (its state, its path, one line per newer one that did not).

    Raises :class:`CheckpointError` when there is none.

    >>> import tempfile; d = tempfile.mkdtemp(); _ = save_epoch(d, 1, {"epoch": 1})
    >>> load_newest(d)[0]["epoch"], load_newest(d)[2]
    (1, [])
    """
    problems = []
    for position in saved(directory):
        path = checkpoint_path(directory, position)
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
    found = {}
    for path in sorted(Path(directory).glob("*-epoch*.pt")):
        try:
            verify(path)
        except CheckpointError as error:
            found[path.name] = str(error)
    return found
