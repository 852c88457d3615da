"""``gpurig choose``: what to buy (or rent) for a model, a budget and a deadline.

Every option — each candidate GPU at 1, 2, 4… GPUs, or whole clusters — is predicted by ``predict`` (samples/s,
memory per GPU, scaling, the bottleneck) and built by ``plan``'s rules (CPU, board, PSU, RAM, energy), priced
from the catalog's dated prices or the user's, and ranked by cost, time or energy per unit of work. Nothing is
computed a third way: each row's numbers are ``predict``'s and ``plan``'s on the same inputs.

>>> result = choose(ChooseRequest(model="mnist-mlp", candidates=("GTX 980", "GTX 680"), gpus=1))
>>> [row["option"] for row in result["rows"]]
['1 × GeForce GTX 980', '1 × GeForce GTX 680']
"""

from __future__ import annotations

import datetime
import math

from gpurig.choose.build import PricedBuild, build_with_parts, energy, plan_report
from gpurig.choose.options import Option, gpu_options, option
from gpurig.choose.prices import Price, PriceBook, price_book
from gpurig.choose.request import DEFAULT_HOURS, DEFAULT_MAX_GPUS, OBJECTIVES, ChooseRequest, check
from gpurig.errors import UsageError
from gpurig.hardware import rules
from gpurig.perf.precision import MIXED
from gpurig.predict import PredictRequest, predict
from gpurig.spec import catalog

SCHEMA = "gpurig.choose/1"
PER = 1e6   # cost, time and energy are per million samples


def choose(request: ChooseRequest, today: datetime.date | None = None) -> dict:
    """Every option predicted, built, priced and ranked by ``request.objective`` (``--json``'s object)."""
    check(request)
    book = price_book(request.prices, request.prices_file, today)
    options = gpu_options(request) + [option(cluster) for cluster in request.clusters]
    if request.budget is not None and request.gpus is None:
        options += _most_the_budget_buys(request, book, options)
    bought = [(o, purchase(o, book)) for o in options]
    kept, over = _within_budget(request, bought, book)
    rows = [evaluate(o, p, request, book) for o, p in kept]
    if request.budget is not None and request.cloud:
        over += [row["option"] for row in rows if not _affordable(row, request.budget)]
        rows = [row for row in rows if _affordable(row, request.budget)]
        if not rows:
            raise UsageError(f"--budget ${request.budget:,.0f} buys or rents none of the options")
    if not any(row["memory"]["fits"] for row in rows):
        raise UsageError(_nothing_fits(request, rows))
    rank(rows, request.objective)
    mark_pareto(rows)
    return {"schema": SCHEMA, "model": rows[0]["model"], "batch_per_gpu": rows[0]["batch_per_gpu"],
            "precision": request.precision, "optimizer": request.optimizer, "objective": request.objective,
            "work": _work(request), "price_per_kwh": request.price_per_kwh, "budget_usd": request.budget,
            "cloud": request.cloud, "today": book.today.isoformat(), "rows": rows, "over_budget": over,
            "notes": notes(rows, book)}


def purchase(o: Option, book: PriceBook) -> dict:
    """What buying the option costs: its GPUs at their prices, every machine's parts by plan's rules.

    >>> p = purchase(option("2 x RTX 4090"), price_book((), None, today=datetime.date(2026, 11, 25)))
    >>> p["gpu_usd"], p["gpu_prices"][0]["stale"]
    (3198.0, True)
    """
    priced = build_with_parts(o.build, book)
    prices = {name: book.buy(name) for name in o.gpu_models()}
    known = all(price is not None for price in prices.values())
    gpu_usd = sum(n * prices[name].usd for name, n in o.gpu_models().items()) if known else None
    return {"priced": priced, "gpu_usd": gpu_usd, "parts_usd": priced.parts_usd(),
            "build_usd": None if gpu_usd is None else gpu_usd + priced.parts_usd(),
            "gpu_prices": [{"gpu": name, **(price.as_dict() if price else {"usd": None})} for name, price in prices.items()],
            "missing": [name for name, price in prices.items() if price is None]}


def _most_the_budget_buys(request: ChooseRequest, book: PriceBook, options: list[Option]) -> list[Option]:
    """For each candidate GPU, the most of it (up to ``--max-gpus``) the budget buys, when that count is not
    already an option: one big GPU against several small ones at the same money."""
    have = {o.cluster for o in options}
    out = []
    for name in dict.fromkeys(o.gpu for o in options if o.gpu is not None):
        for n in range(request.max_gpus or DEFAULT_MAX_GPUS, 0, -1):
            candidate = option(f"{n} x {name}", f"{n} × {name}", name)
            cost = purchase(candidate, book)["build_usd"]
            if cost is not None and cost <= request.budget:
                if candidate.cluster not in have:
                    out.append(candidate)
                break
    return out


def _within_budget(request: ChooseRequest, bought: list, book: PriceBook) -> tuple[list, list[str]]:
    if request.budget is None:
        return bought, []
    def keep(o, p):
        if p["build_usd"] is not None:
            return p["build_usd"] <= request.budget or (request.cloud and _cloud_rate(o, book) is not None)
        return request.cloud and _cloud_rate(o, book) is not None
    kept = [(o, p) for o, p in bought if keep(o, p)]
    over = [o.label for o, p in bought if not keep(o, p)]
    if not kept:
        cheapest = min(((o, p) for o, p in bought if p["build_usd"] is not None), key=lambda x: x[1]["build_usd"],
                       default=None)
        if cheapest is None:
            raise UsageError(f"--budget ${request.budget:,.0f}: none of the options has a price: give --price")
        o, p = cheapest
        raise UsageError(f"--budget ${request.budget:,.0f} buys none of the options: the cheapest, {o.label}, costs "
                         f"${p['build_usd']:,.0f} (GPUs ${p['gpu_usd']:,.0f} + the rest of the build "
                         f"${p['parts_usd']:,.0f})" + ("" if request.cloud else "; --cloud adds renting"))
    return kept, over


def _affordable(row: dict, budget: float) -> bool:
    return (row["build_usd"] is not None and row["build_usd"] <= budget) or \
        (row["rent_usd"] is not None and row["rent_usd"] <= budget)


def _cloud_rate(o: Option, book: PriceBook) -> float | None:
    """USD per hour to rent the option's GPUs, None when a GPU has no cloud price.

    >>> _cloud_rate(option("2 x L4"), price_book((), None))
    1.61
    """
    prices = {name: book.cloud(name) for name in o.gpu_models()}
    if any(price is None for price in prices.values()):
        return None
    return sum(n * prices[name].usd for name, n in o.gpu_models().items())


def _cloud_prices(o: Option, book: PriceBook) -> list[dict]:
    return [{"gpu": name, **price.as_dict()} for name in o.gpu_models() if (price := book.cloud(name)) is not None]


def _work(request: ChooseRequest) -> dict:
    if request.epochs is not None:
        return {"mode": "epochs", "epochs": request.epochs, "dataset_size": request.dataset_size,
                "samples": request.epochs * request.dataset_size}
    return {"mode": "hours", "hours": request.hours or DEFAULT_HOURS}


def predict_request(o: Option, request: ChooseRequest) -> PredictRequest:
    """What ``predict`` is asked for one option: the same as ``gpurig predict --cluster`` with these flags.

    >>> predict_request(option("2 x RTX 4090"), ChooseRequest(model="resnet50", batch=32)).cluster
    '2 x RTX 4090'
    """
    return PredictRequest(model=request.model, cluster=o.cluster, batch=request.batch, tokens=request.tokens,
                          precision=request.precision, optimizer=request.optimizer)


def evaluate(o: Option, bought: dict, request: ChooseRequest, book: PriceBook) -> dict:
    """One option's row: predict's speed and memory, plan's build and energy, the prices, the guide's reasons."""
    predicted = predict(predict_request(o, request))
    rate = predicted["samples_per_s"]
    work = _work(request)
    hours = work["samples"] / rate / 3600 if work["mode"] == "epochs" else work["hours"]
    samples = work["samples"] if work["mode"] == "epochs" else rate * hours * 3600
    priced: PricedBuild = build_with_parts(o.build, book, hours, request.price_per_kwh)
    used = energy(priced.build, hours, request.price_per_kwh)
    report = plan_report(priced)
    build_usd = bought["build_usd"]
    own = None if build_usd is None else build_usd + used["usd"]
    rate_usd = _cloud_rate(o, book) if request.cloud else None
    rent = None if rate_usd is None else rate_usd * hours
    break_even = None
    if rate_usd is not None and build_usd is not None:
        saved_per_hour = rate_usd - used["usd"] / hours
        break_even = build_usd / saved_per_hour if saved_per_hour > 0 else math.inf
    costs = [c for c in (own, rent) if c is not None]
    cost = min(costs) if costs else None
    memory = predicted["memory"]
    point = next(p for p in predicted["scaling"] if p["gpus"] == predicted["gpus"])
    row = {
        "option": o.label, "cluster": o.cluster, "gpus": predicted["gpus"], "nodes": predicted["nodes"],
        "model": predicted["model"], "batch_per_gpu": predicted["batch_per_gpu"],
        "samples_per_s": rate, "step_ms": predicted["step"]["step_ms"], "speedup": point["speedup"],
        "scaling_efficiency": point["efficiency"], "bottleneck": predicted["bottleneck"],
        "precision": predicted["precision"], "precision_note": predicted["precision_note"],
        "tensor_cores": all(g.gpu.tensor_tflops for m in o.build.machines() for g in m.gpus),
        "hours": hours, "samples": samples, "hours_per_m_samples": PER / rate / 3600,
        "memory": {k: memory.get(k) for k in ("total_gb", "usable_gb", "gpu_gb", "fits", "largest_batch")},
        "fit_advice": fit_fixes(predicted),
        "gpu_prices": bought["gpu_prices"], "gpu_usd": bought["gpu_usd"], "parts_usd": bought["parts_usd"],
        "build_usd": build_usd,
        "parts": [[{"kind": p.kind, "name": p.name, **price.as_dict()} for p, price in zip(machine, prices)]
                  for machine, prices in zip(priced.parts, priced.prices)],
        "psu_w": report["psu_w"], "plan_overall": report["overall"], "plan_concerns": report["concerns"],
        "plan_energy": report["energy"], "draw_w": used["draw_w"], "energy_kwh": used["kwh"],
        "energy_usd": used["usd"], "own_usd": own,
        "cloud_usd_per_hour": rate_usd, "cloud_prices": _cloud_prices(o, book) if request.cloud else [],
        "rent_usd": rent, "break_even_hours": break_even,
        "cost_usd": cost, "cost_how": None if cost is None else "rent" if cost == rent and cost != own else "buy",
        "usd_per_m_samples": None if cost is None else cost / samples * PER,
        "kwh_per_m_samples": used["kwh"] / samples * PER,
    }
    row["reasons"] = reasons(o, row, request)
    return row


def fit_fixes(predicted: dict) -> list[str]:
    """What would make an option that does not fit fit: the items of ``predict``'s advice that say they fit
    (a smaller per-GPU batch, 16-bit activations, sharded optimizer state), else model parallelism or more memory.

    >>> fit_fixes(predict(PredictRequest(model="bert-large", cluster="4 x RTX 4070", batch=8, tokens=512,
    ...                                  optimizer="adam")))
    ['per-GPU batch 6', '--precision bf16', 'sharded optimizer state (ZeRO-1)']
    """
    if predicted["memory"].get("fits", True):
        return []
    fixes = [item["what"].replace(" (mixed precision)", "").replace(", torch's ZeroRedundancyOptimizer", "")
             for item in predicted["advice"] if item.get("fits")]
    return fixes or ["model parallelism or a GPU with more memory"]


def reasons(o: Option, row: dict, request: ChooseRequest) -> list[str]:
    """The guide's reasons beside a row: does it fit, tensor cores, memory bandwidth, scaling and the link, plan's
    warnings, and a missing price.

    >>> row = {"memory": {"fits": True}, "gpus": 1, "plan_concerns": [], "gpu_usd": 1.0, "bottleneck": "compute"}
    >>> reasons(option("1 x GTX 980"), row, ChooseRequest(model="m"))
    ['4 GB, memory bandwidth 224 GB/s, no tensor cores']
    """
    out = []
    memory = row["memory"]
    if not memory["fits"]:
        fix = " or ".join(row.get("fit_advice") or []) or "model parallelism or a GPU with more memory"
        out.append(f"does not fit: {memory['total_gb']:.2f} of {memory['usable_gb']:.2f} GB; {fix} would fit")
    machine = o.build.machines()[0]
    gpu = min((g.gpu for m in o.build.machines() for g in m.gpus), key=lambda g: g.memory_gb)
    cores = f"tensor cores {gpu.tensor_tflops:g} TF" if gpu.tensor_tflops else "no tensor cores"
    out.append(f"{gpu.memory_gb:g} GB, memory bandwidth {gpu.memory_bandwidth_gbs:g} GB/s, {cores}")
    if row["gpus"] > 1:
        if o.build.node_count > 1:
            link = o.build.network.name if o.build.network is not None else "no network given"
        elif gpu.gpu_link_gbs:
            link = "NVLink"
        else:
            lanes = rules.gpu_lanes(machine)
            link = f"PCIe {machine.board.pcie_gen or gpu.pcie_gen}" + (f" x{min(lanes)}" if lanes else "")
        out.append(f"{row['speedup']:.2f}x on {row['gpus']} GPUs over {link} ({row['bottleneck']}-bound)")
    for concern in row["plan_concerns"]:
        out.append(f"plan: {concern['rule']} {concern['verdict']} ({concern['number']})")
    if row["gpu_usd"] is None:
        out.append("no purchase price: give --price")
    return out


def _key(row: dict, objective: str) -> tuple:
    value = {"cost": row["usd_per_m_samples"], "time": row["hours_per_m_samples"],
             "energy": row["kwh_per_m_samples"]}[objective]
    return (not row["memory"]["fits"], value is None, value if value is not None else 0.0,
            row["hours_per_m_samples"])


def rank(rows: list[dict], objective: str) -> None:
    """Sort ``rows`` in place, best first by ``objective`` (per million samples); rows that do not fit, and rows
    without the number, go last. Each row gets its ``rank``.

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
              if r["memory"]["fits"] and r["usd_per_m_samples"] is not None]
    for row in rows:
        cost, time = row["usd_per_m_samples"], row["hours_per_m_samples"]
        row["pareto"] = bool(row["memory"]["fits"] and cost is not None and not any(
            c <= cost and t <= time and (c < cost or t < time) for c, t in points))


def notes(rows: list[dict], book: PriceBook) -> list[str]:
    """What the reader should know about the prices: the ones older than a year, the GPUs without one.

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


def _nothing_fits(request: ChooseRequest, rows: list[dict]) -> str:
    """One line: no option fits; the closest one and the smallest change that makes it fit (checked by predict)."""
    closest = min(rows, key=lambda r: r["memory"]["total_gb"] / (r["memory"]["usable_gb"] or 1e-9))
    memory = closest["memory"]
    fix = " or ".join(closest["fit_advice"])
    what = f"{closest['model']} at {closest['batch_per_gpu']} per GPU ({request.precision})"
    return (f"{what} fits none of the {len(rows)} options: the closest, {closest['option']}, needs "
            f"{memory['total_gb']:.1f} GB of {memory['usable_gb']:.1f} usable; {fix} would make it fit")


__all__ = ["ChooseRequest", "choose", "rank", "mark_pareto", "purchase", "evaluate", "predict_request", "SCHEMA",
           "Price"]
