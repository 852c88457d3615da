"""Prices as data, each with its date and source: GPUs (``data/prices.csv``) and the rest of a build
(``data/parts.csv``: CPU, board, PSU, RAM, case).

A GPU row has its launch price (the vendor's announcement), and where known a dated street price and a
cloud price per GPU-hour; an empty field is a price gpurig does not know. Nothing is fetched at run time:
``gpurig choose`` flags a price older than a year and takes the user's (``--price``, ``--prices``).

>>> gpu_price("GeForce RTX 4090").launch_usd, gpu_price("GeForce RTX 4090").launch_date
(1599.0, '2022-09-20')
>>> [p.name for p in parts() if p.kind == "psu"][:2]
['850 W 80 PLUS Gold', '1000 W 80 PLUS Gold']
"""

from __future__ import annotations

import datetime
import functools
from dataclasses import dataclass

from gpurig.spec import catalog
from gpurig.spec.fields import SpecError, number, text

PART_KINDS = ("cpu", "board", "psu", "ram", "base")
STALE_DAYS = 365


@dataclass(frozen=True)
class GPUPrice:
    """What one catalog GPU costs: to buy at launch, on the street, to rent per GPU-hour; each dated and sourced."""

    name: str = text()
    launch_usd: float | None = number("USD", 1, 1e7, default=None)
    launch_date: str | None = text(default=None)
    launch_source: str | None = text(default=None)
    street_usd: float | None = number("USD", 1, 1e7, default=None)
    street_date: str | None = text(default=None)
    street_source: str | None = text(default=None)
    cloud_usd_per_gpu_hour: float | None = number("USD per GPU-hour", 0.001, 1000, default=None)
    cloud_date: str | None = text(default=None)
    cloud_source: str | None = text(default=None)


@dataclass(frozen=True)
class Part:
    """A part of a build besides the GPUs, with what ``gpurig plan``'s rules check of it, and its price.

    ``platform`` pairs CPUs, boards and the rest (case, SSD, cooler: ``base``) that go together.
    """

    kind: str = text(choices=PART_KINDS)
    name: str = text()
    usd: float = number("USD", 1, 1e6)
    date: str = text()
    source: str = text()
    platform: str | None = text(default=None)
    threads: int | None = number("threads", 1, 1024, integer=True, default=None)
    tdp_w: float | None = number("W", 1, 2000, default=None)
    pcie_lanes: int | None = number("lanes", 1, 512, integer=True, default=None)
    gpu_slots: int | None = number("slots", 1, 16, integer=True, default=None)
    slot_pitch: int | None = number("slots", 1, 8, integer=True, default=None)
    watts: float | None = number("W", 100, 10000, default=None)
    efficiency: float | None = number("fraction", 0.5, 1.0, default=None)
    ram_gb: float | None = number("GB", 1, 1e5, default=None)


def parse_date(value: str, where: str) -> datetime.date:
    """A price's date: ``YYYY-MM-DD``, ``YYYY-MM`` or ``YYYY`` (the last day of the period counts).

    >>> parse_date("2024-06", "x"), parse_date("2022", "x")
    (datetime.date(2024, 6, 30), datetime.date(2022, 12, 31))
    >>> parse_date("June 2024", "prices.csv line 3")
    Traceback (most recent call last):
    ...
    gpurig.spec.fields.SpecError: prices.csv line 3: date 'June 2024': expected YYYY-MM-DD, YYYY-MM or YYYY
    """
    parts = str(value).strip().split("-")
    try:
        numbers = [int(p) for p in parts]
        if len(numbers) == 3:
            return datetime.date(*numbers)
        if len(numbers) == 2:
            following = datetime.date(numbers[0] + numbers[1] // 12, numbers[1] % 12 + 1, 1)
            return following - datetime.timedelta(days=1)
        if len(numbers) == 1:
            return datetime.date(numbers[0], 12, 31)
    except ValueError:
        pass
    raise SpecError(f"{where}: date {value!r}: expected YYYY-MM-DD, YYYY-MM or YYYY")


def is_stale(date: str, today: datetime.date) -> bool:
    """Whether a price of ``date`` is older than a year on ``today``.

    >>> is_stale("2022-09-20", datetime.date(2026, 11, 25)), is_stale("2026-06", datetime.date(2026, 11, 25))
    (True, False)
    """
    return (today - parse_date(date, "price")).days > STALE_DAYS


@functools.cache
def gpu_prices() -> dict[str, GPUPrice]:
    """Every priced GPU by its catalog name; every row's name is a catalog GPU's and every price has a date."""
    rows = catalog.read_table("prices.csv", GPUPrice)
    names = {gpu.name for gpu in catalog.gpus()}
    out = {}
    for line, row in enumerate(rows, start=2):
        where = f"prices.csv line {line} ({row.name})"
        if row.name not in names:
            raise SpecError(f"{where}: not a catalog GPU name")
        for kind in ("launch", "street", "cloud"):
            value = getattr(row, f"{kind}_usd_per_gpu_hour" if kind == "cloud" else f"{kind}_usd")
            date, source = getattr(row, f"{kind}_date"), getattr(row, f"{kind}_source")
            if value is not None and (not date or not source):
                raise SpecError(f"{where}: a {kind} price needs its date and source")
            if date:
                parse_date(date, where)
        out[row.name] = row
    return out


def gpu_price(name: str) -> GPUPrice | None:
    """The price row of the catalog GPU ``name`` (loosely, as the catalog finds it), None if it has none.

    >>> gpu_price("A100 SXM4 40 GB").launch_usd is None, gpu_price("A100 SXM4 40 GB").cloud_usd_per_gpu_hour
    (True, 4.1)
    """
    return gpu_prices().get(catalog.gpu(name).name)


@functools.cache
def parts() -> tuple[Part, ...]:
    """The build parts, every row dated."""
    rows = catalog.read_table("parts.csv", Part)
    for line, row in enumerate(rows, start=2):
        parse_date(row.date, f"parts.csv line {line} ({row.name})")
    return tuple(rows)
