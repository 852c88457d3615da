"""Every collective passes the guard: numbered, checked against the other ranks', recorded as in flight.

Checking is Horovod's negotiation made cheap. Horovod's coordinator gathers
every rank's request for every tensor, compares them and answers, a round trip
through rank 0 per cycle. Here each rank contributes a 33-integer *check block*
(the bits of a digest of what it submits, :mod:`gpurig.comm.signature`) to one
tiny allreduce right before the data moves; no coordinator, no answer message:
every rank sees the same sum and reaches the same verdict. Where every rank is
on one machine the digests meet on a shared-memory board instead
(:mod:`gpurig.comm.checkboard`), microseconds where the engine's tiny
collective costs Gloo a millisecond. The exchange must
come first: ranks that hand an engine tensors of different sizes make it
corrupt memory or abort the process (Open MPI: MPI_ERR_TRUNCATE on one rank,
wrong numbers on the other; Gloo: "Received data size doesn't match", then
SIGABRT). A caller that knows its next collectives (DataParallel: one per
bucket) checks them all with one exchange (:meth:`Guard.expect`), and may begin
that exchange early and nonblocking (:meth:`Guard.post_expect`: DataParallel
does at backward's first gradient), so that it travels while backward computes
and is judged, before any data moves, when the first announced collective
begins. Only on a mismatch do the ranks swap full descriptions, to say which
ranks differ and how.

What each rank is doing — the number of its current collective, what it is,
since when — is kept in :attr:`Guard.progress` for the failure watch
(:mod:`gpurig.comm.watch`) to publish.
"""

from __future__ import annotations

import collections
import json
import time
from typing import NamedTuple

import torch

from gpurig.comm.checkboard import BoardRequest, CheckBoard
from gpurig.comm.signature import CheckBuffer, Signature, batch_digest, describe_difference
from gpurig.launch.progress import ProgressWriter


class CollectiveMismatchError(RuntimeError):
    """Ranks submitted different tensors (name, shape, dtype, reduction) or collectives (kind, order).

    Raised on every rank at the same collective, before its data moved, so the
    job is still usable after catching it.
    """


class Progress(NamedTuple):
    """Where one rank is: ``seq`` collectives begun, the last of them ``signature``, ``in_flight`` or done."""

    seq: int = 0
    signature: Signature | None = None
    nbytes: int = 0
    in_flight: bool = False
    since: float = 0.0

    def describe(self) -> str:
        """The collective as a person reads it.

        >>> Progress(412, Signature("allreduce", "bucket 3", "float32", (1375000,), "sum"), 5_500_000, True).describe()
        'allreduce #412 (bucket 3, 5.5 MB)'
        """
        if self.signature is None:
            return "its first collective"
        return f"{self.signature.kind} #{self.seq} ({self.detail()})"

    def detail(self) -> str:
        """The tensor's name, if any, and size: ``bucket 3, 5.5 MB``."""
        name = f"{self.signature.name}, " if self.signature.name else ""
        return f"{name}{_short_bytes(self.nbytes)}"

    def where(self) -> str:
        """``during X`` or ``after X``.

        >>> Progress(3, Signature("barrier", None, "-", ()), 0, False).where()
        'after barrier #3 (0 B)'
        """
        if self.signature is None:
            return "before its first collective"
        return f"{'during' if self.in_flight else 'after'} {self.describe()}"


def _short_bytes(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class Guard:
    """Numbers, checks and records one rank's collectives; ``engine`` moves the check blocks.

    ``stage`` turns a host tensor into one the engine reads (NCCL: the GPU).
    With ``check=False`` collectives are only numbered and recorded.

    >>> guard = Guard(engine)                                    # doctest: +SKIP
    >>> guard.begin(Signature.of("allreduce", t, "loss"), t.nbytes); engine.allreduce_sum(t); guard.end()  # doctest: +SKIP
    """

    use_board = True  # False: every check through the engine, also on one machine (set before the first)

    def __init__(self, engine, stage=lambda tensor: tensor, check: bool = True):
        self.engine = engine
        self.stage = stage
        self.check = check and engine.size > 1
        # Where this rank is, as plain fields (every collective sets them: no objects made); see `progress`.
        self._seq, self._signature, self._nbytes, self._in_flight, self._since = 0, None, 0, False, 0.0
        self.progress_file = ProgressWriter()  # the rank wrapper's copy, for a rank that gets killed
        self._details: dict = {}               # (signature, bytes) -> how the progress file describes it
        self._block = CheckBuffer(engine.size)
        self._board: CheckBoard | None = None  # the check through shared memory (one machine), set up at the first
        self._board_tried = False              # check, which every rank reaches at the same point
        self._checks = 0                       # check exchanges so far: the board's sequence
        self._poke = getattr(engine, "poke", None)
        self._expected: collections.deque = collections.deque()
        self._batch_error: CollectiveMismatchError | None = None  # the announced batch's failed check
        self._posted: tuple | None = None  # (signatures, request): post_expect's exchange

    def begin(self, signature: Signature, nbytes: int, check: bool = True) -> None:
        """Before a collective's data moves: mark it in flight, then check it (unless :meth:`expect` did).

        A collective announced by a batch whose check failed raises that error
        instead (no rank sends it). One that was not announced ends the batch (its
        caller stopped short, say on an error) and is checked on its own. A check
        :meth:`post_expect` began is judged first: it came first in the sequence.
        """
        if self._posted is not None:
            self.settle()
        if self._expected and self._expected[0] == signature:
            self._expected.popleft()
            error = self._batch_error
            if not self._expected:
                self._batch_error = None
            if error is not None:
                raise error
            checked = True
        else:
            self._expected.clear()
            self._batch_error = None
            checked = False
        # In flight from here: the check exchange is where a rank waits for a peer that never comes.
        self._set(self._seq + 1, signature, nbytes, True)
        if self.check and check and not checked:
            board = self._board
            if board is None:
                self._exchange([signature], self._seq)
                return
            # _exchange's board case, written out: a blocking allreduce's whole path is a few µs (docs/benchmarks.md)
            digest = signature.digest
            self._checks = k = self._checks + 1
            board.post(k, digest)
            if not board.arrived(k):
                board.wait(k, self._poke)
            if not board.agreed(k, digest):
                self._judge([signature], BoardRequest(board, k, digest), self._seq)

    def end(self) -> None:
        """The collective begun last has finished on this rank."""
        self._in_flight, self._since = False, time.monotonic()
        self.progress_file.landed(self._seq)

    def _set(self, seq: int, signature: Signature, nbytes: int, in_flight: bool) -> None:
        if signature != self._signature or nbytes != self._nbytes:
            detail = self._details.get((signature, nbytes))
            if detail is None:  # (a step's few collectives alternate: each would be described anew)
                if len(self._details) > 1000:
                    self._details.clear()
                detail = self._details[signature, nbytes] = Progress(seq, signature, nbytes).detail()
            self.progress_file.began(seq, signature.kind, detail)
        else:
            self.progress_file.began(seq)
        self._seq, self._signature, self._nbytes, self._in_flight = seq, signature, nbytes, in_flight
        self._since = time.monotonic()

    @property
    def progress(self) -> Progress:
        """Where this rank is now (a snapshot, for the watch and for messages).

        >>> Guard(type("E", (), {"size": 1})()).progress.describe()
        'its first collective'
        """
        return Progress(self._seq, self._signature, self._nbytes, self._in_flight, self._since)

    def expect(self, signatures: list[Signature]) -> None:
        """Check the next ``len(signatures)`` collectives with one exchange; each is then begun without one.

        Every rank must call it at the same point of its sequence of collectives.
        A mismatch is raised by each announced collective this rank then begins
        (the exchange may run on a background thread; the collectives' errors
        reach their callers), and none of them moves data: ranks whose batches
        differ in length must not be left waiting.
        """
        if self._posted is not None:
            self.settle()
        if self.check and signatures:
            self._announce(signatures, lambda first_seq: self._exchange(signatures, first_seq))

    def post_expect(self, signatures: list[Signature]) -> bool:
        """Begin :meth:`expect`'s exchange with the engine's nonblocking allreduce and return at once (True);
        it is judged by :meth:`settle` — by the next collective this rank begins, at the latest — so no data
        moves unchecked. The same point of every rank's sequence as :meth:`expect`; it is not posted (False)
        where the engine has no nonblocking allreduce.

        >>> guard.post_expect(signatures); ...; guard.begin(signatures[0], nbytes)   # judged here   # doctest: +SKIP
        """
        if self._posted is not None:
            self.settle()
        if not (self.check and signatures):
            return True
        if self._shared_board() is None and not hasattr(self.engine, "start_allreduce"):
            return False
        self._posted = (signatures, self._start(batch_digest(signatures)))
        return True

    def _shared_board(self) -> CheckBoard | None:
        if not self._board_tried:
            self._board_tried = True
            self._board = CheckBoard.open(self.engine, self.stage) if self.use_board else None
        return self._board

    def _start(self, digest: int):
        """Begin one check exchange of ``digest``: on the board where the job has one, else the engine's
        nonblocking allreduce of a check block (its blocking one for an engine without it, done on return)."""
        board = self._shared_board()
        if board is not None:
            self._checks += 1
            board.post(self._checks, digest)
            return BoardRequest(board, self._checks, digest, self._poke)
        block = self._block.fill(digest)
        staged = self.stage(block)
        if hasattr(self.engine, "start_allreduce"):
            return EngineCheck(self.engine.start_allreduce(staged), self._block, staged)
        self.engine.allreduce_sum(staged)
        return EngineCheck(None, self._block, staged)

    @property
    def posted(self) -> bool:
        """Whether a check :meth:`post_expect` began is still to be judged."""
        return self._posted is not None

    def poll(self) -> None:
        """Judge the posted check if its exchange has ended (an MPI_Test also moves it along)."""
        if self._posted is not None and self._posted[1].is_completed():
            self.settle()

    def settle(self) -> None:
        """Wait for the check :meth:`post_expect` began and judge it, as :meth:`expect` does."""
        signatures, request = self._posted

        def judge(first_seq: int) -> None:
            self._posted = None  # even if the wait fails: an engine error ends this collective's story
            request.wait()
            self._judge(signatures, request, first_seq)

        self._announce(signatures, judge)

    def _announce(self, signatures: list[Signature], exchange) -> None:
        """Run ``exchange(first_seq)`` as the batch's check, recorded in flight; its verdict goes to the batch."""
        self._expected.clear()
        before = self.progress  # in flight meanwhile: a rank whose peers never come waits in this exchange
        self._set(before.seq + 1, signatures[0], signatures[0].nbytes, True)
        try:
            exchange(before.seq + 1)
            self._batch_error = None
        except CollectiveMismatchError as error:
            self._batch_error = error
        # back to where it was (an engine error leaves it in flight: that is where it broke)
        self._seq, self._signature, self._nbytes, self._in_flight, self._since = before
        self._expected.extend(signatures)

    def _exchange(self, signatures: list[Signature], first_seq: int) -> None:
        # the same exchange as post_expect's: where one rank posted its check early and another checks a
        # collective of its own at that point, the two must match (and MPI matches no blocking collective
        # with a nonblocking one)
        request = self._start(batch_digest(signatures))
        request.wait()
        self._judge(signatures, request, first_seq)

    def _judge(self, signatures: list[Signature], request, first_seq: int) -> None:
        if request.agreed():
            return
        everyone = self._gather([s.fields() for s in signatures])
        raise CollectiveMismatchError(describe_difference(first_seq, everyone))

    def _gather(self, fields: list) -> list[list]:
        """Every rank's ``fields`` (all ranks found the mismatch in the same exchange, so all call this)."""
        mine = json.dumps(fields).encode()
        size = self.engine.size
        lengths = self.engine.allgather(self.stage(torch.tensor([len(mine)], dtype=torch.int64)), [1] * size)
        lengths = lengths.cpu().tolist()
        payload = self.stage(torch.frombuffer(bytearray(mine), dtype=torch.uint8))
        data = self.engine.allgather(payload, lengths).cpu().numpy().tobytes()
        out, start = [], 0
        for n in lengths:
            out.append(json.loads(data[start:start + n]))
            start += n
        return out


class EngineCheck:
    """A check block in the engine's allreduce (``request``; None when it already ran blocking)."""

    def __init__(self, request, block: CheckBuffer, staged: torch.Tensor):
        self.request, self.block, self.staged = request, block, staged

    def is_completed(self) -> bool:
        return self.request is None or self.request.is_completed()

    def wait(self) -> None:
        if self.request is not None:
            self.request.wait()

    def agreed(self) -> bool:
        return self.block.agreed(None if self.staged is self.block.tensor else self.staged)
