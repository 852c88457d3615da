"""Open MPI's failure reports: read back for the rank they name, kept off the user's screen.

When a job fails, Open MPI prints framed blocks on mpirun's stderr ("MPI_ABORT was
invoked on rank 1 ...", "prterun noticed that process rank 0 ... exited on signal
9"). gpurig's one summary line says the same, so these blocks are dropped from the
relayed stderr; every other line, the ranks' own stderr included, passes at once.
What a block says is kept: it names the failed rank even when no status file could
be written (a rank on another host, or a wrapper that was itself killed).
"""

from __future__ import annotations

import codecs
import re
from typing import BinaryIO, TextIO

from gpurig.errors import RankFailed

_RULE = re.compile(r"-{20,}\s*")
_FAILURE_REPORT = re.compile(r"MPI_ABORT was invoked|\S+ (has exited due to process|noticed that process|detected "
                             r"that one or more processes)|Primary job\s+terminated normally|An MPI communication peer "
                             r"process has unexpectedly disconnected")
# What Open MPI's fatal error handler prints, a line at a time, on a rank whose peer went away (TCP between hosts:
# "[node1:00000] *** An error occurred in Socket closed"): the rank that failed first is what gpurig's line names.
_FATAL_HANDLER = re.compile(r"\[[^\]\s]+:\d+\] \*\*\* ")
# What mpirun says when told to stop (gpurig's launcher passing on a SIGTERM): an instruction for the user at a
# terminal that gpurig's own line ("gpurig: stopped by SIGTERM") replaces.
_ABORTING = re.compile(r"\s*Abort is in progress\.\.\.hit ctrl-c again to forcibly terminate\s*")
_LONGEST_REPORT = 40

_READINGS = [  # (pattern on the block joined into one line, how to read rank / host / returncode from it)
    (re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)"),
     lambda m: RankFailed(int(m[1]), m[2], -int(m[3]))),
    (re.compile(r"Process name: (\S+) Exit code: (\d+)"),
     lambda m: RankFailed(int(re.findall(r"\d+", m[1])[-1]), None, int(m[2]))),
    (re.compile(r"MPI_ABORT was invoked on rank (\d+) in communicator MPI_COMM_WORLD .*?Errorcode: (\d+)"),
     lambda m: RankFailed(int(m[1]), None, int(m[2]))),
    (re.compile(r"process rank (\d+) with PID \d+ on node (\S+) calling \"?abort"),
     lambda m: RankFailed(int(m[1]), m[2], None)),
]


def read_failure_report(block: str) -> RankFailed | None:
    """The failure an Open MPI report block describes, or None.

    >>> str(read_failure_report('''prterun noticed that process rank 2 with PID 0 on node vm exited on
    ... signal 9 (Killed).'''))
    'rank 2 on host vm was killed by SIGKILL'
    """
    flat = " ".join(block.split())
    for pattern, read in _READINGS:
        match = pattern.search(flat)
        if match:
            return read(match)
    return None


def merge_reports(reports: list[RankFailed]) -> RankFailed | None:
    """The first report, completed with what later reports on the same rank add (host, code).

    >>> str(merge_reports([RankFailed(1, None, 3), RankFailed(1, "vm", None)]))
    'rank 1 on host vm exited with code 3'
    """
    if not reports:
        return None
    first = reports[0]
    same = [r for r in reports if r.rank == first.rank]
    host = next((r.host for r in same if r.host), None)
    returncode = next((r.returncode for r in same if r.returncode is not None), None)
    return RankFailed(first.rank, host, returncode)


def relay_stderr(source: BinaryIO, out: TextIO, reports: list[RankFailed]) -> None:
    """Copy mpirun's stderr from ``source`` to ``out`` until EOF, minus Open MPI's failure reports.

    Each report read is appended to ``reports``. Text passes as soon as it arrives
    (an unfinished line too, so progress bars keep moving); only a frame line and
    the line after it wait, until it is clear whether they open a failure report.

    >>> import io
    >>> rule = "-" * 74 + "\\n"
    >>> raw = f"step 1\\n{rule}MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\\n  Errorcode: 3\\n{rule}done\\n"
    >>> out, reports = io.StringIO(), []
    >>> relay_stderr(io.BytesIO(raw.encode()), out, reports)
    >>> out.getvalue(), [str(r) for r in reports]
    ('step 1\\ndone\\n', ['rank 1 exited with code 3'])
    >>> out = io.StringIO(); relay_stderr(io.BytesIO(b"[node1:00000] *** An error occurred in Socket closed\\nnext\\n"), out, [])
    >>> out.getvalue()
    'next\\n'
    >>> out = io.StringIO(); relay_stderr(io.BytesIO(b"Abort is in progress...hit ctrl-c again to forcibly terminate\\n"), out, [])
    >>> out.getvalue()
    ''
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    held: list[str] | None = None  # a framed block, while it may still be a failure report
    unfinished = ""
    while True:
        chunk = source.read1(65536) if hasattr(source, "read1") else source.read(65536)
        text = decoder.decode(chunk, final=not chunk).replace("\x00", "")  # Open MPI ends its reports with a NUL
        lines = (unfinished + text).splitlines(keepends=True)
        unfinished = lines.pop() if lines and chunk and not lines[-1].endswith(("\n", "\r")) else ""
        for line in lines:
            held = _take(line, held, out, reports)
        if unfinished and held is None and not unfinished.startswith("-"):
            _write(out, unfinished)
            unfinished = ""
        _flush(out)
        if not chunk:
            break
    if held:
        _write(out, "".join(held))
        _flush(out)


def _take(line: str, held: list[str] | None, out: TextIO, reports: list[RankFailed]) -> list[str] | None:
    """Pass ``line`` on, or hold it as part of a possible failure report; return what is still held."""
    if held is None:
        if _RULE.fullmatch(line.rstrip("\r\n")):
            return [line]
        if not _FATAL_HANDLER.match(line) and not _ABORTING.fullmatch(line):
            _write(out, line)
        return None
    held.append(line)
    if len(held) == 2 and not _FAILURE_REPORT.match(line) or len(held) > _LONGEST_REPORT:
        _write(out, "".join(held))
        return None
    if len(held) > 2 and _RULE.fullmatch(line.rstrip("\r\n")):
        report = read_failure_report("".join(held[1:-1]))
        if report is not None:
            reports.append(report)
        return None
    return held


def _write(out: TextIO, text: str) -> None:
    try:
        out.write(text)
    except (OSError, ValueError):  # our stderr is gone: keep draining so mpirun never blocks
        pass


def _flush(out: TextIO) -> None:
    try:
        out.flush()
    except (OSError, ValueError):
        pass
