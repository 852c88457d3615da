"""What several verbs share on the command line: the reliability flags, the command after ``--``, the --plot file.

>>> import argparse; p = argparse.ArgumentParser(); add_reliability_flags(p)
>>> reliability_env(p.parse_args(["--failure-timeout", "4"]))["GPURIG_FAILURE_TIMEOUT"]
'4.0'
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import textwrap
from pathlib import Path

from gpurig.errors import UsageError, check_writable

# From this terminal width on, tables show every column; below it (80 columns) each verb keeps its key numbers
# whole and leaves the rest out.
WIDE_COLUMNS = 120


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help with the description and the examples as written, each line too long for the terminal
    wrapped: a paragraph under its own indent, an example's comment under the comment's column.

    >>> HelpFormatter("gpurig", width=60)._fill_text("  gpurig train --epochs 8   # continue to epoch 8 from "
    ...                                               "the last checkpoint", 60, "").splitlines()
    ['  gpurig train --epochs 8   # continue to epoch 8 from the', '                              last checkpoint']
    """

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for line in text.splitlines():
            line = indent + line
            if len(line) <= width:
                out.append(line)
                continue
            lead = len(line) - len(line.lstrip())
            comment = re.search(r"\s#\s", line)
            hang = comment.end() if comment and comment.end() < width - 20 else lead + (2 if lead else 0)
            out.extend(textwrap.wrap(line.strip(), width, initial_indent=" " * lead, subsequent_indent=" " * hang,
                                     break_on_hyphens=False, break_long_words=False))
        return "\n".join(out)


def figures(value: float) -> str:
    """A rate or a price as a table shows it: whole from 100, two decimals from 1, three figures below (a 20 B
    model's 0.48 samples/s is not "0").

    >>> figures(1234.5), figures(4.256), figures(0.4815)
    ('1,234', '4.26', '0.481')
    """
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}" if value >= 1 else f"{value:.3g}"


def users_prints_aside(json_output: bool):
    """With ``--json``, whatever the user's model prints (on import, in its factory, in forward) goes to stderr, so
    that stdout holds the JSON alone; otherwise nothing changes.

    >>> with users_prints_aside(True):
    ...     print("building model")      # on stderr
    """
    return contextlib.redirect_stdout(sys.stderr) if json_output else contextlib.nullcontext()


def check_plot_path(path: str, flag: str = "--plot") -> None:
    """A plot file ``flag`` will write, checked before the work that draws it: a file name (not a directory) whose
    ending is a format matplotlib writes, in a directory that exists and is writable.

    >>> check_plot_path("speedup.txt")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --plot speedup.txt: matplotlib cannot write .txt; end the name with .png, .pdf or .svg (or one of ..., eps, ...)
    """
    if not path:
        raise UsageError(f"{flag} '': want a file name, such as speedup.png")
    if Path(path).is_dir():
        raise UsageError(f"{flag} {path}: is a directory; want a file name, such as {Path(path) / 'speedup.png'}")
    ending = Path(path).suffix.lower().lstrip(".")
    formats = plot_formats()
    if ending not in formats:
        problem = f"matplotlib cannot write {Path(path).suffix}" if ending else "no ending to name the format"
        others = ", ".join(f for f in formats if f not in ("png", "pdf", "svg"))
        raise UsageError(f"{flag} {path}: {problem}; end the name with .png, .pdf or .svg (or one of {others})")
    check_writable(path, flag)


def plot_formats() -> list[str]:
    """The file endings matplotlib's Agg canvas writes, sorted; pgf left out (it runs a LaTeX install).

    >>> {"png", "pdf", "svg"} <= set(plot_formats()), "pgf" in plot_formats()
    (True, False)
    """
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(f for f in FigureCanvasBase.get_supported_filetypes() if f != "pgf")


def add_reliability_flags(p) -> None:
    """``--iface``, ``--failure-timeout``, ``--stall-timeout``, ``--stall-shutdown`` (``gpurig run`` and ``gpurig train``)."""
    p.add_argument("--iface", default=None, metavar="NAME",
                   help="network interface the job's sockets use: Gloo (GLOO_SOCKET_IFNAME), NCCL (NCCL_SOCKET_IFNAME), "
                        "Open MPI, the rendezvous and side channel (default: loopback when every rank runs here)")
    p.add_argument("--failure-timeout", default=None, metavar="S",
                   help="report a rank that stopped responding within S seconds (default 10; 0: off)")
    p.add_argument("--stall-timeout", default=None, metavar="S",
                   help="report ranks waiting at a collective that others have not reached after S seconds "
                        "(default 60; 0: off)")
    p.add_argument("--stall-shutdown", default=None, metavar="S",
                   help="end the job, naming the ranks that have not reached the collective, once the others have "
                        "waited S seconds there (default 0: only report, since a rank may be in a long computation "
                        "and a stuck one can still be inspected, e.g. with py-spy)")


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
                                                  ("--stall-timeout", "stall_timeout"),
                                                  ("--stall-shutdown", "stall_shutdown"))})


def command_after_dashes(words: list[str], example: str) -> list[str]:
    """The command a verb runs on its ranks: what follows ``--`` (refused as one line when empty).

    >>> command_after_dashes(["--", "python", "x.py"], "gpurig run -n 2 -- python x.py")
    ['python', 'x.py']
    """
    command = words[1:] if words[:1] == ["--"] else words
    if not command:
        raise UsageError(f"no command to run: {example}")
    return command
