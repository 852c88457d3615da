"""Host lists: ``--hosts a:4,b:4``, and SLURM's compressed node and task-count lists."""

from __future__ import annotations

import re
import socket

from gpurig.errors import UsageError

_HOST = re.compile(r"[A-Za-z0-9_.\-]+")


def check_hosts(text: str | None) -> None:
    """``--hosts`` as given: left out (None: run here), or machines :func:`parse_hosts` reads; one line otherwise.

    >>> check_hosts("")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --hosts '': want HOST:SLOTS,... (leave it out to run here)
    """
    if text is None:
        return
    if not text.strip():
        raise UsageError("--hosts '': want HOST:SLOTS,... (leave it out to run here)")
    parse_hosts(text)


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """``"a:4,b:4"`` → ``[("a", 4), ("b", 4)]``; a host without ``:slots`` has one slot.

    >>> parse_hosts("node1:4,node2")
    [('node1', 4), ('node2', 1)]
    >>> parse_hosts("node1:x")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --hosts: 'node1:x' is not HOST or HOST:SLOTS with SLOTS a positive integer
    """
    hosts = []
    for item in text.split(","):
        name, colon, slots = item.strip().partition(":")
        if not _HOST.fullmatch(name) or colon and not (slots.isdigit() and int(slots) > 0):
            raise UsageError(f"--hosts: {item.strip()!r} is not HOST or HOST:SLOTS with SLOTS a positive integer")
        hosts.append((name, int(slots) if slots else 1))
    names = [name for name, _ in hosts]
    if len(set(names)) != len(names):
        raise UsageError(f"--hosts: a host is named twice in {text!r}")
    return hosts


def is_this_host(name: str) -> bool:
    """Whether ``name`` is this machine.

    >>> is_this_host("localhost"), is_this_host("surely-not-this-machine.example")
    (True, False)
    """
    here = socket.gethostname()
    return name in {"localhost", "127.0.0.1", "::1", here, here.split(".")[0]} or name == socket.getfqdn()


def resolves(name: str) -> bool:
    """Whether ``name`` is an address, or a host name DNS or /etc/hosts knows.

    >>> resolves("localhost"), resolves("10.0.0.7"), resolves("no-such-host.invalid")
    (True, True, False)
    """
    try:
        socket.getaddrinfo(name, None)
    except (OSError, UnicodeError):
        return False
    return True


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets: ``"a[1,2],b"`` → ``["a[1,2]", "b"]``."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part for part in parts if part]


def _expand_ranges(ranges: str) -> list[str]:
    """``"01-03,7"`` → ``["01", "02", "03", "7"]``, keeping zero padding."""
    numbers = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        numbers += [f"{n:0{len(low)}d}" for n in range(int(low), int(high or low) + 1)]
    return numbers


def expand_hostlist(text: str) -> list[str]:
    """Expand SLURM's compressed node list (``SLURM_JOB_NODELIST``) into host names, in order.

    >>> expand_hostlist("node[01-03,07],gpu5")
    ['node01', 'node02', 'node03', 'node07', 'gpu5']
    >>> expand_hostlist("rack[1-2]-n[1-2]")
    ['rack1-n1', 'rack1-n2', 'rack2-n1', 'rack2-n2']
    """
    hosts: list[str] = []
    for item in _split_top_level(text.strip()):
        match = re.match(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not match:
            hosts.append(item)
            continue
        prefix, ranges, rest = match.groups()
        tails = expand_hostlist(rest) if rest else [""]
        hosts += [prefix + number + tail for number in _expand_ranges(ranges) for tail in tails]
    return hosts


def tasks_per_node(text: str) -> list[int]:
    """Expand SLURM's task counts per node (``SLURM_TASKS_PER_NODE``): one count per node, in node order.

    >>> tasks_per_node("4(x2),1")
    [4, 4, 1]
    """
    counts: list[int] = []
    for item in text.split(","):
        count, _, times = item.partition("(x")
        counts += [int(count)] * int(times.rstrip(")") or 1)
    return counts
