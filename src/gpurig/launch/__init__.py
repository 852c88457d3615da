"""Launching: ``gpurig run`` — N ranks through mpirun or a local spawn, SLURM-aware, never a hang on failure."""

from gpurig.launch.hosts import default_nprocs, expand_hostlist, parse_hosts
from gpurig.launch.job import ENGINES, run_job

__all__ = ["run_job", "parse_hosts", "expand_hostlist", "default_nprocs", "ENGINES"]
