"""What each launched rank really runs: the user's command as a child, reporting how it ended.

``python -m gpurig.launch.rank_wrapper -- CMD ...`` (see :func:`gpurig.launch.processes.wrap`)

- The child dies with the wrapper (PR_SET_PDEATHSIG=SIGKILL), and the wrapper
  stops its child when its own parent (mpirun, the launcher, srun) dies, so
  killing a job at any level never leaves an orphan.
- SIGTERM, SIGINT and SIGHUP are passed on to the child (each kind once, and
  not a Ctrl-C typed at the terminal, which reached the child already); a child
  still running 3 s after the first is killed.
- A stopped child (SIGSTOP) gets SIGCONT after the signal passed on, so that it
  can act on it.
- When the child fails on its own (not because it was told to stop), one line
  on stderr names the rank, the host, the exit code or signal and the
  collective it was in (from its progress file, :mod:`gpurig.launch.progress`),
  and a status file tells the launcher which rank failed first. A child that
  ended itself because another rank failed has said so already: no line then.
- With ``GPURIG_TAG_OUTPUT`` or ``GPURIG_LOG_DIR`` (``gpurig run --tag-output``,
  ``--log-dir``) the child's output passes through the wrapper: each line after
  ``[rankR]: ``, and into the rank's log file (:mod:`gpurig.launch.output`).
- The wrapper exits with the child's code, 128 + signal number for a signal.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading

from gpurig.errors import RankFailed
from gpurig.launch.env import rank_from_env, rank_host, torch_style_env
from gpurig.launch.output import RankOutput
from gpurig.launch.processes import GRACE_S, die_with_parent, in_terminal_foreground, say
from gpurig.launch.progress import PROGRESS_VARIABLE, ProgressFile
from gpurig.launch.rank_env import rank_path
from gpurig.launch.standby import still_parked
from gpurig.launch.status import STATUS_DIR_VARIABLE, record_failure

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _start(command: list[str], rank: int | None, host: str, progress: ProgressFile,
           output: RankOutput) -> subprocess.Popen | int:
    try:
        # torchrun's variables too, under mpirun: a torchrun script runs unchanged on either engine
        env = output.child_env({**os.environ, **torch_style_env(os.environ), PROGRESS_VARIABLE: progress.path,
                                "PATH": rank_path(os.environ)})
        child = subprocess.Popen(command, preexec_fn=die_with_parent, env=env, pass_fds=[progress.fd],
                                 **output.popen_kwargs())
        output.start()
        return child
    except OSError as error:
        say(f"gpurig: rank {rank} on host {host} could not start {command[0]!r}: {error.strerror}")
        return 127


def main(argv: list[str]) -> int:
    """Run ``argv`` (after an optional ``--``) as this rank's command; return the exit code to exit with.

    >>> main(["--", "python", "train.py"])   # as: python -m gpurig.launch.rank_wrapper -- python train.py  # doctest: +SKIP
    0
    """
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print("usage: python -m gpurig.launch.rank_wrapper -- CMD ...", file=sys.stderr)
        return 2
    rank, host = rank_from_env(), rank_host()
    die_with_parent(signal.SIGTERM)
    progress = ProgressFile()
    try:
        return _supervise(command, rank, host, progress)
    finally:
        progress.close()


def _supervise(command: list[str], rank: int | None, host: str, progress: ProgressFile) -> int:
    output = RankOutput(rank)
    child = _start(command, rank, host, progress, output)
    if isinstance(child, int):
        record_failure(os.environ.get(STATUS_DIR_VARIABLE), RankFailed(rank, host, child))
        return child
    told_to_stop: set[int] = set()

    def forward(signum, _frame):
        if signum in told_to_stop or child.poll() is not None:
            return
        if not told_to_stop:
            timer = threading.Timer(GRACE_S, functools.partial(_kill_if_running, child))
            timer.daemon = True
            timer.start()
        told_to_stop.add(signum)
        if not (signum == signal.SIGINT and in_terminal_foreground()):  # else the child got this Ctrl-C itself
            child.send_signal(signum)
        child.send_signal(signal.SIGCONT)  # a stopped child acts on no signal but SIGKILL until it continues

    for signum in FORWARDED:
        signal.signal(signum, forward)
    code = child.wait()
    output.finish()
    reported, doing, where = progress.read()
    ending = RankFailed(rank, where or host, code, during=doing if code != 0 else None)
    if ending.returncode != 0 and not told_to_stop and not reported:
        if not still_parked():  # a standby rank's end is its launcher's to notice: the job it may replace runs on
            say(f"gpurig: {ending}")
        record_failure(os.environ.get(STATUS_DIR_VARIABLE), ending)
    return ending.exit_code


def _kill_if_running(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.kill()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
