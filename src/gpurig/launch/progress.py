"""A rank's last words: a small shared-memory file its wrapper reads after it died, to say what it was doing.

The rank wrapper (:mod:`gpurig.launch.rank_wrapper`) makes the file (:class:`ProgressFile`, unlinked at
once) and names it in ``GPURIG_PROGRESS_FILE``; the rank maps it into memory and the guard of
its collectives (:mod:`gpurig.comm.guard`) updates it as each collective begins
and ends — a few hundred nanoseconds, no system call — so a rank killed by
SIGKILL is reported with the exact collective it was in. A rank that ends
itself because *another* rank failed marks the file *reported*: it has said
why already, and its wrapper stays quiet.

Layout (256 bytes): state (``P`` progress, ``R`` reported), the collective's
number (8 bytes), whether it is in flight (1), the text's length (2), then the
text: ``KIND\\0DETAIL`` for progress, the failure line once reported; the last
64 bytes hold the rank's host name as the rank sees it (an emulated node's
wrapper runs outside the node).
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import tempfile

PROGRESS_VARIABLE = "GPURIG_PROGRESS_FILE"
SIZE = 256
HOST_BYTES = 64
_HEAD = struct.Struct("<cQ?H")
_SEQ = struct.Struct("<Q?")  # the collective's number and whether it is in flight, at offset 1
_TEXT = SIZE - _HEAD.size - HOST_BYTES


class ProgressFile:
    """The wrapper's side: a zeroed progress file (in memory-backed ``/dev/shm`` where there is one) that no
    directory lists. It is unlinked as soon as it is made and reaches the rank as an inherited descriptor, named
    ``/dev/fd/N`` (pass :attr:`fd` to the child: ``Popen(..., pass_fds=[f.fd])``), so a wrapper killed by SIGKILL
    leaves nothing behind. Where there is no ``/dev/fd`` the file keeps its name until :meth:`close`.

    >>> f = ProgressFile(); ProgressWriter(f.path).began(3, "allreduce", "grad, 4 B"); f.read()[:2]
    (False, 'during allreduce #3 (grad, 4 B)')
    >>> f.close()
    """

    def __init__(self):
        shm = "/dev/shm"
        directory = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
        self.fd, named = tempfile.mkstemp(prefix="gpurig-progress-", dir=directory)
        os.write(self.fd, bytes(SIZE))
        self._named: str | None = named
        if os.path.exists(f"/dev/fd/{self.fd}"):
            os.unlink(named)
            self._named = None
        self.path = self._named or f"/dev/fd/{self.fd}"  # what the rank opens (GPURIG_PROGRESS_FILE)

    def read(self) -> tuple[bool, str | None, str | None]:
        """What the rank left: (whether it reported its own end, what it was doing or said, its host); None where
        it wrote nothing."""
        return _parse(os.pread(self.fd, SIZE, 0))

    def close(self) -> None:
        os.close(self.fd)
        if self._named is not None:
            os.unlink(self._named)


class ProgressWriter:
    """The rank's side of the file named in ``GPURIG_PROGRESS_FILE`` (does nothing without one).

    >>> f = ProgressFile(); writer = ProgressWriter(f.path, host="node2")
    >>> writer.began(3, "allreduce", "grad, 4 B"); f.read()
    (False, 'during allreduce #3 (grad, 4 B)', 'node2')
    >>> writer.landed(3); writer.began(4); f.read()[1]
    'during allreduce #4 (grad, 4 B)\'
    >>> writer.reported("rank 1 on host node2 stopped responding"); f.read()[:2]
    (True, 'rank 1 on host node2 stopped responding')
    >>> f.close()
    """

    def __init__(self, path: str | None = None, host: str | None = None):
        path = os.environ.get(PROGRESS_VARIABLE) if path is None else path
        self._map = None
        if not path:
            return
        try:
            with open(path, "r+b") as f:
                self._map = mmap.mmap(f.fileno(), SIZE)
        except (OSError, ValueError):
            self._map = None
            return
        name = (host or socket.gethostname()).encode(errors="replace")[:HOST_BYTES]
        self._map[SIZE - HOST_BYTES:] = name.ljust(HOST_BYTES, b"\0")

    def began(self, seq: int, kind: str | None = None, detail: str = "") -> None:
        """Collective number ``seq`` began: a ``kind`` described by ``detail``, or like the one before it."""
        if self._map is None:
            return
        if kind is None:
            _SEQ.pack_into(self._map, 1, seq, True)
            return
        raw = f"{kind}\0{detail}".encode(errors="replace")[:_TEXT]
        self._map[_HEAD.size:_HEAD.size + len(raw)] = raw
        _HEAD.pack_into(self._map, 0, b"P", seq, True, len(raw))

    def landed(self, seq: int) -> None:
        """Collective number ``seq`` ended on this rank."""
        if self._map is not None:
            _SEQ.pack_into(self._map, 1, seq, False)

    def reported(self, line: str) -> None:
        """This rank is ending because of another rank's failure, and has said so in ``line``."""
        if self._map is None:
            return
        raw = line.encode(errors="replace")[:_TEXT]
        self._map[_HEAD.size:_HEAD.size + len(raw)] = raw
        _HEAD.pack_into(self._map, 0, b"R", 0, False, len(raw))


def last_collective(path: str | None = None) -> str | None:
    """What this rank's progress file says it was doing ("after allreduce #3 (grad, 4 B)"), for the record of a
    rank that ends itself; None without a file, or before any collective.

    >>> f = ProgressFile(); ProgressWriter(f.path).began(3, "allreduce", "grad, 4 B"); ProgressWriter(f.path).landed(3)
    >>> last_collective(f.path)
    'after allreduce #3 (grad, 4 B)'
    >>> f.close()
    """
    path = os.environ.get(PROGRESS_VARIABLE) if path is None else path
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            reported, text, _ = _parse(f.read(SIZE))
    except OSError:
        return None
    return None if reported else text


def _parse(record: bytes) -> tuple[bool, str | None, str | None]:
    try:
        state, seq, in_flight, length = _HEAD.unpack_from(record)
    except struct.error:
        return False, None, None
    host = record[SIZE - HOST_BYTES:].rstrip(b"\0").decode(errors="replace") or None
    text = record[_HEAD.size:_HEAD.size + length].decode(errors="replace")
    if state == b"R":
        return True, text, host
    if state != b"P":
        return False, None, host
    kind, _, detail = text.partition("\0")
    return False, f"{'during' if in_flight else 'after'} {kind} #{seq} ({detail})", host
