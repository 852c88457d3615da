"""The options in order: by cost, time or energy per million samples, the Pareto front of cost against time,
and the notes on the prices beside them."""

from __future__ import annotations

from gpurig.choose.prices import PriceBook
from gpurig.choose.request import OBJECTIVES
from gpurig.errors import UsageError
from gpurig.hardware.rules import PROBLEM
from gpurig.perf.precision import MIXED


def _key(row: dict, objective: str) -> tuple:
    value = {"cost": row["usd_per_m_samples"], "time": row["hours_per_m_samples"],
             "energy": row["kwh_per_m_samples"]}[objective]
    return (not row["memory"]["fits"], unbuildable(row), value is None, value if value is not None else 0.0,
            row["hours_per_m_samples"])


# plan's rules whose problem means no machine of the parts list holds the option (a slow one still runs: lanes, heat)
CANNOT_BUILD = ("board slots", "PSU watts", "power connectors")


def unbuildable(row: dict) -> bool:
    """Whether plan finds that nothing in the parts list builds the option's machine: too few slots for its cards,
    no PSU with the watts or the connectors.

    >>> unbuildable({"plan_concerns": [{"rule": "board slots", "verdict": "problem"}]})
    True
    >>> unbuildable({"plan_concerns": [{"rule": "cooling", "verdict": "problem"}]}), unbuildable({})
    (False, False)
    """
    return any(c["rule"] in CANNOT_BUILD and c["verdict"] == PROBLEM for c in row.get("plan_concerns", ()))


def rank(rows: list[dict], objective: str) -> None:
    """Sort ``rows`` in place, best first by ``objective`` (per million samples); rows that do not fit, then rows
    no machine of the parts list holds (:func:`unbuildable`), then rows without the number, go last. Each row gets its ``rank``.

    >>> rows = [{"memory": {"fits": True}, "usd_per_m_samples": 2.0, "hours_per_m_samples": 1.0, "kwh_per_m_samples": 1},
    ...         {"memory": {"fits": True}, "usd_per_m_samples": 1.0, "hours_per_m_samples": 2.0, "kwh_per_m_samples": 1}]
    >>> rank(rows, "time"); [r["usd_per_m_samples"] for r in rows]
    [2.0, 1.0]
    """
    if objective not in OBJECTIVES:
        raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}")
    rows.sort(key=lambda row: _key(row, objective))
    for i, row in enumerate(rows, start=1):
        row["rank"] = i


def mark_pareto(rows: list[dict]) -> None:
    """Mark each row ``pareto``: no other row that fits is as cheap and as fast per unit of work and better in one.

    >>> rows = [{"memory": {"fits": True}, "usd_per_m_samples": c, "hours_per_m_samples": h} for c, h in
    ...         [(1, 3), (2, 2), (3, 3), (None, 1)]]
    >>> mark_pareto(rows); [r["pareto"] for r in rows]
    [True, True, False, False]
    """
    points = [(r["usd_per_m_samples"], r["hours_per_m_samples"]) for r in rows
              if r["memory"]["fits"] and not unbuildable(r) and r["usd_per_m_samples"] is not None]
    for row in rows:
        cost, time = row["usd_per_m_samples"], row["hours_per_m_samples"]
        row["pareto"] = bool(row["memory"]["fits"] and not unbuildable(row) and cost is not None and not any(
            c <= cost and t <= time and (c < cost or t < time) for c, t in points))


def notes(rows: list[dict], book: PriceBook) -> list[str]:
    """What the reader should know about the prices: the ones older than a year, the GPUs without one.

    >>> import datetime
    >>> from gpurig.choose.prices import price_book
    >>> book = price_book((), None, today=datetime.date(2026, 11, 25))
    >>> row = {"gpu_prices": [{"gpu": "GeForce GTX 980", **book.buy("GeForce GTX 980").as_dict()}], "parts": [],
    ...        "precision": "fp32", "tensor_cores": False}
    >>> notes([row], book)[0]
    "prices older than a year (!): GeForce GTX 980 $549 of 2014-09-18: give --price 'NAME=USD' or --prices FILE (sources: --json, spec/data/prices.csv)"
    """
    out, missing, stale = [], {}, {}
    for row in rows:
        for price in row["gpu_prices"]:
            if price["usd"] is None:
                missing[price["gpu"]] = True
            elif price.get("stale"):
                stale[price["gpu"]] = f"{price['gpu']} ${price['usd']:,.0f} of {price['date']}"
    if stale:
        out.append(f"prices older than a year (!): {', '.join(stale.values())}: give --price 'NAME=USD' or "
                   "--prices FILE (sources: --json, spec/data/prices.csv)")
    hourly = {p["gpu"]: f"{p['gpu']} ${p['usd']:g}/h of {p['date']}" for row in rows
              for p in row.get("cloud_prices", []) if p["stale"]}
    if hourly:
        out.append(f"cloud prices older than a year (!): {', '.join(hourly.values())}: give --price 'NAME=USD/h'")
    if missing:
        out.append(f"no purchase price for {', '.join(missing)}: give --price 'NAME=USD'")
    stale_parts = sorted({p["date"] for row in rows for machine in row["parts"] for p in machine if p["stale"]})
    if stale_parts:
        out.append(f"the rest of the build is priced as of {', '.join(stale_parts)}, older than a year "
                   "(spec/data/parts.csv): --prices FILE gives yours")
    if any(r["precision"] not in MIXED and r["tensor_cores"] for r in rows):
        out.append("fp32 leaves most of the tensor cores idle (matrix multiplies in FP32): --precision bf16 uses them")
    return out


