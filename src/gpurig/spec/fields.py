"""Typed, ranged fields for the spec dataclasses, and one reader that checks them.

A spec dataclass declares each field with :func:`number`, :func:`text` or
:func:`flag` (unit, allowed range, choices, default). :func:`from_mapping`
builds the dataclass from a TOML table or a CSV row and refuses bad input with
one line naming the place, the field and the problem — the same checks for
the catalog's data files, cluster specs and build files.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

from gpurig.errors import UsageError

REQUIRED = dataclasses.MISSING


class SpecError(UsageError):
    """A spec, build or catalog file that cannot be used: one line naming file, field and problem."""


def number(unit: str, low: float, high: float, *, integer: bool = False, default=REQUIRED, help: str = ""):
    """A numeric field in ``unit``, valid from ``low`` to ``high`` (inclusive); ``default=None`` makes it optional.

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Disk:
    ...     size_gb: float = number("GB", 1, 1e6)
    >>> from_mapping(Disk, {"size_gb": 500}, "disk.toml").size_gb
    500
    """
    meta = {"kind": "number", "unit": unit, "range": (low, high), "integer": integer, "help": help}
    return dataclasses.field(default=default, metadata=meta)


def text(*, choices: tuple[str, ...] | None = None, default=REQUIRED, help: str = ""):
    """A text field, optionally one of ``choices``."""
    return dataclasses.field(default=default, metadata={"kind": "text", "choices": choices, "help": help})


def flag(*, default=REQUIRED, help: str = ""):
    """A yes/no field (TOML true/false; in CSV: yes/no)."""
    return dataclasses.field(default=default, metadata={"kind": "flag", "help": help})


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _convert(field: dataclasses.Field, value: Any, from_text: bool, where: str):
    meta = field.metadata
    kind = meta["kind"]
    name = field.name
    if kind == "number":
        if from_text and isinstance(value, str):
            try:
                value = float(value) if not meta["integer"] else int(value)
            except ValueError:
                raise SpecError(f"{where}: {name}: expected a {'whole ' if meta['integer'] else ''}number "
                                f"({meta['unit']}), got {value!r}") from None
        if not _is_number(value):
            raise SpecError(f"{where}: {name}: expected a number ({meta['unit']}), got {value!r}")
        if meta["integer"] and not float(value).is_integer():
            raise SpecError(f"{where}: {name}: expected a whole number, got {value!r}")
        low, high = meta["range"]
        if value != value or not low <= value <= high:  # NaN fails too
            raise SpecError(f"{where}: {name}: {value} {meta['unit']} is outside {low:g}–{high:g} {meta['unit']}")
        return int(value) if meta["integer"] else value
    if kind == "flag":
        if from_text and isinstance(value, str) and value.lower() in ("yes", "no", "true", "false"):
            return value.lower() in ("yes", "true")
        if not isinstance(value, bool):
            raise SpecError(f"{where}: {name}: expected true or false, got {value!r}")
        return value
    choices = meta["choices"] or ()
    if _is_number(value) and f"{float(value):.1f}" in choices:   # pcie_gen = 4, as "PCIe 4" is said
        value = f"{float(value):.1f}"
    if not isinstance(value, str):
        raise SpecError(f"{where}: {name}: expected text, got {value!r}")
    value = value.strip()
    if value not in choices and f"{value}.0" in choices:   # pcie_gen = "4"
        value = f"{value}.0"
    if meta["choices"] and value not in meta["choices"]:
        raise SpecError(f"{where}: {name}: {value!r} is not one of {', '.join(meta['choices'])}")
    return value


def unknown_keys(values: Mapping, allowed, where: str) -> None:
    """Refuse a key that is not ``allowed`` (a typo would otherwise be ignored), suggesting the closest.

    >>> unknown_keys({"wats": 1}, ["watts", "efficiency"], "build.toml [psu]")
    Traceback (most recent call last):
    ...
    gpurig.spec.fields.SpecError: build.toml [psu]: unknown field 'wats' (did you mean 'watts'?)
    """
    allowed = list(allowed)
    for key in values:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (allowed: {', '.join(allowed)})"
            raise SpecError(f"{where}: unknown field {key!r}{hint}")


def from_mapping(cls, values: Mapping, where: str, *, from_text: bool = False, extra: tuple[str, ...] = (),
                 given: dict | None = None):
    """Build dataclass ``cls`` from ``values``, checking every declared field; ``extra`` keys are skipped.

    ``from_text`` reads numbers and flags from strings (CSV); an empty string
    then means "not given". ``given`` supplies fields built elsewhere (nested tables).

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Psu:
    ...     watts: float = number("W", 100, 5000)
    >>> from_mapping(Psu, {"watts": -5}, "build.toml [psu]")
    Traceback (most recent call last):
    ...
    gpurig.spec.fields.SpecError: build.toml [psu]: watts: -5 W is outside 100–5000 W
    """
    if not isinstance(values, Mapping):
        raise SpecError(f"{where}: expected a table of fields, got {values!r}")
    declared = [f for f in dataclasses.fields(cls) if "kind" in f.metadata]
    unknown_keys(values, [f.name for f in declared] + list(extra), where)
    kwargs = dict(given or {})
    for field in declared:
        value = values.get(field.name)
        if value is None or (from_text and value == ""):
            if field.default is REQUIRED and field.default_factory is REQUIRED:
                raise SpecError(f"{where}: {field.name}: missing (required, {describe(field)})")
            continue
        kwargs[field.name] = _convert(field, value, from_text, where)
    return cls(**kwargs)


def describe(field: dataclasses.Field) -> str:
    """What a field holds, for error messages and docs.

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Psu:
    ...     watts: float = number("W", 100, 5000)
    >>> describe(dataclasses.fields(Psu)[0])
    'W, 100–5000'
    """
    meta = field.metadata
    if meta.get("kind") == "number":
        low, high = meta["range"]
        return f"{meta['unit']}, {low:g}–{high:g}"
    if meta.get("kind") == "text" and meta.get("choices"):
        return "one of " + ", ".join(meta["choices"])
    return meta.get("kind", "value")


def to_mapping(obj) -> dict:
    """The declared fields of a spec dataclass that are set (None left out), for writing TOML.

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Psu:
    ...     watts: float = number("W", 100, 5000)
    ...     efficiency: float = number("", 0.5, 1, default=None)
    >>> to_mapping(Psu(watts=1300))
    {'watts': 1300}
    """
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
            if "kind" in f.metadata and getattr(obj, f.name) is not None}
