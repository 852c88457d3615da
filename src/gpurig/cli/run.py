"""``gpurig run``: launch your own script on N ranks (like ``horovodrun`` / ``torchrun``); the work is :mod:`gpurig.launch`."""

from __future__ import annotations

import argparse

from gpurig.cli.common import add_reliability_flags, command_after_dashes, reliability_env

RUN_EPILOG = """\
examples:
  gpurig run -n 4 -- python train.py                 # 4 local ranks over MPI (mpirun)
  gpurig run -n 2 --engine torch -- python train.py  # torch.distributed ranks, spawned as torchrun does
  gpurig run --hosts a:4,b:4 -- python train.py      # 8 ranks on two machines (MPI)
  gpurig run -n 2 --mpi-args "--mca btl tcp,self" -- python train.py
  srun -K -N2 --ntasks-per-node=4 gpurig run --engine torch -- python train.py   # under SLURM

Inside COMMAND, gpurig.init() finds the engine and its rank. Each rank gets
GPURIG_ENGINE, OMP_NUM_THREADS (cores / ranks on the host, unless set),
MALLOC_MMAP_THRESHOLD_=33554432 and MALLOC_TRIM_THRESHOLD_=2^40 (glibc keeps freed
tensor memory for the next step instead of faulting in fresh pages; unless set) and, on
either engine, torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT: a torchrun script runs unchanged. "python" in COMMAND means the Python gpurig
runs in.

If a rank exits non-zero or is killed, the others are stopped within seconds and
gpurig run exits with that rank's code (128 + signal number for a signal), naming
the rank, its host and the collective it was in, in one line. A rank that stops
(SIGSTOP, a hang holding the GIL) is found within --failure-timeout seconds by
the others' heartbeat watch (ranks that called gpurig.init()); ranks waiting at a
collective that others have not reached are reported after --stall-timeout.
Ctrl-C stops every rank. Under srun, pass -K (--kill-on-bad-exit) so that SLURM
stops the other tasks when one fails.

The job's sockets stay on --iface, or on loopback when every rank runs here
(Open MPI's runtime daemon, prterun, listens on every interface regardless).
"""

def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "run", help="launch your own script on N ranks (like horovodrun / torchrun)",
        description="Launch COMMAND on N ranks, over MPI (mpirun) or torch.distributed.",
        epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--nprocs", type=int, default=None, metavar="N",
                   help="number of ranks (default: all --hosts slots, else one per GPU, else 2)")
    p.add_argument("--hosts", default=None, metavar="HOST:SLOTS,...",
                   help="machines and their slots, e.g. a:4,b:4 (--engine mpi; torch runs on this machine)")
    p.add_argument("--engine", default="mpi", choices=["mpi", "torch"],
                   help="mpi (default: mpirun, mpi4py) or torch (torch.distributed: NCCL on GPUs, Gloo on CPU)")
    p.add_argument("--mpi-args", default="", metavar="ARGS",
                   help='extra mpirun arguments, e.g. "--mca btl tcp,self" (one flag alone: --mpi-args=--quiet)')
    add_reliability_flags(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs, after --")
    p.set_defaults(handler=run)


def run(args) -> int:
    from gpurig import launch

    command = command_after_dashes(args.command, "gpurig run -n N -- python script.py")
    nprocs = args.nprocs if args.nprocs is not None else launch.default_nprocs(args.hosts)
    return launch.run_job(command, nprocs, engine=args.engine, hosts=args.hosts, mpi_args=args.mpi_args,
                          env=reliability_env(args), iface=args.iface)
