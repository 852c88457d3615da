"""Host lists: ``--hosts a:4,b:4``, SLURM's compressed node lists, and how many ranks to start."""

from __future__ import annotations

import re

from gpurig.errors import UsageError

_HOST = re.compile(r"^[A-Za-z0-9_.\-]+$")


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
        name, _, slots = item.strip().partition(":")
        if not _HOST.match(name) or (slots and not slots.isdigit()) or slots == "0":
            raise UsageError(f"--hosts: {item.strip()!r} is not HOST or HOST:SLOTS with SLOTS a positive integer")
        hosts.append((name, int(slots) if slots else 1))
    names = [h for h, _ in hosts]
    if len(set(names)) != len(names):
        raise UsageError(f"--hosts: a host is named twice in {text!r}")
    return hosts


def expand_hostlist(text: str) -> list[str]:
    """Expand SLURM's compressed node list.

    >>> expand_hostlist("node[01-03,07],gpu5")
    ['node01', 'node02', 'node03', 'node07', 'gpu5']
    """
    hosts: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]*)\[([^\]]*)\]|([^,\[\]]+)", text):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                hosts.append(f"{prefix}{number:0{width}d}")
    return hosts


def default_nprocs(hosts: str | None = None) -> int:
    """Ranks to start when ``-n`` is not given: all slots of ``--hosts``, else one per GPU, else 2.

    >>> default_nprocs("a:4,b:2")
    6
    """
    if hosts:
        return sum(slots for _, slots in parse_hosts(hosts))
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        gpus = 0
    return gpus or 2
