"""Reading and writing TOML files with one-line errors.

Python 3.11 reads TOML with :mod:`tomllib` (``tomli`` before 3.11); writing uses ``tomli-w``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpurig.spec.fields import SpecError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def read_toml(path: str | Path) -> dict:
    """The TOML file at ``path`` as a dict; a missing or malformed file is one :class:`SpecError` line.

    >>> read_toml("/nonexistent.toml")
    Traceback (most recent call last):
    ...
    gpurig.spec.fields.SpecError: /nonexistent.toml: no such file
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")   # a byte-order mark, as Windows editors save UTF-8, is no TOML
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError(f"{path}: cannot read: {error}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SpecError(f"{path}: not valid TOML: {error}") from None


def write_toml(path: str | Path, data: dict, header: str = "") -> None:
    """Write ``data`` to ``path`` as TOML, with ``header`` as comment lines on top."""
    from gpurig.errors import UsageError

    try:
        import tomli_w
    except ModuleNotFoundError:  # a declared dependency; missing where gpurig runs from a tree (PYTHONPATH=src)
        raise UsageError(f"cannot write {path}: writing TOML needs tomli-w (pip install tomli-w)") from None
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    try:
        Path(path).write_text(comment + ("\n" if comment else "") + tomli_w.dumps(data))
    except OSError as error:  # a full disk, a read-only file system: one line, not a traceback
        raise UsageError(f"cannot write {path}: {error.strerror or error}") from None
