"""How a rank's end is described and recorded, so the launcher can name the first failure."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path


def describe_exit(returncode: int) -> str:
    """``'exited with code 3'`` or ``'was killed by SIGKILL'`` for a subprocess return code.

    >>> describe_exit(-9)
    'was killed by SIGKILL'
    >>> describe_exit(3)
    'exited with code 3'
    """
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def shell_code(returncode: int) -> int:
    """A subprocess return code as a process exit status (128 + signal for a killed child).

    >>> shell_code(-9), shell_code(3)
    (137, 3)
    """
    return returncode if returncode >= 0 else 128 - returncode


def record_failure(status_dir: str | None, rank: int | None, host: str, returncode: int) -> None:
    """Leave ``rank-<r>.json`` in the launcher's status directory (when it is on this machine)."""
    if status_dir and os.path.isdir(status_dir):
        path = Path(status_dir) / f"rank-{rank}.json"
        path.write_text(json.dumps({"rank": rank, "host": host, "returncode": returncode, "time": time.time()}))


def first_failure(status_dir: str | os.PathLike) -> dict | None:
    """The earliest failure recorded in ``status_dir``, or None."""
    reports = []
    for path in Path(status_dir).glob("rank-*.json"):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return min(reports, key=lambda r: r["time"]) if reports else None
