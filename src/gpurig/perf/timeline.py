"""Timelines in the Chrome trace event format (what Perfetto, ``chrome://tracing`` and Horovod's timeline use),
and the predicted step drawn as one.

A trace is ``{"traceEvents": [...], "displayTimeUnit": "ms"}``. Each phase of a step
is a complete event (``"ph": "X"``) with its start ``ts`` and duration ``dur`` in
microseconds, a process ``pid`` (the rank) and a thread ``tid`` (0: the rank's main
thread; 1 + i: bucket i's communication); metadata events (``"ph": "M"``) name them
(``rank 1``, ``bucket 0``). Phase names are the step split's words, so totals
per name compare with what ``gpurig train`` and ``gpurig predict`` print:

- ``data loading``, ``forward``, ``backward``, ``optimizer`` (compute is the step's
  time less data loading and the waits at the end of backward);
- ``communication`` and ``wait for slowest rank``: the end of backward waiting for
  the gradients, split as the printed step split is;
- per bucket, on its own thread: ``copy in`` / ``encode``, ``allreduce`` or
  ``send + decode``.

>>> trace = chrome_trace([complete("forward", 0.0, 0.002, pid=1)], names={1: "rank 1"})
>>> [(e["ph"], e["name"]) for e in trace["traceEvents"]]
[('M', 'process_name'), ('M', 'thread_name'), ('X', 'forward')]
>>> trace["traceEvents"][2]["dur"]
2000.0
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpurig.files import temporary_beside

MAIN = 0            # a rank's main thread
PHASES = ("data loading", "forward", "backward", "optimizer", "communication", "wait for slowest rank")


def bucket_thread(index: int) -> int:
    """The thread id of bucket ``index``'s communication row.

    >>> bucket_thread(0)
    1
    """
    return 1 + index


def complete(name: str, start_s: float, end_s: float, pid: int = 0, tid: int = MAIN, cat: str = "step",
             **args) -> dict:
    """One complete event (``ph`` X) from ``start_s`` to ``end_s`` (seconds on the trace's clock).

    >>> complete("optimizer", 0.5, 0.5015, pid=0, step=3)
    {'name': 'optimizer', 'cat': 'step', 'ph': 'X', 'ts': 500000.0, 'dur': 1500.0, 'pid': 0, 'tid': 0, 'args': {'step': 3}}
    """
    event = {"name": name, "cat": cat, "ph": "X", "ts": round(start_s * 1e6, 3),
             "dur": round(max(0.0, end_s - start_s) * 1e6, 3), "pid": pid, "tid": tid}
    if args:
        event["args"] = args
    return event


def chrome_trace(events: list[dict], names: dict[int, str]) -> dict:
    """The trace: a ``process_name`` per pid in ``names``, a ``thread_name`` per thread used, then ``events``.

    >>> len(chrome_trace([complete("allreduce", 0, 1, pid=0, tid=bucket_thread(2))], {0: "rank 0"})["traceEvents"])
    4
    """
    meta = [{"name": "process_name", "ph": "M", "pid": pid, "tid": MAIN, "args": {"name": name}}
            for pid, name in sorted(names.items())]
    threads = sorted({(e["pid"], e["tid"]) for e in events} | {(pid, MAIN) for pid in names})
    meta += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
              "args": {"name": "main" if tid == MAIN else f"bucket {tid - 1}"}} for pid, tid in threads]
    return {"traceEvents": meta + sorted(events, key=lambda e: (e["pid"], e["ts"])), "displayTimeUnit": "ms"}


def write(path: str | os.PathLike, trace: dict) -> Path:
    """Write ``trace`` as JSON to ``path``, atomically (a temporary file renamed over it); through a symbolic link,
    to the file it names (the link stays).

    >>> write("/tmp/trace.json", chrome_trace([], {0: "rank 0"})).name
    'trace.json'
    """
    path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():  # renamed over, a device or a FIFO would be replaced by the file
        raise ValueError(f"{path} is not a regular file")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temporary_beside(path)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(trace, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def phase_totals(trace: dict, pid: int | None = None) -> dict[str, float]:
    """Seconds per phase name over the main threads' events (of ``pid`` only, if given).

    >>> phase_totals(chrome_trace([complete("forward", 0, 0.25), complete("forward", 1, 1.5)], {0: "rank 0"}))
    {'forward': 0.75}
    """
    totals: dict[str, float] = {}
    for event in trace["traceEvents"]:
        if event["ph"] == "X" and event["tid"] == MAIN and (pid is None or event["pid"] == pid):
            totals[event["name"]] = totals.get(event["name"], 0.0) + event["dur"] / 1e6
    return totals


def predicted_step_events(step_ms: dict, buckets: list[dict], pid: int = 0) -> list[dict]:
    """One predicted step as trace events: ``step_ms`` is ``gpurig predict``'s split (``forward_ms``,
    ``backward_ms``, ``optimizer_ms``, ``comm_ms``, ``wait_ms``, ``data_ms``), ``buckets`` its buckets (each
    ``seconds`` on the link, ``lead_s`` of backward still to run when it is ready, ``codec_s``). Data loading,
    forward, backward, each bucket on its row (leaving when backward has finished its layers, one at a time on
    the link), the communication backward could not hide, the wait for the slowest rank, the optimizer.

    >>> step = {"data_ms": 1, "forward_ms": 10, "backward_ms": 20, "comm_ms": 4, "wait_ms": 2, "optimizer_ms": 5}
    >>> [(e["name"], e["ts"], e["dur"]) for e in predicted_step_events(step, [{"seconds": 0.012, "lead_s": 0.008}])]
    ... # doctest: +NORMALIZE_WHITESPACE
    [('data loading', 0.0, 1000.0), ('forward', 1000.0, 10000.0), ('backward', 11000.0, 20000.0),
     ('allreduce', 23000.0, 12000.0), ('communication', 31000.0, 4000.0), ('wait for slowest rank', 35000.0, 2000.0),
     ('optimizer', 37000.0, 5000.0)]
    """
    clock, events = 0.0, []

    def phase(name: str, key: str) -> None:
        nonlocal clock
        seconds = step_ms.get(key, 0.0) / 1000
        events.append(complete(name, clock, clock + seconds, pid))
        clock += seconds

    for name, key in (("data loading", "data_ms"), ("forward", "forward_ms"), ("backward", "backward_ms")):
        phase(name, key)
    backward_end, link_free = clock, float("-inf")
    for i, bucket in enumerate(buckets):
        start = max(backward_end - bucket.get("lead_s", 0.0), link_free)
        link_free = start + bucket["seconds"] + bucket.get("codec_s", 0.0)
        facts = {key: bucket[key] for key in ("wire_bytes", "algorithm") if bucket.get(key) is not None}
        events.append(complete("allreduce", start, link_free, pid, bucket_thread(i), cat="bucket", bucket=i, **facts))
    for name, key in (("communication", "comm_ms"), ("wait for slowest rank", "wait_ms"),
                      ("optimizer", "optimizer_ms")):
        phase(name, key)
    return events
