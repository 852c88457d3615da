"""``gpurig run``: launch your own script on N ranks (like ``horovodrun`` / ``torchrun``); the work is :mod:`gpurig.launch`."""

from __future__ import annotations

import argparse

from gpurig.cli.common import HelpFormatter, add_reliability_flags, add_restart_flags, command_after_dashes, reliability_env

RUN_EPILOG = """\
examples:
  gpurig run -n 4 -- python train.py                 # 4 local ranks over MPI (mpirun)
  gpurig run -n 2 --engine torch -- python train.py  # torch.distributed ranks, spawned as torchrun does
  gpurig run --hosts a:4,b:4 -- python train.py      # 8 ranks on two machines (MPI)
  gpurig run -n 2 --mpi-args "--mca btl tcp,self" -- python train.py
  srun -K -N2 --ntasks-per-node=4 gpurig run --engine torch -- python train.py   # under SLURM
  gpurig run -np 8 -H a:4,b:4 -- python train.py     # Horovod's flags (also --hostfile, 'HOST slots=N' lines)
  gpurig run --engine torch --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr a -- python train.py
                                                     # torchrun's: one gpurig run per machine (--node-rank 1 on b)
  gpurig run -n 2 --max-restarts 3 -- python train.py   # start the job again when a rank dies or stops (3 times)
  gpurig run -n 2 --log-dir logs -- python train.py  # each rank's output also in logs/rank-R.log

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

With --max-restarts K the job is then started again, up to K times, on the same
ranks (MPI: without hosts that are gone); each rank sees GPURIG_RESTART_COUNT and
TORCHELASTIC_RESTART_COUNT (torchrun's) and resumes from its own checkpoints
(gpurig train does so by itself; its --checkpoint-every STEPS bounds what is lost
to STEPS steps). While an attempt runs, the next one's ranks wait ready, their
imports done, so a restart costs the program's own start only (Python ranks,
every rank on this machine).

A timeline (Horovod's, as a Chrome trace for ui.perfetto.dev): in your script,
`with gpurig.timeline("trace.json") as t:` around the loop records every rank's
DataParallel buckets, and `with t.span("forward"):` your own phases (gpurig train
--timeline does it for its models).

At a terminal each line a rank prints begins with [rankR]: (--tag-output forces it,
--no-tag-output turns it off); --log-dir DIR also keeps each rank's lines in
DIR/rank-R.log.

The job's sockets stay on --iface (Gloo: GLOO_SOCKET_IFNAME, NCCL: NCCL_SOCKET_IFNAME,
Open MPI, the rendezvous), or on loopback when every rank runs here (Open MPI's
runtime daemon, prterun, listens on every interface regardless).
"""

def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "run", help="launch your own script on N ranks (like horovodrun / torchrun)",
        description="Launch COMMAND on N ranks, over MPI (mpirun) or torch.distributed.",
        epilog=RUN_EPILOG, formatter_class=HelpFormatter)
    p.add_argument("-n", "-np", "--nprocs", type=int, default=None, metavar="N",
                   help="number of ranks (default: all --hosts slots, else one per GPU, else 2)")
    p.add_argument("-H", "--hosts", default=None, metavar="HOST:SLOTS,...",
                   help="machines and their slots, e.g. a:4,b:4 (--engine mpi; torch runs on this machine)")
    p.add_argument("--hostfile", default=None, metavar="FILE",
                   help="machines from a file of 'HOST slots=N' lines, as Horovod and Open MPI read them")
    p.add_argument("--engine", default="mpi", choices=["mpi", "torch"],
                   help="mpi (default: mpirun, mpi4py) or torch (torch.distributed: NCCL on GPUs, Gloo on CPU)")
    p.add_argument("--mpi-args", default="", metavar="ARGS",
                   help='extra mpirun arguments, e.g. "--mca btl tcp,self" (one flag alone: --mpi-args=--quiet)')
    torchrun = p.add_argument_group("torchrun's flags", "the same meaning as in torchrun (static rendezvous)")
    torchrun.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=None, metavar="N",
                          help="ranks per machine (mpi: on each --hosts machine)")
    torchrun.add_argument("--nnodes", type=int, default=None, metavar="M",
                          help="machines, each running its own gpurig run (--engine torch; mpi: as many as --hosts)")
    torchrun.add_argument("--node-rank", "--node_rank", type=int, default=None, metavar="K",
                          help="this machine's number, 0 to M-1 (--engine torch)")
    torchrun.add_argument("--master-addr", "--master_addr", default=None, metavar="ADDR",
                          help="node 0's address, where the ranks meet (MASTER_ADDR)")
    torchrun.add_argument("--master-port", "--master_port", type=int, default=None, metavar="PORT",
                          help="the port there (MASTER_PORT; default: a free one on one machine, else 29500)")
    add_reliability_flags(p)
    add_restart_flags(p)
    p.add_argument("--log-dir", default=None, metavar="DIR",
                   help="also write each rank's output to DIR/rank-R.log")
    p.add_argument("--tag-output", default=None, action=argparse.BooleanOptionalAction,
                   help="begin each line a rank prints with [rankR]: (default: when the output is a terminal)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs, after --")
    p.set_defaults(handler=run)


def check_not_a_rank(env=None) -> None:
    """Refuse to start a job from inside one: each rank would start a job of its own (two jobs that never talk,
    none over ``gpurig emulate``'s links), or one rank would wait for peers that never come.

    >>> check_not_a_rank({})
    >>> check_not_a_rank({"RANK": "1", "WORLD_SIZE": "2"})
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: this process is already rank 1 of a job of 2: run the program itself here, not gpurig run (under gpurig emulate: gpurig emulate -- python script.py); left over from another job, unset RANK and WORLD_SIZE
    """
    import os

    from gpurig.errors import UsageError
    from gpurig.launch.env import in_launched_job, launched_by_mpi, rank_from_env, size_from_env

    env = os.environ if env is None else env
    if in_launched_job(env):
        torch_style = [n for n in ("RANK", "WORLD_SIZE") if n in env]
        left_over = "" if launched_by_mpi(env) else f"; left over from another job, unset {' and '.join(torch_style)}"
        raise UsageError(f"this process is already rank {rank_from_env(env)} of a job of {size_from_env(env)}: run "
                         f"the program itself here, not gpurig run (under gpurig emulate: gpurig emulate -- python "
                         f"script.py){left_over}")


def run(args) -> int:
    import sys

    from gpurig import launch
    from gpurig.launch.layout import layout_from_flags
    from gpurig.launch.output import output_env

    from gpurig.errors import UsageError

    command = command_after_dashes(args.command, "gpurig run -n N -- python script.py")
    check_not_a_rank()
    for value, flag in ((args.master_addr, "--master-addr"), (args.log_dir, "--log-dir")):
        if value is not None and not value.strip():
            raise UsageError(f"{flag} '': give a value or leave the flag out")
    layout = layout_from_flags(args.engine, args.nprocs, args.hosts, args.hostfile, args.nproc_per_node, args.nnodes,
                               args.node_rank, args.master_addr, args.master_port, launch.default_nprocs)
    tag = args.tag_output if args.tag_output is not None else sys.stdout.isatty()
    env = output_env(reliability_env(args), args.log_dir, tag)
    return launch.run_job(command, layout.nprocs, engine=args.engine, hosts=layout.hosts, mpi_args=args.mpi_args,
                          env=env, iface=args.iface, master_addr=layout.master_addr, master_port=layout.master_port,
                          nnodes=layout.nnodes, node_rank=layout.node_rank, max_restarts=args.max_restarts)
