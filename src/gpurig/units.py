"""Units of data and data rates, with the meaning of "giga" as an explicit argument.

A leaf module (like :mod:`gpurig.errors`): the spec layer reads "40 Gbit/s" with
it and the perf layer computes with it.

Vendors and the SI say 1 GB = 10^9 bytes and 1 Gbit/s = 10^9 bit/s. The source
posts sometimes read "GB" and "Gbit" as 2^30 (its 0.745 ms for 4 MB over
40 Gbit/s, its 1.15 ms for a batch over PCIe at 15.75 GB/s). Every function
that turns a number with a prefix into bytes takes ``base``: :data:`DECIMAL`
(1000, the default) or :data:`BINARY` (1024). Units written with an "i"
(``GiB/s``, ``MiB``) are binary whatever ``base`` says.
"""

from __future__ import annotations

import re

DECIMAL = 1000
BINARY = 1024

_PREFIX_POWER = {"": 0, "k": 1, "K": 1, "M": 2, "G": 3, "T": 4}
_UNIT = re.compile(r"^(?P<prefix>[kKMGT]?)(?P<binary>i?)(?P<kind>B|bit|b)(?P<rate>/s|ps)?$")
_QUANTITY = re.compile(r"^\s*(?P<value>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>[A-Za-z/]+)\s*$")


def _scale(unit: str, base: int) -> tuple[float, bool]:
    """(bytes per unit, whether it is a rate) for a unit such as ``GB/s`` or ``Gbit/s``."""
    if base not in (DECIMAL, BINARY):
        raise ValueError(f"base must be {DECIMAL} (SI) or {BINARY} (binary), got {base}")
    match = _UNIT.match(unit.strip())
    if not match:
        raise ValueError(f"unknown unit {unit!r}: use B, kB, MB, GB, TB, KiB, MiB, GiB, bit, Mbit, Gbit (with /s for rates)")
    power = _PREFIX_POWER[match["prefix"]]
    multiplier = (BINARY if match["binary"] else base) ** power
    per_byte = 1 if match["kind"] == "B" else 1 / 8
    return multiplier * per_byte, bool(match["rate"])


def to_bytes(value: float, unit: str, base: int = DECIMAL) -> float:
    """Bytes in ``value`` ``unit`` (a size: ``MB``, ``GiB``, ``Gbit`` …).

    >>> to_bytes(100, "MB"), to_bytes(100, "MB", base=BINARY), to_bytes(1, "GiB")
    (100000000, 104857600, 1073741824)
    """
    scale, is_rate = _scale(unit, base)
    if is_rate:
        raise ValueError(f"{unit!r} is a rate, not a size")
    return value * scale


def bytes_per_second(value: float, unit: str, base: int = DECIMAL) -> float:
    """Bytes per second in ``value`` ``unit`` (a rate: ``GB/s``, ``Gbit/s``, ``MiB/s`` …).

    >>> bytes_per_second(40, "Gbit/s"), bytes_per_second(40, "Gbit/s", base=BINARY)
    (5000000000.0, 5368709120.0)
    """
    scale, is_rate = _scale(unit, base)
    if not is_rate:
        raise ValueError(f"{unit!r} is a size, not a rate (add /s)")
    return value * scale


def parse_quantity(text: str) -> tuple[float, str]:
    """Split "40 Gbit/s" or "100MB/s" into (40.0, "Gbit/s"); the unit is checked.

    >>> parse_quantity("40 Gbit/s"), parse_quantity("15.75GB/s")
    ((40.0, 'Gbit/s'), (15.75, 'GB/s'))
    """
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"expected a number and a unit such as '40 Gbit/s', got {text!r}")
    _scale(match["unit"], DECIMAL)  # refuses unknown units
    return float(match["value"]), match["unit"]


_LINK_RATE = re.compile(r"^\s*(?P<value>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*(?P<prefix>[kKmMgGtT]?)"
                        r"(?P<binary>i?)(?P<kind>bits?|bytes?|b|B)(?P<per>/s|/sec|ps)\s*$", re.I)


def gbit_per_s(text: str) -> float:
    """A link's rate written as text ("40 Gbit/s", "100 MB/s", "56Gbps", "10 gbps") in Gbit/s (SI).

    The prefix's case does not matter ("100 mbps" is 100 Mbit/s: no link runs at millibits); the b's does, as
    people write it: "Gb/s", "Gbps" and "Gbit/s" are bits, "GB/s" and "GBps" bytes. "10 GBPS" could be either and
    is refused.

    >>> gbit_per_s("40 Gbit/s"), gbit_per_s("56Gbps"), gbit_per_s("125 MB/s"), gbit_per_s("12.5 GBps")
    (40.0, 56.0, 1.0, 100.0)
    >>> gbit_per_s("10 gbit/s"), gbit_per_s("100 mbps"), gbit_per_s("10. Gb/s")
    (10.0, 0.1, 10.0)
    """
    match = _LINK_RATE.match(text)
    if not match:
        raise ValueError(f"expected a rate such as '40 Gbit/s', '10 Gbps' or '1.25 GB/s', got {text!r}")
    kind, per = match["kind"], match["per"]
    if kind.lower().startswith("bit"):
        bits = True
    elif kind.lower().startswith("byte"):
        bits = False
    elif kind == "B" and per == "PS":
        raise ValueError(f"{text.strip()!r} could be bits or bytes a second: write Gbit/s (Gbps) or GB/s (GBps)")
    else:
        bits = kind == "b"
    prefix = match["prefix"].upper() if match["prefix"] not in ("k", "K") else "k"
    multiplier = (BINARY if match["binary"] else DECIMAL) ** _PREFIX_POWER[prefix]
    return float(match["value"]) * multiplier * (1 if bits else 8) / 1e9


def tensor_bytes(shape: tuple[int, ...] | list[int], bytes_per_element: int = 4) -> int:
    """Bytes of a dense tensor (fp32 by default).

    >>> tensor_bytes((32, 225, 225, 3))        # the source's ImageNet batch, fp32
    19440000
    >>> tensor_bytes((1000, 1000))             # the source's 1000x1000 gradient
    4000000
    """
    count = 1
    for dim in shape:
        count *= int(dim)
    return count * bytes_per_element
