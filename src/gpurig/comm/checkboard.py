"""The collective check through shared memory, where every rank of the job is on one machine.

The guard's check (:mod:`gpurig.comm.guard`) is a rendezvous: each rank shows
the digest of what it is about to submit and reads everyone else's. Through the
engine that is one more tiny collective per check, and a tiny collective costs
what the engine's wake-up costs: Gloo's worker threads and loopback TCP take
0.4–1 ms for 33 integers, Open MPI about 7 µs. On one machine the ranks can
read each other's memory instead. The board is one small shared-memory file:
each rank owns ``DEPTH`` words, and the k-th check writes, into word k mod
``DEPTH``, k and the digest together (one aligned 8-byte store, which no rank
can see half done). A rank waits until every rank's word for k shows k, then
compares the digests. Two words suffice: a rank can post check k+1 only after
it saw every rank's k, so no rank overwrites a word another may still read.

What the exchange guarantees is unchanged (every rank reaches the same verdict,
before any data moves); a rank that never comes is the failure watch's to name,
as it is for the engine's exchange. The file is unlinked as soon as every rank
has mapped it, so a job that is killed leaves nothing in ``/dev/shm``.

>>> board = CheckBoard.single()     # one rank: its own board
>>> board.post(1, 0xBEEF); board.arrived(1), board.agreed(1, 0xBEEF)
(True, True)
"""

from __future__ import annotations

import mmap
import os
import secrets
import time

import torch

DEPTH = 2
SHM_DIR = "/dev/shm"
_LOW = (1 << 32) - 1


class CheckBoard:
    """``size`` ranks × ``DEPTH`` words in a shared mapping; this rank writes only its own."""

    def __init__(self, buffer, rank: int, size: int, keep=None):
        self.rank, self.size = rank, size
        # plain ints through a memoryview: a look at two words costs ~0.1 µs (numpy's slicing, ~5 µs)
        self._words = memoryview(buffer).cast("B").cast("Q")[: size * DEPTH]
        self._keep = keep  # the mmap the words live in
        self._columns = [range(column, size * DEPTH, DEPTH) for column in range(DEPTH)]

    @classmethod
    def single(cls) -> "CheckBoard":
        """A board in private memory, for one rank (and for examples)."""
        return cls(bytearray(8 * DEPTH), 0, 1)

    @classmethod
    def open(cls, engine, stage=lambda tensor: tensor) -> "CheckBoard | None":
        """Set up a board shared by every rank of ``engine`` (a collective: every rank calls it, at the same
        point); None on every rank where the ranks span machines or any rank cannot map it. ``stage`` makes a
        host tensor one the engine reads (NCCL: the GPU).

        >>> CheckBoard.open(engine)   # doctest: +SKIP
        """
        if engine.size == 1 or getattr(engine, "local_size", None) != engine.size or not os.path.isdir(SHM_DIR):
            return None

        def summed(value: int) -> int:
            tensor = stage(torch.tensor([value], dtype=torch.int64))
            engine.allreduce_sum(tensor)
            return int(tensor.cpu()[0])

        token = torch.zeros(2, dtype=torch.int64)
        if engine.rank == 0:
            token[0], token[1] = secrets.randbits(62), os.getpid()
        staged = stage(token)
        engine.broadcast(staged, 0)
        token = staged.cpu()
        path = os.path.join(SHM_DIR, f"gpurig-check-{int(token[1])}-{int(token[0]):x}")
        nbytes = 8 * DEPTH * engine.size
        board = None
        try:
            if engine.rank == 0:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                os.ftruncate(fd, nbytes)
            else:
                fd = None
            ready = 1
        except OSError:
            fd, ready = None, 0
        if summed(ready) == engine.size:  # the file exists (or rank 0 says it could not make it)
            try:
                if fd is None:
                    fd = os.open(path, os.O_RDWR)
                mapped = mmap.mmap(fd, nbytes)
                board = cls(mapped, engine.rank, engine.size, keep=mapped)
            except OSError:
                board = None
            finally:
                if fd is not None:
                    os.close(fd)
        mapped_everywhere = summed(int(board is not None)) == engine.size
        if engine.rank == 0:
            try:
                os.unlink(path)
            except OSError:
                pass
        return board if mapped_everywhere else None

    def post(self, k: int, digest: int) -> None:
        """Show check ``k``'s digest to the other ranks."""
        self._words[self.rank * DEPTH + k % DEPTH] = ((k & _LOW) << 32) | (digest & _LOW)

    def arrived(self, k: int) -> bool:
        """Whether every rank has posted check ``k``."""
        words, want = self._words, k & _LOW
        for index in self._columns[k % DEPTH]:
            if words[index] >> 32 != want:
                return False
        return True

    def agreed(self, k: int, digest: int) -> bool:
        """Whether every rank posted ``digest`` for check ``k`` (call once :meth:`arrived`)."""
        words, want = self._words, digest & _LOW
        for index in self._columns[k % DEPTH]:
            if words[index] & _LOW != want:
                return False
        return True

    def wait(self, k: int, poke=None, spin_s: float = 50e-6, nap_s: float = 50e-6) -> None:
        """Wait until every rank has posted check ``k``: spinning ``spin_s``, then between naps of ``nap_s``
        (a waiting rank must not hold the core a late peer needs); ``poke()`` between looks lets an engine
        move what this rank has in flight (Open MPI moves a nonblocking collective only inside MPI calls)."""
        if self.arrived(k):
            return
        until = time.perf_counter() + spin_s
        while not self.arrived(k):
            if poke is not None:
                poke()
            if time.perf_counter() > until:
                time.sleep(nap_s)


class BoardRequest:
    """Check ``k`` posted on a board, in the shape of an engine request (``is_completed``, ``wait``)."""

    def __init__(self, board: CheckBoard, k: int, digest: int, poke=None):
        self.board, self.k, self.digest, self.poke = board, k, digest, poke

    def is_completed(self) -> bool:
        return self.board.arrived(self.k)

    def wait(self) -> None:
        self.board.wait(self.k, self.poke)

    def agreed(self) -> bool:
        return self.board.agreed(self.k, self.digest)
