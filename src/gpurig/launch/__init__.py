"""Launching: ``gpurig run`` — N ranks through mpirun or a local spawn, SLURM-aware, never a hang on failure.

>>> from gpurig.launch import run_job
>>> run_job(["true"], 2, engine="torch")
0
"""

from gpurig.launch.hosts import expand_hostlist, parse_hosts
from gpurig.launch.job import ENGINES, default_nprocs, run_job

__all__ = ["run_job", "parse_hosts", "expand_hostlist", "default_nprocs", "ENGINES"]
