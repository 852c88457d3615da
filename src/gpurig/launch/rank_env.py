"""The environment gpurig's launcher gives each rank: the writing side of :mod:`gpurig.launch.env`.

Every rank gets
  GPURIG_ENGINE          ``mpi`` or ``torch``
  OMP_NUM_THREADS        cores // ranks on the host (at least 1), unless already set
  MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_
                         glibc's allocator keeps freed tensor memory for the next step (see HOST_ALLOCATOR),
                         unless already set
  GPURIG_RUN_STATUS_DIR  where a failing rank leaves its status file (set by :func:`gpurig.launch.run_job`)
  PATH                   this Python's directory first, so ``python`` means this Python
  TORCH_CPP_LOG_LEVEL    ERROR, unless already set (torch's C++ warnings only repeat gpurig's failure lines)
Every rank also gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT, as torchrun sets them, so a torchrun script runs unchanged on either engine:
torch ranks from here, MPI ranks from mpirun's own variables (OMPI_COMM_WORLD_RANK,
PMIX_RANK, ...) through the rank wrapper (:func:`gpurig.launch.env.torch_style_env`), with
MASTER_ADDR and MASTER_PORT from :func:`gpurig.launch.mpirun.run_mpirun`.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from gpurig.launch.hosts import expand_hostlist, tasks_per_node


def rank_path(env: dict) -> str:
    """The PATH ranks get: this Python's directory first, so that ``python`` means this Python.

    The rank wrapper applies it again: an ``mpirun`` started by its full path (Debian's ``/usr/bin/mpirun``)
    puts its own directory first in every rank's PATH, and ``python3`` there is the system's, without the
    packages of the venv that launched the job.

    >>> rank_path({"PATH": "/usr/bin"}).endswith(os.pathsep + "/usr/bin")
    True
    >>> rank_path({"PATH": rank_path({"PATH": "/usr/bin"})}) == rank_path({"PATH": "/usr/bin"})
    True
    """
    here, path = str(Path(sys.executable).parent), env.get("PATH", "")
    return path if path.split(os.pathsep)[0] == here else os.pathsep.join([here, path])


# glibc's malloc serves blocks above a moving threshold (128 KB at first) with a fresh mmap and returns
# memory at the top of its heap to the kernel, so a CPU step's activations come back as new pages every
# time: the first touch of each 4 KB page faults and the kernel zeroes it. A LeNet convolution over a
# 128-image batch takes 9 ms that way against 2.7 ms with the memory kept, and how often it happens depends on
# what the process allocated before (1-3x on the same layer). Blocks up to 32 MB (glibc's largest
# threshold) come from the heap, which is never trimmed: a rank keeps its peak memory, as PyTorch's CUDA
# caching allocator, jemalloc and tcmalloc do. benchmarks/host_allocator.py measures it.
HOST_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def host_defaults(base: dict, ranks_here: int) -> dict:
    """``base`` plus what a rank gets unless it is already set, for ``ranks_here`` ranks sharing this host's cores:
    OMP_NUM_THREADS, glibc's allocator (:data:`HOST_ALLOCATOR`), TORCH_CPP_LOG_LEVEL.

    >>> host_defaults({}, ranks_here=os.cpu_count())["OMP_NUM_THREADS"]
    '1'
    >>> host_defaults({"OMP_NUM_THREADS": "8"}, 2)["OMP_NUM_THREADS"]
    '8'
    >>> host_defaults({}, 1)["MALLOC_MMAP_THRESHOLD_"]
    '33554432'
    >>> host_defaults({"MALLOC_TRIM_THRESHOLD_": "0"}, 1)["MALLOC_TRIM_THRESHOLD_"]
    '0'
    """
    env = dict(base)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, ranks_here))))
    for name, value in HOST_ALLOCATOR.items():
        env.setdefault(name, value)
    # torch's C++ warnings repeat, with C++ stack frames, what gpurig's own failure line says (a peer's store
    # connection reset, a timed-out wait); errors still show.
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return env


def common_env(base: dict, engine: str, ranks_here: int) -> dict:
    """``base`` plus what every rank gets (:func:`host_defaults`, the engine, PATH), for ``ranks_here`` ranks
    sharing this host's cores.

    >>> env = common_env({"PATH": "/usr/bin"}, "mpi", ranks_here=2)
    >>> env["GPURIG_ENGINE"], env["PATH"].endswith(os.pathsep + "/usr/bin")
    ('mpi', True)
    """
    env = host_defaults(base, ranks_here)
    env["GPURIG_ENGINE"] = engine
    env["PATH"] = rank_path(base)
    return env


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now at ``address`` (for the torch rendezvous).

    >>> 0 < free_port() < 65536
    True
    """
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def local_torch_envs(base: dict, nprocs: int, master_addr: str = "127.0.0.1", master_port: int | None = None,
                     node_rank: int = 0, nnodes: int = 1) -> list[dict]:
    """One environment per rank for the ``nprocs`` torch ranks of node ``node_rank`` of ``nnodes``, like torchrun's
    (``master_port`` None: a free port of ``master_addr``, which must be this machine's then).

    >>> [e["RANK"] + "/" + e["WORLD_SIZE"] for e in local_torch_envs({}, 2)]
    ['0/2', '1/2']
    >>> [e["RANK"] + "/" + e["WORLD_SIZE"] for e in local_torch_envs({}, 2, "a", 29500, node_rank=1, nnodes=2)]
    ['2/4', '3/4']
    """
    port = master_port if master_port is not None else free_port(master_addr)
    shared = {**common_env(base, "torch", nprocs), "WORLD_SIZE": str(nprocs * nnodes), "LOCAL_WORLD_SIZE": str(nprocs),
              "MASTER_ADDR": master_addr, "MASTER_PORT": str(port), "GROUP_RANK": str(node_rank)}
    return [{**shared, "RANK": str(node_rank * nprocs + local), "LOCAL_RANK": str(local)} for local in range(nprocs)]


def srun_step(env: dict) -> tuple[int, int] | None:
    """``(rank, size)`` when this process is one task of an ``srun`` step of several tasks, else None.

    A batch script's shell also has SLURM_PROCID and SLURM_NTASKS, but no step
    variables: there ``gpurig run`` starts its ranks itself.

    >>> srun_step({"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_ID": "0"})
    (3, 8)
    >>> srun_step({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}) is None   # sbatch's shell
    True
    """
    in_step = any(name in env for name in ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS"))
    size = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    if not in_step or "SLURM_PROCID" not in env or int(size) < 2:
        return None
    return int(env["SLURM_PROCID"]), int(size)


def srun_torch_env(base: dict) -> dict:
    """The torch environment of the one rank this ``srun`` task runs; meet at the step's first node.

    >>> env = srun_torch_env({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_ID": "0",
    ...     "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    ...     "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "1234"})
    >>> [env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")]
    ['5', '8', '1', '4', 'gpu07', '21234']
    """
    rank, size = srun_step(base)
    counts = tasks_per_node(_first(base, "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
                                   "SLURM_TASKS_PER_NODE") or str(size))
    local_size = counts[min(int(base.get("SLURM_NODEID", 0)), len(counts) - 1)]
    nodes = expand_hostlist(_first(base, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") or "localhost")
    return {**common_env(base, "torch", local_size), "RANK": str(rank), "WORLD_SIZE": str(size),
            "LOCAL_RANK": base.get("SLURM_LOCALID", "0"), "LOCAL_WORLD_SIZE": str(local_size),
            "MASTER_ADDR": base.get("MASTER_ADDR") or nodes[0], "MASTER_PORT": base.get("MASTER_PORT") or _slurm_port(base)}


def _first(env: dict, *names: str) -> str | None:
    return next((env[name] for name in names if env.get(name)), None)


def _slurm_port(env: dict) -> str:
    """The same port on every task of a step, different for other jobs and steps."""
    step = env.get("SLURM_STEP_ID", "0")
    offset = int(env.get("SLURM_JOB_ID", "0")) + (int(step) if step.isdigit() else 0)
    return str(20000 + offset % 20000)
