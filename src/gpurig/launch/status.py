"""Status files: each failing rank leaves one, so the launcher can name the first failure.

The launcher makes a directory and names it in ``GPURIG_RUN_STATUS_DIR``; a rank
wrapper whose command fails writes ``rank-<r>.json`` there (when the directory
exists on its host): ``{"rank", "host", "returncode", "signal", "time", "cause",
"during", "secondary"}``, with ``returncode`` as :mod:`subprocess` gives it
(negative: killed by that signal). A rank whose failure watch finds another rank
stopped writes that rank's file. The first failure is the earliest that is not
*secondary* (a collective that broke because a peer had gone is).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from gpurig.errors import RankFailed

STATUS_DIR_VARIABLE = "GPURIG_RUN_STATUS_DIR"


def record_failure(status_dir: str | None, failure: RankFailed) -> None:
    """Write ``failure`` as ``rank-<r>.json`` into ``status_dir``, if that directory is on this machine.

    A rank's first record stands: the program's own, written as it fails, beats
    its wrapper's, written once the process is gone.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     record_failure(d, RankFailed(1, "node1", -9))
    ...     record_failure(d, RankFailed(1, "node1", 137))
    ...     str(first_failure(d))
    'rank 1 on host node1 was killed by SIGKILL'
    """
    if not status_dir or not os.path.isdir(status_dir):
        return
    report = {"rank": failure.rank, "host": failure.host, "returncode": failure.returncode,
              "signal": failure.signal, "time": time.time(), "cause": failure.cause, "during": failure.during,
              "secondary": failure.secondary}
    try:
        with open(Path(status_dir) / f"rank-{failure.rank}.json", "x") as file:
            file.write(json.dumps(report))
    except FileExistsError:
        pass


def first_failure(status_dir: str | os.PathLike) -> RankFailed | None:
    """The earliest failure recorded in ``status_dir``, or None when no rank recorded one."""
    reports = []
    for path in Path(status_dir).glob("rank-*.json"):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    if not reports:
        return None
    first = min(reports, key=lambda report: (bool(report.get("secondary")), report["time"]))
    return RankFailed(first["rank"], first["host"], first["returncode"], first.get("cause"), first.get("during"),
                      bool(first.get("secondary")))


def ended_by(error: BaseException) -> None:
    """Leave ``error`` where the interpreter leaves an exception nobody caught (``sys.last_value``), for a rank
    that ends by it without a traceback: the communicator's exit then tells the other ranks this one raised or
    was interrupted, not that it "finished its program" (:meth:`gpurig.comm.watch.Watch.stop`).

    >>> ended_by(KeyboardInterrupt()); type(sys.last_value).__name__
    'KeyboardInterrupt'
    """
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, error.__traceback__
