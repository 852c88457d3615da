"""Record what each rank does, step by step, and write it as one Chrome trace (Perfetto, ``chrome://tracing``).

``gpurig train --timeline trace.json`` records with it; so can your own script,
as Horovod's ``HOROVOD_TIMELINE`` does::

    with gpurig.timeline("trace.json") as timeline:   # every rank; rank 0 writes the file at the end
        model = gpurig.DataParallel(net)               # records each bucket's copy, allreduce, the wait for them
        for x, y in batches:
            with timeline.span("forward"):
                loss = loss_fn(model(x), y)
            with timeline.span("backward"):
                loss.backward()
            with timeline.span("optimizer"):
                optimizer.step()

Each rank is one process of the trace (``pid`` = rank); its clock starts at the
end of a barrier that all ranks leave together, so the ranks' events line up.
Recording is a ``time.perf_counter()`` and a list append per event; without a
timeline nothing is recorded (``DataParallel.timeline`` is None).
The format and the phase names are :mod:`gpurig.perf.timeline`'s.

>>> import gpurig
>>> with timeline("/tmp/trace.json") as recorder:           # doctest: +SKIP
...     with recorder.span("forward"):
...         pass
"""

from __future__ import annotations

import contextlib
import json
import time

from gpurig import comm as comm_mod
from gpurig.perf import timeline as trace_format

EXPOSED = "exposed"  # the end of backward waiting for gradients; named when the epoch's split is known


class Timeline:
    """One rank's events, gathered to rank 0 and written by :meth:`close` (every rank calls it).

    >>> recorder = Timeline("/tmp/trace.json", gpurig.init())      # doctest: +SKIP
    >>> recorder.add("forward", time.perf_counter() - 0.01, time.perf_counter())   # doctest: +SKIP
    """

    def __init__(self, path, comm: comm_mod.Communicator | None = None):
        self.path, self.comm = path, comm or comm_mod.current()
        self.events: list[dict] = []
        self._exposed: list[tuple[float, float]] = []   # this step's waits, cut out of the backward around them
        self._unsplit = 0                                # the first exposed event not yet named
        self.comm.barrier()
        self.origin = time.perf_counter()                # every rank leaves the barrier at about the same time

    def add(self, name: str, start: float, end: float, tid: int = trace_format.MAIN, cat: str = "step",
            **args) -> None:
        """An event from ``start`` to ``end`` (``time.perf_counter()`` values) on thread ``tid``."""
        self.events.append(trace_format.complete(name, start - self.origin, end - self.origin, self.comm.rank, tid,
                                                 cat, **args))

    @contextlib.contextmanager
    def span(self, name: str, tid: int = trace_format.MAIN, **args):
        """Record the block as one event named ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, start, time.perf_counter(), tid, **args)

    def exposed(self, start: float, end: float) -> None:
        """The main thread waited for gradients from ``start`` to ``end`` (DataParallel calls it)."""
        self._exposed.append((start, end))
        self.add(EXPOSED, start, end)

    def add_around_waits(self, name: str, start: float, end: float, **args) -> None:
        """``name`` from ``start`` to ``end`` less the waits recorded inside it (backward, which contains them),
        so the main thread's events tile the step."""
        cursor = start
        for wait_start, wait_end in sorted(w for w in self._exposed if start <= w[0] < end):
            if wait_start > cursor:
                self.add(name, cursor, wait_start, **args)
            cursor = max(cursor, wait_end)
        if end > cursor:
            self.add(name, cursor, end, **args)
        self._exposed = [w for w in self._exposed if w[0] >= end]

    def name_waits(self, waiting_fraction: float) -> None:
        """Name the waits recorded since the last call: each one's first ``waiting_fraction`` is waiting for the
        slowest rank, the rest communication (the fraction the epoch's step split found for this rank)."""
        named = []
        for event in self.events[self._unsplit:]:
            if event["name"] != EXPOSED:
                named.append(event)
                continue
            waited = event["dur"] * min(max(waiting_fraction, 0.0), 1.0)
            if waited > 0:
                named.append({**event, "name": "wait for slowest rank", "dur": round(waited, 3)})
            if event["dur"] - waited > 0:
                named.append({**event, "name": "communication", "ts": round(event["ts"] + waited, 3),
                              "dur": round(event["dur"] - waited, 3)})
        self.events[self._unsplit:] = named
        self._unsplit = len(self.events)

    def close(self) -> dict | None:
        """Gather every rank's events (a collective: every rank calls it); rank 0 writes the trace to the path and
        returns it, the others return None. Waits not yet named count as communication."""
        self.name_waits(0.0)
        gathered = self.comm.allgather_bytes(json.dumps(self.events).encode(), name="timeline")
        if self.comm.rank != 0:
            return None
        events = [event for data in gathered for event in json.loads(data)]
        trace = trace_format.chrome_trace(events, {rank: f"rank {rank}" for rank in range(self.comm.size)})
        trace_format.write(self.path, trace)
        return trace


_current: Timeline | None = None


def current() -> Timeline | None:
    """The timeline a ``with timeline(...)`` block is recording, or None (DataParallel records into it).

    >>> current() is None
    True
    """
    return _current


@contextlib.contextmanager
def timeline(path, comm: comm_mod.Communicator | None = None):
    """Record the block's steps on every rank; at its end rank 0 writes ``path`` (Chrome trace JSON).

    DataParallel models record their buckets while the block runs, made before it or inside. A block left by an
    exception writes nothing (the other ranks may not be there to gather with).

    >>> with timeline("/tmp/trace.json") as recorder:    # doctest: +SKIP
    ...     model = gpurig.DataParallel(net)
    """
    global _current
    recorder, previous = Timeline(path, comm), _current
    _current = recorder
    try:
        yield recorder
    except BaseException:
        _current = previous
        raise
    _current = previous
    recorder.close()
