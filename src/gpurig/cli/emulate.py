"""``gpurig emulate``: run a job on several emulated nodes joined by a slow network, then clean up."""

from __future__ import annotations

import argparse
import os

from gpurig.cli.common import HelpFormatter

EPILOG = """\
examples:
  gpurig emulate --nodes 2 --rate 1gbit -- gpurig train --compression int8
  gpurig emulate --nodes 4 --rate 10gbit --engine torch -- python my_script.py
  gpurig emulate --nodes 2 --max-restarts 3 -- gpurig train --checkpoint-every 5   # a failed job starts again

Each node is a Linux network namespace with its own hostname; links are limited
with tc (real TCP through a real limit; no added latency). Needs root, iproute2
and util-linux. The namespaces are removed when the job ends, also after a
failure or Ctrl-C (or SIGTERM). Inside the job, `gpurig train` takes its ranks
from the emulated nodes: pass the job's own command after -- (the program
itself, not `gpurig run`: each rank is started already).
"""


MOST_NODES = 64
MOST_PER_NODE = 64


def add_parser(subparsers) -> None:
    """Register ``gpurig emulate``."""
    p = subparsers.add_parser(
        "emulate", help="run a job on N emulated nodes joined by a rate-limited network (needs root)",
        description="Bring up N network namespaces joined by links limited to RATE, run COMMAND with "
                    "RANKS-PER-NODE ranks on each over the chosen engine, and tear everything down.",
        epilog=EPILOG, formatter_class=HelpFormatter)
    p.add_argument("--nodes", type=int, default=2, help="emulated machines (default 2)")
    p.add_argument("--rate", default="1gbit", help="link rate, tc syntax: 1gbit (default), 10gbit, 100mbit")
    p.add_argument("--ranks-per-node", type=int, default=1, help="ranks on each node (default 1)")
    p.add_argument("--engine", default="mpi", help="mpi (default) or torch")
    p.add_argument("--max-restarts", type=int, default=0, metavar="K",
                   help="start the job again after a failure, up to K times (MPI: on the nodes that remain)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs, after --")
    p.set_defaults(handler=run)


def run(args) -> int:
    """Run ``gpurig emulate``; return the job's exit code."""
    from gpurig.cli.common import HelpFormatter, command_after_dashes
    from gpurig.errors import UsageError
    from gpurig.launch.emulator import Cluster, parse_rate
    from gpurig.launch.job import check_command, check_ranks_here, termination_as_interrupt

    command = command_after_dashes(args.command, "gpurig emulate --nodes 2 -- python script.py")
    if not 1 <= args.ranks_per_node <= MOST_PER_NODE:
        raise UsageError(f"--ranks-per-node must be from 1 to {MOST_PER_NODE}, got {args.ranks_per_node}")
    if not 2 <= args.nodes <= MOST_NODES:
        raise UsageError(f"--nodes must be from 2 to {MOST_NODES} (each is a network namespace here), got {args.nodes}")
    check_ranks_here(args.nodes * args.ranks_per_node, "every emulated node runs on this machine")
    if args.engine not in ("mpi", "torch"):
        raise UsageError(f"unknown engine {args.engine!r}: choose one of mpi, torch")
    parse_rate(args.rate)
    check_command(command, os.environ)   # every node is this machine: its files, its PATH
    if args.max_restarts < 0:
        raise UsageError(f"--max-restarts must be 0 or more, got {args.max_restarts}")
    # SIGTERM and SIGHUP (timeout, a closed terminal) stop it as Ctrl-C does: the job ends, the namespaces go
    with termination_as_interrupt(), Cluster(nodes=args.nodes, rate=args.rate) as cluster:
        return cluster.run(command, engine=args.engine, ranks_per_node=args.ranks_per_node,
                           max_restarts=args.max_restarts)
