"""Checkpoints that are never half-written, say when they are damaged, and load without running code.

A checkpoint is written to a temporary file in the same directory, flushed to
disk, then renamed over the old one: a crash leaves either the old or the new
file, never a torn one. The file is what ``torch.save`` writes followed by one
line, ``#gpurig-checkpoint sha256=<hex> bytes=<n>``, which ``torch.load`` ignores
(so the file still loads with plain torch) and :func:`load` checks: a truncated
file, a flipped bit or bytes appended are reported as such, in one line.
Loading uses ``torch.load(weights_only=True)``, which unpickles tensors and plain
containers only: a file crafted to run code is refused.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

import torch

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
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
    gpurig.checkpoint.CheckpointError: /tmp/ck.pt has no gpurig checksum line: it was cut short, or not written by gpurig
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
