"""Command lines and process plumbing for ranks: how a rank is started, and how it is stopped."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 3.0
WRAPPER = [sys.executable, "-m", "gpurig.launch.rank_wrapper", "--"]
_FLAGS_WITH_VALUE = ("-W", "-X")
_PR_SET_PDEATHSIG = 1

try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before any fork: preexec_fn only calls it
except (OSError, AttributeError):  # not Linux
    _prctl = None


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Have the kernel send ``signum`` to this process when its parent exits (Linux; elsewhere a no-op).

    Meant for ``subprocess.Popen(..., preexec_fn=die_with_parent)``, so a child never
    outlives the process that started it, however that process ends.

    >>> subprocess.Popen(["true"], preexec_fn=die_with_parent).wait()
    0
    """
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signum))


def in_terminal_foreground() -> bool:
    """Whether this process is in its terminal's foreground group, so that a typed Ctrl-C reaches the whole group.

    >>> isinstance(in_terminal_foreground(), bool)
    True
    """
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


def stop(procs: list[subprocess.Popen], signum: int = signal.SIGTERM, grace: float = GRACE_S) -> None:
    """Send ``signum`` to every process still running; SIGKILL whatever still runs ``grace`` seconds later.

    >>> p = subprocess.Popen(["sleep", "60"])
    >>> stop([p]); p.returncode
    -15
    """
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.send_signal(signum)
    deadline = time.monotonic() + grace
    for p in alive:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def say(line: str) -> None:
    """Write ``line`` to stderr in one write, so that lines of ranks sharing a terminal never interleave.

    >>> say("gpurig: rank 1 on host node1 exited with code 3")   # doctest: +SKIP
    """
    os.write(2, (line + "\n").encode(errors="replace"))


def wrap(command: list[str]) -> list[str]:
    """The command line that runs ``command`` as one rank, under :mod:`gpurig.launch.rank_wrapper`.

    >>> wrap(["python", "train.py"])[-4:]
    ['gpurig.launch.rank_wrapper', '--', 'python', 'train.py']
    """
    return WRAPPER + list(command)


def as_rank_program(command: list[str], path: str | None = None) -> list[str]:
    """``command`` run under :mod:`gpurig.launch.pyrun` when it is a program for this Python, else as given.

    >>> as_rank_program([sys.executable, "-u", "train.py", "--epochs", "3"])[1:]
    ['-u', '-m', 'gpurig.launch.pyrun', 'train.py', '--epochs', '3']
    >>> as_rank_program(["./train.sh"])
    ['./train.sh']
    """
    found = shutil.which(command[0], path=path)
    if found is None or Path(found).parent != Path(sys.executable).parent:
        return list(command)
    if not re.fullmatch(r"python[0-9.]*", Path(command[0]).name):
        return list(command)
    i = 1
    while i < len(command) and command[i].startswith("-") and command[i] not in ("-m", "-c", "-"):
        i += 2 if command[i] in _FLAGS_WITH_VALUE else 1
    if i >= len(command) or command[i:i + 2] == ["-m", "gpurig.launch.pyrun"]:
        return list(command)
    return [*command[:i], "-m", "gpurig.launch.pyrun", *command[i:]]
