"""The ``gpurig`` command: parse, dispatch, print. Logic lives in the verb modules.

Each verb is one module of this package whose ``add_parser(subparsers)`` builds
its parser and names its handler (``handler=`` in the parser's defaults); adding
a verb means adding its module's function to :data:`SUBCOMMANDS`. Every user error ends as
one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from gpurig import __version__
from gpurig.cli import bench, choose, doctor, emulate, plan, predict, run, train
from gpurig.cli.common import HelpFormatter
from gpurig.errors import Terminated, UsageError

class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake on the command line is one UsageError line instead of usage text."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


SUBCOMMANDS = [train.add_parser, run.add_parser, emulate.add_parser, plan.add_parser, doctor.add_parser,
               bench.add_parser, predict.add_parser, choose.add_parser]


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
               "  gpurig choose --model resnet50    # which GPUs to buy (or rent) for a model\n"
               "  gpurig <command> --help           # each command's flags",
        formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"gpurig {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    for command in subparsers.choices.values():
        command.set_defaults(_prog=command.prog)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpurig`` console command; returns the exit code.

    >>> main(["run", "-n", "0", "--", "python", "x.py"])
    2
    """
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:   # argparse would blame the top parser: point to the command's own help
            prog = getattr(args, "_prog", None) or parser.prog
            raise UsageError(f"unrecognized arguments: {' '.join(extra)} (see {prog} --help)")
        if not hasattr(args, "handler"):
            parser.print_help(sys.stderr)
            return 2
        return args.handler(args)
    except UsageError as error:
        print(f"gpurig: error: {error}", file=sys.stderr)
        return 2
    except Terminated as stopped:
        print(f"gpurig: {stopped}", file=sys.stderr)
        return stopped.exit_code
    except KeyboardInterrupt:
        print("gpurig: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `gpurig predict --json | head`: the reader left; as a shell tool, end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (the interpreter flushes stdout at exit)
        return 141
    except SystemExit as done:  # --help, --version
        return done.code if isinstance(done.code, int) else 0 if done.code is None else 1


if __name__ == "__main__":
    sys.exit(main())
