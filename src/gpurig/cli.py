"""The ``gpurig`` command: parse, dispatch, print. Logic lives in the verb modules.

Each subcommand is one ``_add_<verb>(subparsers)`` function that builds its
parser and names its handler (``handler=`` in the parser's defaults); adding a
verb means adding its function to :data:`SUBCOMMANDS`. Every user error ends as
one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from gpurig import __version__, cli_bench, cli_doctor, cli_emulate, cli_plan, cli_predict, cli_train
from gpurig.errors import UsageError

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
tensor memory for the next step instead of faulting in fresh pages; unless set) and, with
--engine torch, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. "python" in COMMAND means the Python gpurig runs in.

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


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake on the command line is one UsageError line instead of usage text."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def _add_run(subparsers) -> None:
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
    p.set_defaults(handler=_run)


def add_reliability_flags(p) -> None:
    """``--iface``, ``--failure-timeout``, ``--stall-timeout`` (``gpurig run`` and ``gpurig train``)."""
    p.add_argument("--iface", default=None, metavar="NAME",
                   help="network interface the job's sockets use (default: loopback when every rank runs here)")
    p.add_argument("--failure-timeout", default=None, metavar="S",
                   help="report a rank that stopped responding within S seconds (default 10; 0: off)")
    p.add_argument("--stall-timeout", default=None, metavar="S",
                   help="report ranks waiting at a collective that others have not reached after S seconds "
                        "(default 60; 0: off)")


def reliability_env(args) -> dict:
    """The ranks' environment with the settings the flags of :func:`add_reliability_flags` ask for.

    >>> reliability_env(build_parser().parse_args(["run", "--failure-timeout", "4", "--", "x"]))["GPURIG_FAILURE_TIMEOUT"]
    '4.0'
    """
    from gpurig.launch.settings import job_environment, seconds

    return job_environment(**{field: None if getattr(args, field) is None else seconds(getattr(args, field), flag)
                              for flag, field in (("--failure-timeout", "failure_timeout"),
                                                  ("--stall-timeout", "stall_timeout"))})


def command_after_dashes(words: list[str], example: str) -> list[str]:
    """The command a verb runs on its ranks: what follows ``--`` (refused as one line when empty).

    >>> command_after_dashes(["--", "python", "x.py"], "gpurig run -n 2 -- python x.py")
    ['python', 'x.py']
    """
    command = words[1:] if words[:1] == ["--"] else words
    if not command:
        raise UsageError(f"no command to run: {example}")
    return command


def _run(args) -> int:
    from gpurig import launch

    command = command_after_dashes(args.command, "gpurig run -n N -- python script.py")
    nprocs = args.nprocs if args.nprocs is not None else launch.default_nprocs(args.hosts)
    return launch.run_job(command, nprocs, engine=args.engine, hosts=args.hosts, mpi_args=args.mpi_args,
                          env=reliability_env(args), iface=args.iface)


SUBCOMMANDS = [cli_train.add_parser, _add_run, cli_emulate.add_parser, cli_plan.add_parser, cli_doctor.add_parser,
               cli_bench.add_parser, cli_predict.add_parser]


def build_parser() -> argparse.ArgumentParser:
    """The whole ``gpurig`` command line.

    >>> build_parser().parse_args(["run", "-n", "2", "--", "python", "x.py"]).command
    ['--', 'python', 'x.py']
    """
    parser = _Parser(
        prog="gpurig", description="Build, measure, predict and run multi-GPU deep learning.",
        epilog="examples:\n"
               "  gpurig train                      # the main job: data-parallel training on this machine\n"
               "  gpurig run -n 4 -- python my.py   # your own script on 4 ranks\n"
               "  gpurig plan --gpu 4x2080ti        # check a build against the hardware guide\n"
               "  gpurig doctor                     # what this machine is, and what is wrong with it\n"
               "  gpurig bench --quick              # measure links, GEMMs, loading, disk\n"
               "  gpurig <command> --help           # each command's flags",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"gpurig {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpurig`` console command; returns the exit code.

    >>> main(["run", "-n", "0", "--", "python", "x.py"])
    2
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not hasattr(args, "handler"):
            parser.print_help(sys.stderr)
            return 2
        return args.handler(args)
    except UsageError as error:
        print(f"gpurig: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpurig: interrupted", file=sys.stderr)
        return 130
    except SystemExit as done:  # --help, --version
        return done.code if isinstance(done.code, int) else 0 if done.code is None else 1


if __name__ == "__main__":
    sys.exit(main())
