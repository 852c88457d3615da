"""The torch engine's launcher: start the ranks on this machine (as torchrun does) and watch them.

Every rank runs under :mod:`gpurig.launch.rank_wrapper`. As soon as one exits
non-zero, the others get SIGTERM, and SIGKILL 3 s later: a dead rank never
leaves its peers waiting out a collective's timeout.
"""

from __future__ import annotations

import signal
import subprocess
import time

from gpurig.errors import RankFailed
from gpurig.launch.env import rank_from_env, rank_host
from gpurig.launch.processes import stop, wrap

POLL_S = 0.05


def run_local(command: list[str], rank_envs: list[dict]) -> RankFailed | None:
    """Run one wrapped rank of ``command`` per environment here; return the first failure seen, or None.

    Ctrl-C (KeyboardInterrupt) passes SIGINT on to every rank, stops them and propagates.

    >>> import os
    >>> run_local(["true"], [{**os.environ, "RANK": "0"}, {**os.environ, "RANK": "1"}]) is None
    True
    >>> str(run_local(["false"], [{**os.environ, "RANK": "0"}])).endswith("exited with code 1")
    True
    """
    return watch_local(start_local(command, rank_envs), rank_envs)


def start_local(command: list[str], rank_envs: list[dict]) -> list[subprocess.Popen]:
    """Start one wrapped rank of ``command`` per environment here (stopping those started if one cannot start).

    >>> import os
    >>> [p.wait() for p in start_local(["true"], [dict(os.environ)])]
    [0]
    """
    procs: list[subprocess.Popen] = []
    try:
        for env in rank_envs:
            procs.append(subprocess.Popen(wrap(command), env=env))
    except BaseException:
        stop(procs)
        raise
    return procs


def watch_local(procs: list[subprocess.Popen], rank_envs: list[dict]) -> RankFailed | None:
    """Wait for the ranks :func:`start_local` started; at the first failure stop the others and return it."""
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
            if failed is not None:
                stop(procs)
                return RankFailed(rank_from_env(rank_envs[failed]), rank_host(rank_envs[failed]), codes[failed])
            if all(code == 0 for code in codes):
                return None
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        stop(procs, signal.SIGINT)
        raise
