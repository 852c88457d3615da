"""A machine profile: what ``gpurig bench`` measured, as JSON that ``gpurig predict`` reads (schema in docs/hardware.md).

The rows a benchmark job returns are summarised here (alpha and beta fitted per
collective), several takes merged (the median of each number), and a saved
profile loaded back with its schema checked.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from gpurig.errors import UsageError
from gpurig.perf.fit import fit_latency_bandwidth

SCHEMA = "gpurig-profile/1"


def summarize_engine(rows: list[dict]) -> dict:
    """Per collective: the rows, alpha and beta fitted to them, and the largest size's busbw."""
    out: dict = {}
    rows = [r for r in rows if r["collective"] != "overlap"]
    for collective in dict.fromkeys(r["collective"] for r in rows):
        mine = [r for r in rows if r["collective"] == collective]
        clean = [{k: v for k, v in r.items() if k not in ("event", "engine", "ranks")} for r in mine]
        entry: dict = {"rows": clean, "busbw_gbs": clean[-1]["busbw_gbs"]}
        if len(mine) >= 2:
            # single calls after a barrier where they were measured (a step's buckets start so), else back to back
            key = "isolated_seconds" if all("isolated_seconds" in r for r in mine) else "seconds"
            fit = fit_latency_bandwidth([r["bytes"] for r in mine], [r[key] for r in mine])
            entry.update(alpha_s=fit.alpha, beta_s_per_byte=fit.beta,  # beta <= 0: noise swamped the sizes
                         fitted_gbs=fit.bytes_per_s / 1e9 if fit.beta > 0 else None)
        posting = fit_posting(mine)
        if posting:
            entry.update(posted_alpha_s=posting[0], posted_beta_s_per_byte=posting[1])
        out[collective] = entry
    return out


def fit_posting(rows: list[dict]) -> tuple[float, float] | None:
    """What posting a compressed bucket under computation costs it, as a line in the gradient's bytes (seconds,
    seconds per byte; neither below 0), from the rows that measured it (``posted_s``); None with fewer than two.

    >>> fit_posting([{"bytes": 1000, "posted_s": 0.002}, {"bytes": 3000, "posted_s": 0.003}])
    (0.0015, 5e-07)
    >>> fit_posting([{"bytes": 1000, "posted_s": 0.003}, {"bytes": 3000, "posted_s": 0.002}])   # noise: flat
    (0.0025, 0.0)
    """
    measured = [r for r in rows if "posted_s" in r]
    if len(measured) < 2:
        return None
    sizes, seconds = [r["bytes"] for r in measured], [r["posted_s"] for r in measured]
    beta = max(0.0, statistics.linear_regression(sizes, seconds).slope) if len(set(sizes)) > 1 else 0.0
    return max(0.0, statistics.fmean(seconds) - beta * statistics.fmean(sizes)), beta


def summarize_overlap(rows: list[dict]) -> dict | None:
    """The measurement of computing while a collective is in flight (:func:`gpurig.measure.comm.measure_overlap`),
    if the rows hold one.

    >>> summarize_overlap([{"event": "row", "collective": "overlap", "slowdown": 1.6, "samples": 12}])
    {'slowdown': 1.6, 'samples': 12}
    """
    found = [r for r in rows if r.get("collective") == "overlap"]
    if not found:
        return None
    return {k: v for k, v in found[-1].items() if k not in ("event", "engine", "ranks", "collective")}


def median_profile(takes: list):
    """Several takes of the same measurement merged: every float the median of its takes (of those that have
    one: a fit swamped by noise has none); text, whole numbers and shapes from the first.

    >>> median_profile([{"gemm": [{"m": 64, "seconds": 1.0}]}, {"gemm": [{"m": 64, "seconds": 3.0}]},
    ...                 {"gemm": [{"m": 64, "seconds": 2.5}]}])
    {'gemm': [{'m': 64, 'seconds': 2.5}]}
    >>> median_profile([{"fitted_gbs": None}, {"fitted_gbs": 2.0}, {"fitted_gbs": 4.0}])
    {'fitted_gbs': 3.0}
    """
    first = takes[0]
    if isinstance(first, dict):
        return {key: median_profile([take[key] for take in takes]) for key in first}
    if isinstance(first, list):
        return [median_profile(list(items)) for items in zip(*takes)]
    if first is None or isinstance(first, float):
        numbers = [take for take in takes if isinstance(take, float)]
        return statistics.median(numbers) if numbers else first
    return first


def load_profile(path: str | Path) -> dict:
    """A machine profile written by ``gpurig bench --out`` (checked for its schema)."""
    try:
        profile = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except (OSError, ValueError) as error:
        raise UsageError(f"{path}: not a gpurig profile: {error}") from None
    if not isinstance(profile, dict) or profile.get("schema") != SCHEMA:
        raise UsageError(f"{path}: not a gpurig profile (schema {SCHEMA} expected)")
    check_profile(profile, str(path))
    return profile


# what bench measures: numbers, never below 0 (a fit's alpha and beta included: perf.fit keeps them so); the
# divisors above 0
_MEASURED = frozenset(("algbw_gbs", "alpha_s", "backward_s", "batch", "batch_bytes", "beta_s_per_byte", "blocking_ms",
                       "busbw_gbs", "bytes", "chain_s", "compute_ms", "decode_s_per_value", "encode_s_per_value",
                       "fitted_gbs", "forward_s", "gbs", "gflops", "isolated_seconds", "iterations", "k",
                       "layer_overhead_s", "load_ms", "m", "mb_per_s", "memory_bytes_per_s", "n", "per_matrix_s",
                       "posted_alpha_s", "posted_beta_s_per_byte", "posted_s", "prefetch_ms", "product_during_s",
                       "product_s", "queued", "ranks", "raw_busbw_gbs", "raw_isolated_seconds", "raw_over_gpurig",
                       "raw_seconds", "samples", "seconds", "seconds_per_value", "slowdown", "steps",
                       "threads_per_rank", "values"))
_POSITIVE = frozenset(("ranks", "threads_per_rank", "memory_bytes_per_s", "mb_per_s", "gflops", "slowdown",
                       "beta_s_per_byte"))


def check_profile(profile: dict, where: str) -> None:
    """Refuse, in one line, a profile whose measurements are not measurements (a hand-edited or damaged file): a
    number that is not finite, a time or rate below 0, a divisor of 0, text where a number belongs, a part that is
    not a table, a compute part without GEMMs.

    >>> check_profile({"comm": {"ranks": 0, "engines": {}}}, "p.json")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: p.json: comm.ranks is 0, not a measurement (it must be above 0): measure again with gpurig bench
    """
    def refuse(path: str, value, why: str):
        shown = repr(value) if len(repr(value)) <= 40 else f"{type(value).__name__} {repr(value)[:30]}…"
        raise UsageError(f"{where}: {path} is {shown}, not a measurement ({why}): measure again with gpurig bench")

    def walk(value, path: str, key: str | None) -> None:
        if isinstance(value, dict):
            for name, item in value.items():
                if name != "config":
                    walk(item, f"{path}.{name}" if path else str(name), str(name))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]", key)
        elif isinstance(value, float) and not math.isfinite(value):
            refuse(path, value, "not a finite number")
        elif key in _MEASURED and value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                refuse(path, value, "a number belongs here")
            if key in _POSITIVE and value <= 0:
                refuse(path, value, "it must be above 0")
            if value < 0:
                refuse(path, value, "it cannot be below 0")

    walk(profile, "", None)
    if profile.get("device") is not None and not isinstance(profile["device"], str):
        refuse("device", profile["device"], "the name of what bench ran on belongs here")
    for part in ("comm", "compute", "disk", "loading", "gemm"):
        if profile.get(part) is not None and not isinstance(profile[part], dict):
            refuse(part, profile[part], "a table of measurements belongs here")
    comm = profile.get("comm") or {}
    if comm and not isinstance(comm.get("ranks"), int):
        refuse("comm.ranks", comm.get("ranks"), "the ranks bench ran belong here")
    for engine, collectives in (comm.get("engines") or {}).items():
        if not isinstance(collectives, dict) or not all(isinstance(fit, dict) for fit in collectives.values()):
            refuse(f"comm.engines.{engine}", collectives, "a table of collectives belongs here")
    for ranks, measured in (profile.get("compute") or {}).items():
        if not isinstance(measured, dict):
            refuse(f"compute.{ranks}", measured, "a table of measurements belongs here")
        if "gemm" in measured and (not isinstance(measured["gemm"], list) or not measured["gemm"]):
            refuse(f"compute.{ranks}.gemm", measured.get("gemm"), "bench's GEMM timings belong here")
