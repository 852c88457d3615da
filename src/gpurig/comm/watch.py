"""The failure watch: each rank beats a heartbeat into the side channel and watches everyone else's.

A background thread per rank, separate from the collectives: every ``beat``
seconds it publishes this rank's heartbeat count and progress (which collective
it is in, from the :class:`~gpurig.comm.guard.Guard`) and reads every other
rank's, in two store operations. What it finds:

- **a rank that stopped** (SIGSTOP, or a hang that holds the GIL): its count has
  not moved for 90 % of the failure timeout. A rank merely computing a long step
  keeps beating, because the thread beats, not the training loop. Every rank
  then prints one line naming the rank, its host and its collective, leaves the
  failure for the launcher, and ends the job: MPI_Abort under MPI (a blocked MPI
  call cannot be interrupted), an immediate exit under torch.distributed.
- **a stall**: ranks waiting in a collective that others have not reached,
  longer than the stall timeout — reported once per stall, like Horovod's stall
  inspector; the job ends only with ``GPURIG_STALL_SHUTDOWN``.
- **a rank that finished** its program while this one waits in a collective it
  never called, and **ranks in the same collective with different
  signatures** (possible only for unchecked collectives): the job ends, named.

Deaths (SIGKILL, a crash) end the job through the launcher, which sees the
process go; this watch leaves the dying rank's wrapper its last progress
(:mod:`gpurig.launch.progress`) so that the launcher can name the collective.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass

from gpurig.errors import RankFailed
from gpurig.launch.processes import say
from gpurig.launch.settings import Settings
from gpurig.launch.status import STATUS_DIR_VARIABLE, record_failure

EXIT_CODE = 70  # a rank ended by its watch; the launcher names the rank that caused it
CONFIRM_BEATS = 2  # a finished peer or differing signatures must be seen this many beats in a row


@dataclass
class Beat:
    """What one rank publishes at each heartbeat."""

    count: int
    host: str
    seq: int
    in_flight: bool
    what: str
    digest: int
    age: float
    finished: bool = False
    failure: str | None = None  # the failure this rank is ending the job for

    def encode(self) -> bytes:
        """The beat as the store keeps it (JSON)."""
        return json.dumps([self.count, self.host, self.seq, self.in_flight, self.what, self.digest,
                           round(self.age, 3), self.finished, self.failure]).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Beat":
        """The beat :meth:`encode` wrote.

        >>> Beat.decode(Beat(3, "node1", 7, True, "allreduce #7 (4 B)", 1, 0.5).encode()).seq
        7
        """
        return cls(*json.loads(raw))

    def where(self) -> str:
        """``during X`` / ``after X`` for this beat's collective.

        >>> Beat(3, "node1", 7, True, "allreduce #7 (4 B)", 1, 0.5).where()
        'during allreduce #7 (4 B)'
        """
        if self.seq == 0:
            return "before its first collective"
        return f"{'during' if self.in_flight else 'after'} {self.what}"


def beat_interval(settings: Settings) -> float:
    """Seconds between heartbeats: a twentieth of the failure timeout, between 0.05 and 0.5.

    >>> beat_interval(Settings(failure_timeout=10)), beat_interval(Settings(failure_timeout=2))
    (0.5, 0.1)
    """
    if settings.failure_timeout <= 0:
        return 0.5
    return min(0.5, max(0.05, settings.failure_timeout / 20))


def stall_report(waiting: list[int], what: str, waited: float, laggards: list[tuple[int, "Beat"]]) -> str:
    """The stall inspector's line.

    >>> b = Beat(1, "node2", 411, False, "allgather #411 (8 B)", 0, 61.0)
    >>> stall_report([0, 2], "allreduce #412 (bucket 3, 5.5 MB)", 60.2, [(1, b)])
    'stall: ranks 0, 2 have waited 60 s in allreduce #412 (bucket 3, 5.5 MB); rank 1 on host node2 has not reached it (it is after allgather #411 (8 B), for 61 s)'
    """
    who = f"rank {waiting[0]} has" if len(waiting) == 1 else f"ranks {', '.join(map(str, waiting))} have"
    line = f"stall: {who} waited {waited:.0f} s in {what}"
    if not laggards:
        return line + "; every rank has reached it (a slow or stuck network?)"
    late = [f"rank {r} on host {b.host} has not reached it (it is {b.where()}, for {b.age:.0f} s)" for r, b in laggards]
    return f"{line}; {'; '.join(late)}"


class Watch:
    """The watching thread of one rank. ``abort(code)`` ends this rank and, where the engine can, the job.

    >>> watch = Watch(channel, comm.rank, comm.size, comm.guard, Settings(), comm.engine.abort)   # doctest: +SKIP
    >>> watch.start(); ...; watch.stop()                                                        # doctest: +SKIP
    """

    def __init__(self, channel, rank: int, size: int, guard, settings: Settings, abort, out=say):
        self.channel, self.rank, self.size, self.guard = channel, rank, size, guard
        self.settings, self.abort, self.out = settings, abort, out
        self.beat = beat_interval(settings)
        self.silence = settings.failure_timeout - 2 * self.beat if settings.failure_timeout > 0 else float("inf")
        self.host = socket.gethostname()
        self._store = None
        self._count = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (count, when it last changed)
        self._answered = 0.0  # when the store last answered
        self._failure: str | None = None
        self._failure_published = threading.Event()
        self._suspect: dict[str, int] = {}
        self._stalls_reported: set[int] = set()
        self._beats: list[Beat | None] = [None] * size

    # -- life cycle ----------------------------------------------------------
    def start(self, join_timeout: float = 60.0) -> bool:
        """Connect, beat once, wait until every rank has (collective: every rank calls it); False if that failed."""
        try:
            # Long: a store operation that times out may leave torch's client waiting for ever (it cancels
            # its wait and expects an answer); the watch never waits on the store itself (see _exchange).
            self._store = self.channel.connect(max(60.0, 10 * min(self.silence, 60.0)))
            self._publish()
            self._store.wait([self._key(r) for r in range(self.size)], _delta(join_timeout))
            self._beats = [Beat.decode(b) for b in self._store.multi_get([self._key(r) for r in range(self.size)])]
        except Exception as error:  # the job still runs, only unwatched: say so once
            self.out(f"gpurig: rank {self.rank}: failure detection is off, the side channel at "
                     f"{self.channel.endpoint} cannot be used: {str(error).splitlines()[0]}")
            return False
        now = self._answered = time.monotonic()
        self._seen = {r: (-1, now) for r in range(self.size) if r != self.rank}
        self._threads = [threading.Thread(target=loop, name=f"gpurig-watch-{loop.__name__}", daemon=True)
                         for loop in (self._exchange, self._watch)]
        for thread in self._threads:
            thread.start()
        return True

    def stop(self, wait_for_others: float = 0.0) -> None:
        """Publish that this rank finished; rank 0 (serving the store) waits up to ``wait_for_others`` seconds
        for the other ranks to finish too, so their watches can still read it."""
        if not self._threads:
            return
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2 * self.beat + 1)
        self._threads = []
        raised = getattr(sys, "last_value", None)   # set when the program ends by an exception it did not catch
        if raised is not None and self._failure is None:   # the others say so, not that this rank "finished"
            what = str(raised).strip().splitlines()[0] if str(raised).strip() else ""
            how = (f"exited with code {raised.code}" if isinstance(raised, SystemExit) and isinstance(raised.code, int)
                   else f"exited: {what}" if isinstance(raised, SystemExit)
                   else f"raised {type(raised).__name__}{': ' + what if what else ''}")
            self._failure = f"rank {self.rank} on host {self.host} {how} after collective #{self.guard.progress.seq}"
        try:
            self._publish(finished=True)
            self._store.set(f"done/{self.rank}", "1")
            if self.rank == 0 and wait_for_others > 0:
                self._store.wait([f"done/{r}" for r in range(self.size)], _delta(wait_for_others))
        except Exception:
            pass

    def explain(self) -> str | None:
        """Why this rank's collective may have broken, from the beats: another rank's reported failure, or a rank
        that finished its program before this collective. Waits up to two beats for news.

        >>> watch.explain()           # doctest: +SKIP
        'rank 0 on host vm finished its program after collective #4'
        """
        deadline = time.monotonic() + 2 * self.beat
        while True:
            answered = self._answered
            found = self._explanation()
            if found is not None or time.monotonic() >= deadline or not self._threads:
                return found
            while self._answered == answered and time.monotonic() < deadline:
                time.sleep(self.beat / 10)

    def _explanation(self) -> str | None:
        me = self.guard.progress
        for r, beat in enumerate(self._beats):
            if beat is not None and beat.failure:
                return beat.failure
        for r, beat in enumerate(self._beats):
            if beat is not None and beat.finished and beat.seq < me.seq and r != self.rank:
                return f"rank {r} on host {beat.host} finished its program after collective #{beat.seq}"
        return None

    # -- the two threads ----------------------------------------------------------
    @staticmethod
    def _key(rank: int) -> str:
        return f"beat/{rank}"

    def _publish(self, finished: bool = False) -> None:
        p = self.guard.progress
        self._count += 1
        beat = Beat(self._count, self.host, p.seq, p.in_flight, p.describe(), p.signature.digest if p.signature else 0,
                    time.monotonic() - p.since if p.since else 0.0, finished, self._failure)
        self._store.set(self._key(self.rank), beat.encode())
        if self._failure is not None:
            self._failure_published.set()

    def _exchange(self) -> None:
        """Beat and read everyone's beats, forever; a call that hangs (rank 0 stopped) hangs only this thread."""
        while not self._stop.wait(self.beat):
            try:
                self._publish()
                raw = self._store.multi_get([self._key(r) for r in range(self.size)])
            except Exception:  # the store's host is gone: the launcher ends the job, or _watch finds it silent
                continue
            self._beats = [Beat.decode(b) for b in raw]
            self._answered = time.monotonic()

    def _watch(self) -> None:
        """Judge the latest beats every beat interval; end the job when something is wrong."""
        ticked = time.monotonic()
        while not self._stop.wait(self.beat):
            try:
                now = time.monotonic()
                if now - ticked > self.silence / 2:  # this rank itself was stopped (and continued): start afresh
                    self._answered, ticked = now, now
                    self._seen = {r: (count, now) for r, (count, _) in self._seen.items()}
                    continue
                ticked = now
                if now - self._answered >= self.silence:
                    if self._store_silent(now):
                        return
                elif self._observe(now):
                    return
            except Exception as error:  # a bug here must never take the rank down
                self.out(f"gpurig: rank {self.rank}: failure watch error: {error!r}")
                return

    def _store_silent(self, now: float) -> bool:
        """The store stopped answering. Rank 0 serves it: unless rank 0 said it finished, rank 0 stopped."""
        last, me = self._beats[0], self.guard.progress
        if self.rank == 0:
            return True
        if last is not None and last.finished:  # rank 0 ended normally, the store with it
            if me.in_flight and last.seq < me.seq:
                self._fail(RankFailed(0, last.host, None, f"finished its program after collective #{last.seq}",
                                      f"while rank {self.rank} waits in {me.describe()}"), publish=False)
            return True
        reported = next((b.failure for b in self._beats if b is not None and b.failure), None)
        doing = self._doing(last, me) if last else "before its first collective"
        self._fail(reported or RankFailed(0, last.host if last else None, None, "stopped responding",
                                          f"{doing} (it serves gpurig's side channel); no answer for "
                                          f"{now - self._answered:.1f} s"), publish=False)
        return True

    @staticmethod
    def _doing(beat: Beat, me) -> str:
        """The collective the job is stuck in: the one this rank waits in, else the silent rank's last."""
        return f"during {me.describe()}" if me.in_flight else beat.where()

    def _observe(self, now: float) -> bool:
        """Look at everyone's latest beat; return True once the job is being ended."""
        beats, me = self._beats, self.guard.progress
        reported = next((b.failure for b in beats if b is not None and b.failure), None)
        if reported is not None:  # another rank is ending the job: say the same, and end too
            self._fail(reported)
            return True
        for r, beat in enumerate(beats):
            if r == self.rank or beat is None or beat.finished:
                continue
            count, since = self._seen[r]
            if beat.count != count:
                self._seen[r] = (beat.count, now)
            elif now - since >= self.silence:
                self._fail(RankFailed(r, beat.host, None, "stopped responding",
                                      f"{self._doing(beat, me)}; no heartbeat for {now - since:.1f} s"))
                return True
        if me.in_flight:
            return self._check_finished(beats, me) or self._check_signatures(beats, me) or self._check_stall(beats, me)
        return False

    def _confirmed(self, key: str, seen: bool) -> bool:
        """Whether condition ``key`` has now held for CONFIRM_BEATS beats in a row."""
        self._suspect[key] = self._suspect.get(key, 0) + 1 if seen else 0
        return self._suspect[key] >= CONFIRM_BEATS

    def _check_finished(self, beats, me) -> bool:
        done = next(((r, b) for r, b in enumerate(beats) if b is not None and b.finished and b.seq < me.seq), None)
        if not self._confirmed("finished", done is not None):
            return False
        r, beat = done
        self._fail(RankFailed(r, beat.host, None, f"finished its program after collective #{beat.seq}",
                              f"while rank {self.rank} waits in {me.describe()}"))
        return True

    def _check_signatures(self, beats, me) -> bool:
        mine = me.signature.digest if me.signature else 0
        other = next(((r, b) for r, b in enumerate(beats) if b is not None and b.in_flight and b.seq == me.seq
                      and b.digest != mine and r != self.rank), None)
        if not self._confirmed("signatures", other is not None):
            return False
        r, beat = other
        self._fail(RankFailed(self.rank, self.host, None, f"is in {me.describe()}",
                              f"while rank {r} on host {beat.host} is in {beat.what}: the ranks' collectives differ"))
        return True

    def _check_stall(self, beats, me) -> bool:
        waited = time.monotonic() - me.since
        stall, shutdown = self.settings.stall_timeout, self.settings.stall_shutdown
        if not (0 < stall <= waited or 0 < shutdown <= waited):
            return False
        waiting = [r for r, b in enumerate(beats) if b is not None and b.in_flight and b.seq == me.seq]
        laggards = [(r, b) for r, b in enumerate(beats) if b is not None and b.seq < me.seq]
        line = stall_report(waiting or [self.rank], me.describe(), waited, laggards)
        if 0 < shutdown <= waited:
            culprit, beat = laggards[0] if laggards else (self.rank, beats[self.rank])
            self._fail(RankFailed(culprit, beat.host if beat else None, None, "stalled the job",
                                  f"({line}); ended after {shutdown:g} s (--stall-shutdown)"))
            return True
        if me.seq not in self._stalls_reported and (not waiting or waiting[0] == self.rank):
            self._stalls_reported.add(me.seq)
            self.out(f"gpurig: {line}")
        return False

    def _fail(self, failure: RankFailed | str, publish: bool = True) -> None:
        """Say it, leave it for the launcher and the other ranks, end this rank (and under MPI the job).

        ``failure`` is what this rank found, or the line another rank published.
        """
        self.out(f"gpurig: {failure}")
        if isinstance(failure, RankFailed):
            record_failure(os.environ.get(STATUS_DIR_VARIABLE), failure)
        self.guard.progress_file.reported(str(failure))
        if publish:  # so that every rank says the same; the exchange thread publishes it within a beat
            self._failure = str(failure)
            self._failure_published.wait(timeout=3 * self.beat)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        self.abort(EXIT_CODE)


def _delta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)
