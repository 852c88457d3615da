"""Where a rank learns who it is: the variables launchers set.

gpurig's own launcher, ``mpirun`` (Open MPI, MPICH), ``torchrun`` and SLURM's
``srun`` each name rank and size differently; this module reads them all, so
the engines and the rank wrapper stay free of launcher details.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchInfo:
    """Rank and size as the launcher announced them (None where it said nothing)."""

    rank: int | None
    size: int | None
    local_rank: int | None
    local_size: int | None


# torchrun's variable, and where each MPI launcher keeps the same fact (Open MPI, MPICH / Intel MPI's PMI).
TORCH_FROM_MPI = {
    "RANK": ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"),
    "WORLD_SIZE": ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
    "LOCAL_RANK": ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"),
    "LOCAL_WORLD_SIZE": ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"),
}
RANK_VARIABLES = ("RANK", *TORCH_FROM_MPI["RANK"], "SLURM_PROCID")
RESTART_VARIABLES = ("GPURIG_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")  # gpurig's, torchrun's
MAX_RESTARTS_VARIABLE = "TORCHELASTIC_MAX_RESTARTS"
RANK_HOST_VARIABLE = "GPURIG_RANK_HOST"  # the host a rank runs on where it is not this machine's name (an emulated node)


def slurm_count(value: str) -> int:
    """The first count of a SLURM per-node list such as ``SLURM_TASKS_PER_NODE``.

    >>> slurm_count("4(x2),2")
    4
    """
    return int(value.split("(")[0].split(",")[0])


def _first_int(env, names):
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            try:
                return slurm_count(value)
            except ValueError:
                continue
    return None


def rank_from_env(env=None) -> int | None:
    """This process's rank as any launcher announced it.

    >>> rank_from_env({"OMPI_COMM_WORLD_RANK": "3"})
    3
    """
    return _first_int(os.environ if env is None else env, RANK_VARIABLES)


def rank_host(env=None) -> str:
    """The host a rank runs on: this machine's name, or the emulated node's its launcher named
    (:data:`RANK_HOST_VARIABLE`: a rank of ``gpurig emulate --engine torch`` is watched from outside its node).

    >>> rank_host({RANK_HOST_VARIABLE: "node2"})
    'node2'
    """
    return (os.environ if env is None else env).get(RANK_HOST_VARIABLE) or socket.gethostname()


def size_from_env(env=None) -> int | None:
    """The job's number of ranks as any launcher announced it.

    >>> size_from_env({"OMPI_COMM_WORLD_SIZE": "4"}), size_from_env({})
    (4, None)
    """
    return _first_int(os.environ if env is None else env, [*TORCH_FROM_MPI["WORLD_SIZE"], "WORLD_SIZE"])


def restart_count(env=None) -> int:
    """How many times the launcher has started this job again (0 in the first attempt), under gpurig or torchrun.

    >>> restart_count({"TORCHELASTIC_RESTART_COUNT": "2"}), restart_count({})
    (2, 0)
    """
    env = os.environ if env is None else env
    return next((int(env[name]) for name in RESTART_VARIABLES if env.get(name, "").isdigit()), 0)


def torch_launch_info(env=None) -> LaunchInfo:
    """Rank/size from torchrun-style variables, else from SLURM.

    >>> torch_launch_info({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}).size
    4
    """
    env = os.environ if env is None else env
    return LaunchInfo(
        rank=_first_int(env, ["RANK", "SLURM_PROCID"]),
        size=_first_int(env, ["WORLD_SIZE", "SLURM_NTASKS"]),
        local_rank=_first_int(env, ["LOCAL_RANK", "SLURM_LOCALID"]),
        local_size=_first_int(env, ["LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]),
    )


def torch_style_env(env=None) -> dict:
    """torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE for a process an MPI launcher started, where they
    are not set already: so a torchrun script (``dist.init_process_group`` with env://) runs under mpirun unchanged.

    >>> torch_style_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    ...                  "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    {'RANK': '1', 'WORLD_SIZE': '2', 'LOCAL_RANK': '1', 'LOCAL_WORLD_SIZE': '2'}
    >>> torch_style_env({"RANK": "0", "OMPI_COMM_WORLD_RANK": "3"}), torch_style_env({})
    ({}, {})
    """
    env = os.environ if env is None else env
    if not launched_by_mpi(env):
        return {}
    out = {}
    for name, sources in TORCH_FROM_MPI.items():
        value = next((env[s] for s in sources if env.get(s)), None)
        if name not in env and value is not None:
            out[name] = value
    return out


def launched_by_mpi(env=None) -> bool:
    """True when an MPI launcher (Open MPI, MPICH, Intel MPI) started this process.

    >>> launched_by_mpi({"OMPI_COMM_WORLD_SIZE": "2"})
    True
    """
    env = os.environ if env is None else env
    return any(name in env for name in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS"))


def in_launched_job(env=None) -> bool:
    """True when a launcher started this process as one rank of a job of several, or as the one rank of a job
    ``gpurig run`` started (a job restarted on the one host that remains, ``gpurig run -n 1``).

    >>> in_launched_job({"OMPI_COMM_WORLD_SIZE": "4"}), in_launched_job({})
    (True, False)
    >>> in_launched_job({"OMPI_COMM_WORLD_SIZE": "1"}), in_launched_job({"OMPI_COMM_WORLD_SIZE": "1", "GPURIG_RUN_STATUS_DIR": "/tmp/x"})
    (False, True)
    """
    from gpurig.launch.status import STATUS_DIR_VARIABLE

    env = os.environ if env is None else env
    size = size_from_env(env)
    ours = size == 1 and bool(env.get(STATUS_DIR_VARIABLE))  # gpurig run's ranks name their status directory
    return size is not None and (size > 1 or ours) and (launched_by_mpi(env) or "RANK" in env)


def detect_engine(env=None) -> str:
    """The engine to use when the caller names none: ``GPURIG_ENGINE``, else guessed from the launcher.

    ``mpi`` under mpirun, ``torch`` under torchrun (RANK and WORLD_SIZE set, or a
    SLURM task), ``mpi`` for a single process started by hand.

    >>> detect_engine({"RANK": "0", "WORLD_SIZE": "2"})
    'torch'
    >>> detect_engine({})
    'mpi'
    """
    env = os.environ if env is None else env
    if env.get("GPURIG_ENGINE"):
        return env["GPURIG_ENGINE"]
    if launched_by_mpi(env):
        return "mpi"
    if "RANK" in env and "WORLD_SIZE" in env:
        return "torch"
    return "mpi"
