"""Which price ``gpurig choose`` uses for a GPU or a part: the user's (``--price``, ``--prices FILE``), else the
catalog's street price, else its launch price; each with its date, source and whether it is older than a year.

>>> book = price_book(("RTX 4090=1800", "H100 SXM=2.5/h"), None, today=datetime.date(2026, 11, 25))
>>> buy = book.buy("GeForce RTX 4090"); buy.usd, buy.stale, buy.source
(1800.0, False, '--price')
>>> book.buy("GeForce RTX 4080").usd, book.buy("GeForce RTX 4080").stale
(1199.0, True)
>>> book.cloud("H100 SXM5 80 GB").usd
2.5
"""

from __future__ import annotations

import csv
import datetime
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpurig.errors import UsageError
from gpurig.spec import catalog
from gpurig.spec.fields import SpecError
from gpurig.spec.prices import Part, gpu_prices, is_stale, parse_date, parts
from gpurig.spec.tomlio import read_toml


@dataclass(frozen=True)
class Price:
    """One price as ``choose`` uses it: USD (or USD per GPU-hour), its date and source, and whether it is stale."""

    usd: float
    date: str
    source: str
    stale: bool

    def as_dict(self) -> dict:
        """For ``--json``.

        >>> Price(1599.0, "2022-09-20", "NVIDIA", True).as_dict()["stale"]
        True
        """
        return {"usd": self.usd, "date": self.date, "source": self.source, "stale": self.stale}


@dataclass
class PriceBook:
    """The prices of one ``choose`` run: the catalog's with the user's on top."""

    today: datetime.date
    buy_override: dict[str, Price] = field(default_factory=dict)     # catalog GPU name -> price
    cloud_override: dict[str, Price] = field(default_factory=dict)
    part_override: dict[str, Price] = field(default_factory=dict)    # part name, lower case -> price
    described: tuple[str, ...] = ()   # GPUs specs describe that the catalog lacks: priced by their own names

    def buy(self, gpu_name: str) -> Price | None:
        """What one GPU costs to buy: the user's price, else the street price, else the launch price."""
        if gpu_name in self.buy_override:
            return self.buy_override[gpu_name]
        row = gpu_prices().get(gpu_name)
        if row is None:
            return None
        if row.street_usd is not None:
            return Price(row.street_usd, row.street_date, row.street_source, is_stale(row.street_date, self.today))
        if row.launch_usd is not None:
            return Price(row.launch_usd, row.launch_date, row.launch_source, is_stale(row.launch_date, self.today))
        return None

    def cloud(self, gpu_name: str) -> Price | None:
        """What one GPU-hour of ``gpu_name`` costs to rent, if known."""
        if gpu_name in self.cloud_override:
            return self.cloud_override[gpu_name]
        row = gpu_prices().get(gpu_name)
        if row is None or row.cloud_usd_per_gpu_hour is None:
            return None
        return Price(row.cloud_usd_per_gpu_hour, row.cloud_date, row.cloud_source, is_stale(row.cloud_date, self.today))

    def part(self, part: Part) -> Price:
        """What a build part costs: the user's price, else the catalog's."""
        return self.part_override.get(part.name.lower()) or \
            Price(part.usd, part.date, part.source, is_stale(part.date, self.today))


_FLAG = re.compile(r"^\s*(?P<name>[^=]+?)\s*=\s*\$?(?P<usd>[0-9][0-9,]*(?:\.[0-9]+)?)\s*(?P<hourly>/\s*h(?:our)?)?\s*$", re.I)


def price_book(flags: tuple[str, ...], path: str | None, today: datetime.date | None = None,
               described: tuple[str, ...] = ()) -> PriceBook:
    """The catalog's prices with ``--prices FILE`` over them and ``--price`` flags over both; ``described``: GPUs a
    ``--cluster`` spec describes that the catalog lacks, whose prices the user gives by their names.

    >>> price_book(("MyCard=1000",), None, described=("MyCard",)).buy("MyCard").usd
    1000.0
    """
    book = PriceBook(today or datetime.date.today(), described=tuple(described))
    if path is not None:
        seen: dict[str, str] = {}
        for name, values, where in _file_rows(path):
            # a file's price is as old as its date says: without one it would pass for today's
            if not values.get("date") and not (values.get("cloud_usd_per_gpu_hour") and values.get("cloud_date")):
                raise UsageError(f"{where} ({name}): no date: give the day the price was seen (YYYY-MM-DD, or "
                                 "YYYY-MM), so an old price is flagged")
            if name.strip().lower() in seen:
                raise UsageError(f"{where}: {name} again (first at {seen[name.strip().lower()]}): one row a name")
            seen[name.strip().lower()] = where
            _apply(book, name, values, where)
    for text in flags:
        for item in (p for p in text.split(";") if p.strip()):
            match = _FLAG.match(item)
            if not match:
                raise UsageError(f"--price {item!r}: expected NAME=USD (a GPU or a part), or NAME=USD/h for a cloud "
                                 "GPU-hour, e.g. --price 'RTX 4090=1800'")
            usd = float(match["usd"].replace(",", ""))
            key = "cloud_usd_per_gpu_hour" if match["hourly"] else "usd"
            _apply(book, match["name"], {key: usd, "date": book.today.isoformat(), "source": "--price"}, "--price")
    return book


def _check_date(date: str, where: str, today: datetime.date) -> None:
    """A price's date, refused where it is malformed or lies after ``today`` (a period that has begun is fine).

    >>> _check_date("2026-11", "--prices p.csv (RTX 4090)", datetime.date(2026, 11, 25))
    >>> _check_date("2027-01-05", "--prices p.csv (RTX 4090)", datetime.date(2026, 11, 25))
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --prices p.csv (RTX 4090): date 2027-01-05 is after today (2026-11-25): give the day the price was seen
    """
    last = parse_date(date, where)
    first = {3: last, 2: last.replace(day=1), 1: last.replace(month=1, day=1)}[len(date.strip().split("-"))]
    if first > today:
        raise UsageError(f"{where}: date {date} is after today ({today.isoformat()}): give the day the price was seen")


def _apply(book: PriceBook, name: str, values: dict, where: str) -> None:
    date = str(values.get("date") or book.today.isoformat())
    _check_date(date, f"{where} ({name})", book.today)
    stale = is_stale(date, book.today)
    source = str(values.get("source") or where)
    part = next((p for p in parts() if p.name.lower() == name.strip().lower()), None)
    if part is not None:
        if values.get("usd") is None:
            raise UsageError(f"{where} ({name}): a part needs usd")
        book.part_override[part.name.lower()] = Price(_positive(values["usd"], where, name), date, source, stale)
        return
    own = next((d for d in book.described if d.lower() == name.strip().lower()), None)
    try:
        gpu_name = own or catalog.gpu(name).name
    except SpecError as error:
        raise UsageError(f"{where}: {error} (or a part: {', '.join(p.name for p in parts()[:3])}, …)") from None
    if values.get("usd") is not None:
        book.buy_override[gpu_name] = Price(_positive(values["usd"], where, name), date, source, stale)
    if values.get("cloud_usd_per_gpu_hour") is not None:
        cloud_date = str(values.get("cloud_date") or date)
        _check_date(cloud_date, f"{where} ({name})", book.today)
        book.cloud_override[gpu_name] = Price(_positive(values["cloud_usd_per_gpu_hour"], where, name), cloud_date,
                                              str(values.get("cloud_source") or source),
                                              is_stale(cloud_date, book.today))
    if values.get("usd") is None and values.get("cloud_usd_per_gpu_hour") is None:
        raise UsageError(f"{where} ({name}): give usd or cloud_usd_per_gpu_hour")


def _positive(value, where: str, name: str) -> float:
    try:
        number = float(str(value).replace(",", ""))
    except ValueError:
        raise UsageError(f"{where} ({name}): {value!r} is not a price in USD") from None
    if not 0 < number < 1e8:
        raise UsageError(f"{where} ({name}): a price must be positive, got {value!r}")
    return number


FILE_KEYS = ("usd", "date", "source", "cloud_usd_per_gpu_hour", "cloud_date", "cloud_source")


def _file_rows(path: str) -> list[tuple[str, dict, str]]:
    """``(name, values, where)`` for each row of a prices file: CSV with a ``name`` column, or TOML with one
    table per name (the keys of :data:`FILE_KEYS`)."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--prices {path}: no such file")
    if file.suffix.lower() == ".toml":
        data = read_toml(file)
        rows = []
        for name, values in data.items():
            if not isinstance(values, dict):
                raise UsageError(f"--prices {path}: [{name}]: expected a table such as usd = 1800, date = \"2026-11\"")
            unknown = set(values) - set(FILE_KEYS)
            if unknown:
                raise UsageError(f"--prices {path}: [{name}]: unknown key {sorted(unknown)[0]!r} "
                                 f"(known: {', '.join(FILE_KEYS)})")
            rows.append((name, values, f"--prices {path}"))
        return rows
    if file.suffix.lower() != ".csv":
        raise UsageError(f"--prices {path}: expected a .csv or .toml file")
    with file.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or "name" not in reader.fieldnames:
            raise UsageError(f"--prices {path}: the first line must name the columns: name,usd,date,source "
                             "(and cloud_usd_per_gpu_hour, cloud_date, cloud_source)")
        unknown = set(reader.fieldnames) - {"name", *FILE_KEYS}
        if unknown:
            raise UsageError(f"--prices {path}: unknown column {sorted(unknown)[0]!r} (known: name, {', '.join(FILE_KEYS)})")
        return [(row["name"], {k: v for k, v in row.items() if k != "name" and v not in (None, "")},
                 f"--prices {path} line {line}") for line, row in enumerate(reader, start=2)]
