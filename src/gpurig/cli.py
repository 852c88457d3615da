"""The ``gpurig`` command: parse, dispatch, print. Logic lives in the verb modules.

Every user error ends as one line on stderr and exit code 2 (argparse's own
convention), never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from gpurig import __version__
from gpurig.errors import UsageError

RUN_EPILOG = """\
examples:
  gpurig run -n 4 -- python train.py                 # 4 local ranks over MPI (mpirun)
  gpurig run -n 2 --engine torch -- python train.py  # torch.distributed, spawned like torchrun
  gpurig run --hosts a:4,b:4 -- python train.py      # 8 ranks on two machines (MPI)
  srun -N2 --ntasks-per-node=4 gpurig run --engine torch -- python train.py   # under SLURM

If any rank exits non-zero, the others are stopped and gpurig run exits with
that rank's code, naming the rank and its host.
"""


def _add_run(subparsers) -> None:
    p = subparsers.add_parser(
        "run", help="launch your own script on N ranks (like horovodrun / torchrun)",
        description="Launch COMMAND on N ranks. Inside, gpurig.init() finds its rank and engine.",
        epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--nprocs", type=int, default=None,
                   help="number of ranks (default: all --hosts slots, else one per GPU, else 2)")
    p.add_argument("--hosts", default=None, help="HOST:SLOTS,... e.g. a:4,b:4 (MPI engine)")
    p.add_argument("--engine", default="mpi", help="mpi (default; mpirun) or torch (torch.distributed)")
    p.add_argument("--mpi-args", default="", help='extra mpirun arguments, e.g. "--mca btl tcp,self"')
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs, after --")
    p.set_defaults(handler=_run)


def _run(args) -> int:
    from gpurig import launch

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    nprocs = args.nprocs if args.nprocs is not None else launch.default_nprocs(args.hosts)
    return launch.run_job(command, nprocs, engine=args.engine, hosts=args.hosts, mpi_args=args.mpi_args)


def build_parser() -> argparse.ArgumentParser:
    """The whole ``gpurig`` command line."""
    from gpurig import cli_train

    parser = argparse.ArgumentParser(
        prog="gpurig", description="Build, measure, predict and run multi-GPU deep learning.",
        epilog="examples:\n  gpurig train                      # the main job: data-parallel training on this machine\n"
               "  gpurig run -n 4 -- python my.py   # your own script on 4 ranks\n"
               "  gpurig <command> --help           # each command's flags",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"gpurig {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    cli_train.add_parser(subparsers)
    _add_run(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpurig`` console command; returns the exit code.

    >>> main(["--version"])      # doctest: +SKIP
    gpurig 0.1.0
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except UsageError as e:
        print(f"gpurig: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpurig: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
