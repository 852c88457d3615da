"""Files written whole: a temporary file beside the target, renamed over it once complete.

A reader (a resumed run, a trace viewer, another rank) never sees half a file,
and a crash leaves the last whole one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def temporary_beside(path: Path, suffix: str = "") -> tuple[int, str]:
    """An open temporary file in ``path``'s directory, to be renamed over ``path``: (descriptor, name).

    Its mode is what a new file gets (0666 less the umask), not ``mkstemp``'s 0600: a checkpoint or a trace is
    read by the run's other users as its log and metrics are.

    >>> fd, name = temporary_beside(Path("/tmp/x.json")); os.close(fd)
    >>> oct(os.stat(name).st_mode & 0o777) == oct(0o666 & ~current_umask()); os.unlink(name)
    True
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.fchmod(fd, 0o666 & ~current_umask())
    return fd, tmp


def current_umask() -> int:
    """This process's umask (read by setting it and back: there is no other way).

    >>> 0 <= current_umask() <= 0o777
    True
    """
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
