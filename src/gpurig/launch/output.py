"""What a rank prints: on the terminal with ``[rankR]: `` before each line, and into ``DIR/rank-R.log``.

``gpurig run --tag-output`` (the default at a terminal) and ``--log-dir DIR``
reach each rank's wrapper as two variables; the wrapper then reads its
command's stdout and stderr through pipes and passes them on
(:func:`relay`): to the same stream, each line tagged, and to the rank's log
file as written. Without either, a rank's output reaches the terminal untouched.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

from gpurig.errors import UsageError
from gpurig.launch.env import restart_count

TAG_VARIABLE = "GPURIG_TAG_OUTPUT"
LOG_DIR_VARIABLE = "GPURIG_LOG_DIR"
# The columns of the terminal the job's output reaches, or 0 for a file or a pipe: a rank's own stdout is a pipe
# or (Open MPI's) a pseudo-terminal whatever the user's is, so it cannot tell by looking.
COLUMNS_VARIABLE = "GPURIG_TERMINAL_COLUMNS"
_CHUNK = 65536


def output_env(env: dict, log_dir: str | None, tag: bool) -> dict:
    """``env`` plus the variables that ask each rank's wrapper to tag its lines and keep its log in ``log_dir``.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> env = output_env({}, d, tag=True); env["GPURIG_TAG_OUTPUT"], env["GPURIG_LOG_DIR"] == d
    ('1', True)
    """
    env = dict(env)
    env[COLUMNS_VARIABLE] = str(shutil.get_terminal_size().columns if sys.stdout.isatty() else 0)
    if tag:
        env[TAG_VARIABLE] = "1"
    said = "--log-dir"
    if log_dir is None and env.get(LOG_DIR_VARIABLE):   # left in the environment: checked here, not by each rank
        log_dir, said = env[LOG_DIR_VARIABLE], LOG_DIR_VARIABLE
    if log_dir is not None:
        path = Path(log_dir)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"{said} {log_dir}: cannot create it ({error.strerror})") from None
        if not os.access(path, os.W_OK):
            raise UsageError(f"{said} {log_dir}: not writable")
        env[LOG_DIR_VARIABLE] = str(path.resolve())
    return env


def log_path(log_dir: str, rank: int | None) -> Path:
    """Where rank ``rank`` keeps its output.

    >>> log_path("/tmp/logs", 3).name
    'rank-3.log'
    """
    return Path(log_dir) / f"rank-{rank if rank is not None else 'unknown'}.log"


def relay(source: int, target: int, tag: bytes | None, log, lock: threading.Lock) -> None:
    """Copy what arrives on file descriptor ``source`` to ``target`` until it closes: whole lines, each after
    ``tag``, when a tag is given, else as it comes; and whole lines to the binary file ``log`` (or None), so that
    the stdout and stderr lines in it stay apart.

    >>> r, w = os.pipe(); out_r, out_w = os.pipe()
    >>> _ = os.write(w, b"loss 0.5\\nstep 2"); os.close(w)
    >>> relay(r, out_w, b"[rank1]: ", None, threading.Lock()); os.close(out_w); os.read(out_r, 100)
    b'[rank1]: loss 0.5\\n[rank1]: step 2\\n'
    """
    pending = b""
    while True:
        try:
            chunk = os.read(source, _CHUNK)
        except OSError:
            chunk = b""
        if tag is None and chunk:
            _write(target, chunk)
        pending += chunk
        if not chunk and pending and not pending.endswith(b"\n"):
            pending += b"\n"  # the last line, unfinished
        *lines, pending = pending.split(b"\n")
        if lines and tag is not None:
            _write(target, b"".join(tag + line + b"\n" for line in lines))
        if lines and log is not None:
            with lock:
                log.write(b"".join(line + b"\n" for line in lines))
                log.flush()
        if not chunk:
            break
    os.close(source)


def _write(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue
        except OSError:  # the terminal went away: the log still gets it
            return


class RankOutput:
    """One rank's output, relayed (tagged, logged) when its launcher asked for it; else left alone.

    >>> import subprocess, tempfile; d = tempfile.mkdtemp()
    >>> output = RankOutput(1, {LOG_DIR_VARIABLE: d})
    >>> child = subprocess.Popen(["echo", "hello"], **output.popen_kwargs()); output.start(); _ = child.wait()
    >>> output.finish(); log_path(d, 1).read_text()
    'hello\\n'
    """

    def __init__(self, rank: int | None, env=None):
        env = os.environ if env is None else env
        self.tag = f"[rank{rank}]: ".encode() if env.get(TAG_VARIABLE) == "1" else None
        self.log = None
        if env.get(LOG_DIR_VARIABLE):
            self.log = open(log_path(env[LOG_DIR_VARIABLE], rank), "ab")
            restart = restart_count(env)
            if restart:  # one file per rank over the attempts of a job that restarts
                self.log.write(f"--- gpurig: restart {restart} ---\n".encode())
        self.active = self.tag is not None or self.log is not None
        self._pipes = [os.pipe(), os.pipe()] if self.active else []
        self._threads: list[threading.Thread] = []

    def popen_kwargs(self) -> dict:
        """What :class:`subprocess.Popen` needs so that the child writes into the relay's pipes."""
        if not self.active:
            return {}
        return {"stdout": self._pipes[0][1], "stderr": self._pipes[1][1]}

    def child_env(self, env: dict) -> dict:
        """The child's environment: Python writes each line at once into a pipe, as it does to a terminal."""
        return {**env, "PYTHONUNBUFFERED": env.get("PYTHONUNBUFFERED", "1")} if self.active else env

    def start(self) -> None:
        """Relay the child's stdout and stderr (call once it has started)."""
        lock = threading.Lock()
        for (read_end, write_end), target in zip(self._pipes, (1, 2)):
            os.close(write_end)
            thread = threading.Thread(target=relay, args=(read_end, target, self.tag, self.log, lock), daemon=True)
            thread.start()
            self._threads.append(thread)

    def finish(self, timeout: float = 5.0) -> None:
        """Wait for what the child wrote last (a grandchild that keeps the pipe open is not waited for)."""
        for thread in self._threads:
            thread.join(timeout)
        if self.log is not None:
            self.log.close()
