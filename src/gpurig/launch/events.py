"""Rank 0's progress as JSON lines in a file, followed by the launching process (train, bench)."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path


def follow_jsonl(path: Path, on_event, stop: threading.Event) -> None:
    """Hand every JSON line appended to ``path`` to ``on_event`` until ``stop`` is set.

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "e.jsonl"; _ = p.write_text('{"event": "done"}\\n')
    >>> stop = threading.Event(); stop.set(); seen = []
    >>> follow_jsonl(p, seen.append, stop); seen
    [{'event': 'done'}]
    """
    position = 0
    while True:
        finished = stop.is_set()
        if path.exists():
            with open(path) as f:
                f.seek(position)
                for line in f:
                    if not line.endswith("\n"):
                        break
                    position += len(line)
                    try:
                        event = json.loads(line)
                    except ValueError:  # a rank killed as it wrote, in a job that restarted: its line is lost
                        continue
                    on_event(event)
        if finished:
            return
        stop.wait(0.1)


@contextlib.contextmanager
def following(path: Path, on_event):
    """Follow ``path`` (:func:`follow_jsonl`) on a thread while the ``with`` block runs; the lines written
    before it ends are all handed over when it does.

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "e.jsonl"; seen = []
    >>> with following(p, seen.append):
    ...     _ = p.write_text('{"event": "start"}\\n')
    >>> seen
    [{'event': 'start'}]
    """
    stop = threading.Event()
    follower = threading.Thread(target=follow_jsonl, args=(path, on_event, stop), daemon=True)
    follower.start()
    try:
        yield
    finally:
        stop.set()
        follower.join()
