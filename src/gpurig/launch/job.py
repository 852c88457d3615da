"""``run_job``: check the request, start the ranks with the chosen engine, name the first failure in one line.

Two engines, one outcome. ``mpi`` runs one mpirun (:mod:`gpurig.launch.mpirun`);
``torch`` spawns the ranks here like torchrun (:mod:`gpurig.launch.local`), or,
under ``srun``, runs the one rank of this SLURM task. Either way every rank runs
under :mod:`gpurig.launch.rank_wrapper`; when one fails the others are stopped
within seconds and the launcher prints one line naming the first failure.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass

from gpurig.errors import RankFailed, Terminated, UsageError
from gpurig.launch.env import MAX_RESTARTS_VARIABLE, RESTART_VARIABLES
from gpurig.launch.hosts import is_this_host, parse_hosts, resolves
from gpurig.launch.iface import confine
from gpurig.launch.local import run_local, start_local, watch_local
from gpurig.launch.mpirun import Mpirun, cannot_start_on, mpi_arg_words, mpirun_job, run_line, run_mpirun
from gpurig.launch.processes import as_rank_program, stop
from gpurig.launch.rank_env import local_torch_envs, rank_path, srun_step, srun_torch_env
from gpurig.launch.standby import PARK_VARIABLE, release
from gpurig.launch.status import STATUS_DIR_VARIABLE, first_failure

ENGINES = ("mpi", "torch")
STANDBY_DELAY_S = 8.0  # after an attempt starts, before its standby does (an attempt's own start takes ~5-10 s)
_GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def gpu_count() -> int:
    """GPUs torch can use here; 0 without importing torch (seconds) when the machine has no GPU device files.

    >>> gpu_count() >= 0
    True
    """
    if not any(os.path.exists(path) for path in _GPU_DEVICE_FILES):
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count()


def default_nprocs(hosts: str | None = None, env: dict | None = None) -> int:
    """Ranks to start when ``-n`` is not given: all ``--hosts`` slots, the tasks of an srun step, one per GPU, or 2.

    >>> default_nprocs("a:4,b:2")
    6
    """
    if hosts:
        return sum(slots for _, slots in parse_hosts(hosts))
    step = srun_step(os.environ if env is None else env)
    return step[1] if step else gpu_count() or 2


def check_ranks_here(nprocs: int, advice: str = "name more machines with --hosts") -> None:
    """Refuse more ranks on this one machine than it could ever hold (a typo must not fork thousands of processes);
    ``advice``: what the command offers instead.

    >>> check_ranks_here(100_000)    # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: -n 100000 would start 100000 processes on this machine (...): at most ... here; name more machines with --hosts
    """
    cores = os.cpu_count() or 1
    limit = max(64, 8 * cores)
    if nprocs > limit:
        raise UsageError(f"-n {nprocs} would start {nprocs} processes on this machine ({cores} cores): at most "
                         f"{limit} here; {advice}")


def check_request(command: list[str], nprocs: int, engine: str, hosts: str | None, env: dict) -> list[tuple[str, int]]:
    """Refuse, as one :class:`UsageError` line, what cannot run; return the parsed host list.

    >>> check_request(["python", "x.py"], 9, "mpi", "a:4,b:4", {})
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: -n 9 needs 9 slots but --hosts a:4,b:4 has 8
    """
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if not command:
        raise UsageError("no command to run: gpurig run -n N -- python script.py")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise UsageError(f"-n must be at least 1, got {nprocs}")
    host_list = parse_hosts(hosts) if hosts else []
    if not host_list and not srun_step(env):
        check_ranks_here(nprocs)
    slots = sum(s for _, s in host_list)
    if host_list and slots < nprocs:
        raise UsageError(f"-n {nprocs} needs {nprocs} slots but --hosts {hosts} has {slots}")
    step = srun_step(env)
    if step and engine == "mpi":
        raise UsageError(f"this is task {step[0]} of an srun step of {step[1]}: each task would start its own "
                         "mpirun; under srun use --engine torch, or run gpurig run once in the allocation")
    if step and nprocs != step[1]:
        raise UsageError(f"-n {nprocs}, but srun started {step[1]} tasks (one rank each): drop -n under srun")
    if engine == "torch" and not step:
        if len(host_list) > 1:
            raise UsageError("multi-host runs with --engine torch need SLURM (srun gpurig run --engine torch -- ...) "
                             "or --engine mpi")
        if host_list and not is_this_host(host_list[0][0]):
            raise UsageError(f"--engine torch starts ranks on this machine, not on {host_list[0][0]}: use --engine mpi")
    unknown = [host for host, _ in host_list if not is_this_host(host) and not resolves(host)]
    if unknown:  # else ssh's and Open MPI's daemon messages, 15 lines, and exit 255
        raise UsageError(f"--hosts: cannot resolve {', '.join(map(repr, unknown))} (not an address, and neither DNS "
                         "nor /etc/hosts knows the name)")
    if all(is_this_host(host) for host, _ in host_list):
        check_command(command, env)
    return host_list


def check_command(command: list[str], env: dict) -> None:
    """Refuse in one line a command the ranks could not start here: not found, not executable, or a Python
    script that is not there (each rank would print its own error).

    >>> check_command(["no-such-program-here"], {})
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: command not found: no-such-program-here
    """
    if not shutil.which(command[0], path=rank_path(env)):
        if os.sep in command[0] and os.path.isfile(command[0]):
            raise UsageError(f"{command[0]}: not executable (chmod +x {command[0]}, or run it with its interpreter)")
        raise UsageError(f"command not found: {command[0]}")
    script = _python_script(command)
    if script is not None and not os.path.isfile(script):
        raise UsageError(f"{command[0]}: can't open file {script!r}: no such file (from {os.getcwd()})")


def _python_script(command: list[str]) -> str | None:
    """The script a ``python [options] SCRIPT ...`` command runs, or None (``-m``, ``-c``, another program).

    >>> _python_script(["python3", "-u", "train.py", "--lr", "1"]), _python_script(["python", "-m", "pkg"])
    ('train.py', None)
    """
    if not re.fullmatch(r"python[0-9.]*", os.path.basename(command[0])):
        return None
    for arg in command[1:]:
        if arg in ("-m", "-c", "-"):
            return None
        if arg.startswith("-"):
            if arg in ("-W", "-X", "-Q"):  # options that take the next argument: leave the guessing
                return None
            continue
        return arg
    return None


def run_job(command: list[str], nprocs: int, engine: str = "mpi", hosts: str | None = None,
            env: dict | None = None, mpi_args: str = "", iface: str | None = None, *,
            master_addr: str | None = None, master_port: int | None = None, nnodes: int = 1, node_rank: int = 0,
            max_restarts: int = 0, on_restart=None) -> int:
    """Run ``command`` on ``nprocs`` ranks; return 0, or the exit code of the first rank that failed.

    ``env`` is the environment the ranks start from (default: this process's);
    gpurig adds its variables to it (see :mod:`gpurig.launch.rank_env`). The
    job's sockets stay on ``iface``, or on loopback when every rank runs here
    (:func:`gpurig.launch.iface.confine`). With ``--engine torch`` this launcher
    may start one node's ranks of several (``node_rank`` of ``nnodes``, meeting
    at ``master_addr:master_port``, as torchrun). Raises :class:`UsageError`
    for a request that cannot run; when a rank fails, prints one line naming the
    first failing rank, its host and how it ended.

    When a rank fails, the job is started again, up to ``max_restarts`` times
    (torchrun's ``--max-restarts``), every rank with ``GPURIG_RESTART_COUNT``
    and ``TORCHELASTIC_RESTART_COUNT`` set to the attempt; ``on_restart(count,
    failure)`` is called before each. Ctrl-C is never followed by a restart.

    >>> run_job(["true"], 2, engine="torch")
    0
    """
    env = dict(os.environ if env is None else env)
    mpi_arg_words(mpi_args)
    if engine == "torch" and mpi_args.strip():  # a flag taken and then ignored would be a silent mistake
        raise UsageError("--mpi-args is for --engine mpi: under --engine torch no mpirun starts the ranks")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise UsageError(f"--max-restarts must be 0 or more, got {max_restarts}")
    host_list = check_request(command, nprocs, engine, hosts, env)
    if max_restarts and srun_step(env):
        raise UsageError("--max-restarts under srun: each task is its own launcher and cannot restart the others; "
                         "run gpurig run once in the allocation with --hosts, or let SLURM requeue the job")
    all_here = nnodes == 1 and all(is_this_host(host) for host, _ in host_list)
    env, mpi_args = confine(env, engine, all_here, iface, mpi_args)
    if engine == "mpi" and master_addr:  # run_mpirun's default: the first host
        env["MASTER_ADDR"] = master_addr
    if engine == "mpi" and master_port:
        env["MASTER_PORT"] = str(master_port)
    if engine == "torch" and not master_addr:
        master_addr = env["MASTER_ADDR"] if iface else "127.0.0.1"
    command = as_rank_program(command, rank_path(env))
    env[MAX_RESTARTS_VARIABLE] = str(max_restarts)
    # The next attempt's ranks wait, warm, while this one runs: ranks of a Python program (they can park), all on
    # this machine (they see the file that releases them).
    warm = max_restarts > 0 and not srun_step(env) and "gpurig.launch.pyrun" in command and all_here
    standby, job_over = None, threading.Event()

    def start(attempt: int, parked: bool = False):
        ready = {**env, **dict.fromkeys(RESTART_VARIABLES, str(attempt))}
        if engine == "mpi":
            return _MpiAttempt.start(command, nprocs, host_list, ready, mpi_args, parked)
        return _LocalAttempt.start(command, nprocs, ready, (master_addr, master_port), (node_rank, nnodes), parked)

    try:
        for attempt in range(max_restarts + 1):
            env.update(dict.fromkeys(RESTART_VARIABLES, str(attempt)))
            if warm:
                current = standby.take() if standby is not None else start(attempt)
                current.release()
                # later, not at once: on a machine with few cores its start would slow this attempt's
                standby = (_Standby(functools.partial(start, attempt + 1, True), job_over)
                           if attempt < max_restarts else None)
                failure, others = current.wait(), nprocs - 1
            else:
                failure, others = _run_once(command, nprocs, engine, host_list, env, mpi_args,
                                            (master_addr, master_port), (node_rank, nnodes))
            if failure is None:
                return 0
            print(summary(failure, others), file=sys.stderr, flush=True)
            if attempt == max_restarts:
                return failure.exit_code
            if engine == "mpi" and len(host_list) > 1:  # a host that is gone: the restart runs on those that remain
                host_list, nprocs = without_lost_hosts(host_list, nprocs, env, mpi_args)
            print(restart_notice(attempt + 1, max_restarts, nprocs), file=sys.stderr, flush=True)
            if on_restart is not None:
                on_restart(attempt + 1, failure)
    finally:
        if standby is not None:
            standby.discard()
        job_over.set()
    return failure.exit_code


def restart_notice(count: int, max_restarts: int, nprocs: int) -> str:
    """The line a launcher prints as it starts the job again.

    >>> restart_notice(1, 3, 2)
    'gpurig run: restart 1 of 3: starting the 2 ranks again'
    """
    return f"gpurig run: restart {count} of {max_restarts}: starting the {nprocs} rank{'s' * (nprocs != 1)} again"


def without_lost_hosts(host_list: list[tuple[str, int]], nprocs: int, env: dict,
                       mpi_args: str = "") -> tuple[list[tuple[str, int]], int]:
    """The hosts where mpirun can still start ranks, and the ranks they hold (at most ``nprocs``); one line per
    host dropped. All of them gone: the list as it was (the restart then fails, naming the first).

    >>> without_lost_hosts([("localhost", 2), ("127.0.0.1", 2)], 4, dict(os.environ))
    ([('localhost', 2), ('127.0.0.1', 2)], 4)
    """
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(host_list)) as pool:
        why = dict(zip((host for host, _ in host_list),
                       pool.map(lambda entry: cannot_start_on(entry[0], env, mpi_args), host_list)))
    for host in [host for host, reason in why.items() if reason is not None]:
        why[host] = cannot_start_on(host, env, mpi_args)   # once more, alone: two mpiruns at once can trip PMIx
    remaining = [(host, slots) for host, slots in host_list if why[host] is None]
    if not remaining or len(remaining) == len(host_list):
        return host_list, nprocs
    fewer = min(nprocs, sum(slots for _, slots in remaining))
    for host, reason in why.items():
        if reason is not None:
            print(f"gpurig run: host {host} is gone ({reason}): the job goes on without it", file=sys.stderr,
                  flush=True)
    return remaining, fewer


class _Standby:
    """The next attempt, started ``STANDBY_DELAY_S`` seconds from now (or when it is needed, if that is sooner).

    It is started on a thread of its own that lives as long as the job: Linux sends a child its parent-death
    signal when the *thread* that started it ends (``PR_SET_PDEATHSIG``).
    """

    def __init__(self, start, job_over: threading.Event):
        self._start, self._attempt, self._wanted = start, None, threading.Event()
        self._ready, self._job_over = threading.Event(), job_over
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        self._wanted.wait(STANDBY_DELAY_S)
        try:
            start = self._start
            if start is not None and not self._job_over.is_set():
                self._attempt = start()
        finally:
            self._ready.set()
        self._job_over.wait()

    def take(self):
        """The attempt, started now if the delay has not passed yet; started again if a rank of it has ended
        while it waited (killed, out of memory): a restart is not spent on ranks that are gone."""
        self._wanted.set()
        self._ready.wait()
        if self._attempt is not None and not self._attempt.alive():
            self._attempt.discard()
            self._attempt = self._start()
        return self._attempt

    def discard(self) -> None:
        """Never needed: stop it if it started."""
        self._start = None
        self._wanted.set()
        self._ready.wait()
        if self._attempt is not None:
            self._attempt.discard()


def _attempt_env(env: dict, parked: bool) -> tuple[str, dict]:
    """A new status directory for one attempt, and the ranks' environment naming it (and, for parked ranks,
    the file whose appearance releases them)."""
    status_dir = tempfile.mkdtemp(prefix="gpurig-run-")
    base = {**env, STATUS_DIR_VARIABLE: status_dir}
    if parked:
        base[PARK_VARIABLE] = os.path.join(status_dir, "go")
    return status_dir, base


@dataclass
class _LocalAttempt:
    """One start of a job's torch ranks here: started at once, or parked (:mod:`gpurig.launch.standby`)."""

    procs: list
    envs: list
    status_dir: str

    @classmethod
    def start(cls, command, nprocs, env, master, node, parked: bool = False) -> "_LocalAttempt":
        status_dir, base = _attempt_env(env, parked)
        envs = local_torch_envs(base, nprocs, *master, *node)  # a fresh port each attempt: the last one's may linger
        return cls(start_local(command, envs), envs, status_dir)

    def release(self) -> None:
        """Let parked ranks run (nothing for ranks started at once)."""
        release(os.path.join(self.status_dir, "go"))

    def alive(self) -> bool:
        """Whether every rank is still running and none has reported a failure."""
        return all(p.poll() is None for p in self.procs) and first_failure(self.status_dir) is None

    def wait(self):
        """The attempt's first failure, or None; its status directory is removed."""
        try:
            with termination_as_interrupt():
                failure = watch_local(self.procs, self.envs)
            return failure and (first_failure(self.status_dir) or failure)
        finally:
            shutil.rmtree(self.status_dir, ignore_errors=True)

    def discard(self) -> None:
        """Stop ranks that were never needed (they wait before the program began) and remove their directory."""
        stop(self.procs)
        shutil.rmtree(self.status_dir, ignore_errors=True)


@dataclass
class _MpiAttempt:
    """One start of a job's MPI ranks (one mpirun): started at once, or parked (:mod:`gpurig.launch.standby`)."""

    job: Mpirun
    line: list
    env: dict
    status_dir: str

    @classmethod
    def start(cls, command, nprocs, host_list, env, mpi_args, parked: bool = False) -> "_MpiAttempt":
        status_dir, base = _attempt_env(env, parked)
        line, env = mpirun_job(command, nprocs, host_list, base, mpi_args)
        return cls(Mpirun(line, env), line, env, status_dir)

    def release(self) -> None:
        """Let parked ranks run (nothing for ranks started at once)."""
        release(os.path.join(self.status_dir, "go"))

    def alive(self) -> bool:
        """Whether its mpirun is still running and no rank has reported a failure."""
        return self.job.proc.poll() is None and first_failure(self.status_dir) is None

    def wait(self):
        """The attempt's first failure, or None; its status directory is removed."""
        try:
            with termination_as_interrupt():
                failure = run_line(self.line, self.env, started=self.job)
            return failure and (first_failure(self.status_dir) or failure)
        finally:
            shutil.rmtree(self.status_dir, ignore_errors=True)

    def discard(self) -> None:
        """End a job that was never needed (its ranks wait before the program began); remove its directory."""
        self.job.discard()
        shutil.rmtree(self.status_dir, ignore_errors=True)


def _run_once(command, nprocs, engine, host_list, env, mpi_args, master, node):
    """One attempt of the job: (the first failure or None, how many other ranks were stopped)."""
    with tempfile.TemporaryDirectory(prefix="gpurig-run-", ignore_cleanup_errors=True) as status_dir, \
            termination_as_interrupt():
        env = {**env, STATUS_DIR_VARIABLE: status_dir}
        if engine == "mpi":
            failure, others = run_mpirun(command, nprocs, host_list, env, mpi_args), nprocs - 1
        elif srun_step(env):
            failure, others = run_local(command, [srun_torch_env(env)]), 0
        else:  # a fresh port each attempt: the last one's store may linger
            failure, others = run_local(command, local_torch_envs(env, nprocs, *master, *node)), nprocs - 1
        if failure is not None:
            failure = first_failure(status_dir) or failure
    return failure, others


def summary(failure: RankFailed, others: int) -> str:
    """The one line ``gpurig run`` ends a failed job with.

    >>> summary(RankFailed(1, "node1", 3), others=3)
    'gpurig run: rank 1 on host node1 exited with code 3; stopped the other 3 ranks'
    """
    if failure.rank is None:
        return f"gpurig run: the job failed (exit code {failure.exit_code}) and no rank reported how it ended"
    stopped = f"; stopped the other {others} rank{'s' * (others != 1)}" if others else ""
    return f"gpurig run: {failure}{stopped}"


@contextlib.contextmanager
def termination_as_interrupt():
    """SIGTERM and SIGHUP stop the job as Ctrl-C does (only the main thread can catch signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise Terminated(signum)

    previous = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
