"""Checkpoints that are never half-written and load without running code.

A checkpoint is written to a temporary file in the same directory, flushed to
disk, then renamed over the old one: a crash leaves either the old or the new
file, never a torn one. Loading uses ``torch.load(weights_only=True)``, which
unpickles tensors and plain containers only.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, unreadable or not a gpurig checkpoint."""


def save(path: str | os.PathLike, state: dict) -> Path:
    """Write ``state`` to ``path`` atomically (temporary file, fsync, rename).

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


def load(path: str | os.PathLike) -> dict:
    """Read a checkpoint written by :func:`save`; no code in the file is executed.

    >>> path = save("/tmp/ck.pt", {"epoch": 1})
    >>> load(path)["epoch"]
    1
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {str(e).splitlines()[0]}") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a gpurig checkpoint")
    return state
