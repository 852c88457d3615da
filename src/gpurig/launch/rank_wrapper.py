"""What each launched rank really runs: the user's command as a child, reporting how it ended.

``python -m gpurig.launch.rank_wrapper -- CMD ...``. The child dies with the
wrapper (PR_SET_PDEATHSIG), so killing the job never leaves an orphan; when the
child fails, one line names the rank, the host and the exit code or signal, and
a status file tells the launcher which rank failed first.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys

from gpurig.launch.env import rank_from_env
from gpurig.launch.status import describe_exit, record_failure, shell_code


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m gpurig.launch.rank_wrapper -- CMD ...", file=sys.stderr)
        return 2
    rank, host = rank_from_env(), socket.gethostname()
    stopping = []
    child = subprocess.Popen(argv, preexec_fn=_die_with_parent)

    def forward(signum, _frame):
        stopping.append(signum)
        child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    returncode = child.wait()
    if returncode != 0 and not stopping:
        print(f"gpurig: rank {rank} on {host} {describe_exit(returncode)}", file=sys.stderr, flush=True)
        record_failure(os.environ.get("GPURIG_RUN_STATUS_DIR"), rank, host, returncode)
    return shell_code(returncode)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
