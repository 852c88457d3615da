"""Errors a user should see as one line, never as a traceback."""

from __future__ import annotations

import os
import signal
from pathlib import Path


class UsageError(Exception):
    """Bad user input (flags, files, impossible configurations): the CLI prints one line and exits 2.

    >>> raise UsageError("-n must be at least 1, got 0")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: -n must be at least 1, got 0
    """


class Terminated(KeyboardInterrupt):
    """The process was told to stop by a signal (SIGTERM, SIGHUP): it stops as Ctrl-C stops it, and the command
    exits 128 + the signal's number, as a shell reports a process a signal ended.

    >>> Terminated(signal.SIGTERM).exit_code, str(Terminated(signal.SIGTERM))
    (143, 'stopped by SIGTERM')
    """

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum


def one_line(error: BaseException, limit: int = 300) -> str:
    """An exception raised by someone else's code (a user's model, an import) as "Type: first line of its message".

    >>> one_line(ValueError("bad shape\\nmore detail"))
    'ValueError: bad shape'
    """
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:limit] if lines else '(no message)'}"


class CollectiveFailed(RuntimeError):
    """A collective broke inside the engine (most often because another rank has gone).

    Raised from the engine's error; the job's summary names the rank that
    failed first, so a rank failing this way reports it as a consequence.

    >>> str(CollectiveFailed("allreduce #49 (grad, 4.0 KB) failed: Connection reset by peer"))
    'allreduce #49 (grad, 4.0 KB) failed: Connection reset by peer'
    """


class RankFailed(Exception):
    """A rank of a job ended badly: which rank, on which host, and how.

    ``returncode`` follows :mod:`subprocess`: negative for a signal, None when unknown.
    ``cause`` replaces the exit code in the message (a rank found stopped is
    still running); ``during`` adds what the rank was doing. A ``secondary``
    failure followed another rank's (a collective broke because a peer left).

    >>> str(RankFailed(1, "node1", 3))
    'rank 1 on host node1 exited with code 3'
    >>> failure = RankFailed(2, "node1", -9, during="during allreduce #412 (bucket 3, 5.5 MB)")
    >>> str(failure), failure.signal, failure.exit_code
    ('rank 2 on host node1 was killed by SIGKILL during allreduce #412 (bucket 3, 5.5 MB)', 'SIGKILL', 137)
    >>> str(RankFailed(1, "node2", None, cause="stopped responding"))
    'rank 1 on host node2 stopped responding'
    """

    def __init__(self, rank: int | None, host: str | None, returncode: int | None, cause: str | None = None,
                 during: str | None = None, secondary: bool = False):
        super().__init__(rank, host, returncode)
        self.rank, self.host, self.returncode = rank, host, returncode
        self.cause, self.during, self.secondary = cause, during, secondary

    @property
    def signal(self) -> str | None:
        """Name of the signal that killed the rank, or None."""
        if self.returncode is None or self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    @property
    def exit_code(self) -> int:
        """The code as a shell reports it: 128 + signal number for a killed rank, 1 when unknown."""
        if self.returncode is None:
            return 1
        return self.returncode if self.returncode >= 0 else 128 - self.returncode

    def __str__(self) -> str:
        who = "a rank" if self.rank is None else f"rank {self.rank}"
        if self.host:
            who += f" on host {self.host}"
        if self.cause:
            how = self.cause
        elif self.returncode is None:
            how = "failed"
        elif self.signal:
            how = f"was killed by {self.signal}"
        else:
            how = f"exited with code {self.returncode}"
        return f"{who} {how}" + (f" {self.during}" if self.during else "")


def check_directory(path: str, flag: str, shown: str | None = None, make: bool = False, probe: bool = False) -> None:
    """A directory ``flag`` will write into: it exists or can be made (its nearest existing parent is a writable
    directory), and is not a file. ``shown``: the path the message names (default ``path``). ``make``: make it now
    (where a writable-looking parent still refuses, as /proc does root); ``probe``: make it and remove again what
    was made, to know without leaving anything.

    >>> check_directory("/dev/null/runs", "--checkpoint-dir")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --checkpoint-dir /dev/null/runs: /dev/null is not a directory
    """
    if not path:
        raise UsageError(f"{flag} '': want a directory")
    target = Path(path).absolute()
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"{flag} {shown or path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK):
        raise UsageError(f"{flag} {shown or path}: {existing} is not writable")
    if make or probe:
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"{flag} {shown or path}: cannot make the directory ({error.strerror or error})") from None
        if probe and not make:
            for made in (target, *target.parents):
                if made == existing:
                    break
                made.rmdir()


def check_writable(path: str, flag: str, make_directory: bool = False) -> None:
    """A file ``flag`` will write: its directory exists (or, with ``make_directory``, can be made) and is
    writable, and it is not a directory itself.

    >>> check_writable("/nonexistent/trace.json", "--timeline")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --timeline /nonexistent/trace.json: the directory /nonexistent does not exist
    >>> check_writable("/dev/full", "--timeline")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --timeline /dev/full: /dev/full is not a regular file (a device, a FIFO): give a file name
    >>> check_writable("/dev/null/bench/profile.json", "--out", make_directory=True)
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --out /dev/null/bench/profile.json: /dev/null is not a directory
    """
    target = Path(path)
    directory = target.parent
    if not path or target.is_dir():
        raise UsageError(f"{flag} {path!r}: want a file name, e.g. trace.json")
    if target.exists() and not target.resolve().is_file():  # a file written over it would replace the node
        raise UsageError(f"{flag} {path}: {target.resolve()} is not a regular file (a device, a FIFO): give a file "
                         f"name")
    if make_directory:
        check_directory(str(directory), flag, shown=path)
        if not directory.is_dir():
            return
    elif not directory.is_dir():
        raise UsageError(f"{flag} {path}: the directory {directory} does not exist")
    elif not os.access(directory, os.W_OK):
        raise UsageError(f"{flag} {path}: the directory {directory} is not writable")
    existed = target.exists()
    try:   # where access() says yes and the write would still fail: /sys and /proc as root, a read-only file
        with open(target, "a"):
            pass
    except OSError as error:
        raise UsageError(f"{flag} {path}: cannot write it ({error.strerror or error})") from None
    if not existed:
        target.unlink(missing_ok=True)
