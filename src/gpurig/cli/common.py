"""What several verbs share on the command line: the reliability flags and the command after ``--``.

>>> import argparse; p = argparse.ArgumentParser(); add_reliability_flags(p)
>>> reliability_env(p.parse_args(["--failure-timeout", "4"]))["GPURIG_FAILURE_TIMEOUT"]
'4.0'
"""

from __future__ import annotations

from gpurig.errors import UsageError

# From this terminal width on, tables show every column; below it (80 columns) each verb keeps its key numbers
# whole and leaves the rest out.
WIDE_COLUMNS = 120


def add_reliability_flags(p) -> None:
    """``--iface``, ``--failure-timeout``, ``--stall-timeout`` (``gpurig run`` and ``gpurig train``)."""
    p.add_argument("--iface", default=None, metavar="NAME",
                   help="network interface the job's sockets use: Gloo (GLOO_SOCKET_IFNAME), NCCL (NCCL_SOCKET_IFNAME), "
                        "Open MPI, the rendezvous and side channel (default: loopback when every rank runs here)")
    p.add_argument("--failure-timeout", default=None, metavar="S",
                   help="report a rank that stopped responding within S seconds (default 10; 0: off)")
    p.add_argument("--stall-timeout", default=None, metavar="S",
                   help="report ranks waiting at a collective that others have not reached after S seconds "
                        "(default 60; 0: off)")


def add_restart_flags(p) -> None:
    """``--max-restarts`` (torchrun's name; ``gpurig run`` and ``gpurig train``)."""
    p.add_argument("--max-restarts", "--max_restarts", type=int, default=0, metavar="K",
                   help="when a rank dies or stops responding, end the job as always, then start it again, up to K "
                        "times (default 0); ranks see GPURIG_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT")


def reliability_env(args) -> dict:
    """The ranks' environment with the settings the flags of :func:`add_reliability_flags` ask for.

    >>> import argparse; p = argparse.ArgumentParser(); add_reliability_flags(p)
    >>> reliability_env(p.parse_args(["--stall-timeout", "30"]))["GPURIG_STALL_TIMEOUT"]
    '30.0'
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
