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

from gpurig.choose.options import Option, gpu_options, option
from gpurig.choose.prices import PriceBook, price_book
from gpurig.choose.ranking import mark_pareto, notes, rank
from gpurig.choose.request import DEFAULT_MAX_GPUS, ChooseRequest, check, work_of
from gpurig.choose.rows import _cloud_rate, evaluate, purchase
from gpurig.errors import UsageError

SCHEMA = "gpurig.choose/1"


def choose(request: ChooseRequest, today: datetime.date | None = None) -> dict:
    """Every option predicted, built, priced and ranked by ``request.objective`` (``--json``'s object)."""
    check(request)
    options = gpu_options(request) + [option(cluster) for cluster in dict.fromkeys(request.clusters)]
    book = price_book(request.prices, request.prices_file, today, described=_described_gpus(options))
    if request.budget is not None and request.gpus is None:
        options += _most_the_budget_buys(request, book, options)
    bought = [(o, purchase(o, book)) for o in options]
    kept, over = _within_budget(request, bought, book)
    rows, cannot = [], []
    for o, p in kept:
        try:
            rows.append(evaluate(o, p, request, book))
        except UsageError as error:   # fp8 on a GPU without it: that option is left out, the others ranked
            cannot.append((o.label, str(error)))
    if not rows and cannot:
        raise UsageError(cannot[0][1])
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
            "work": work_of(request), "price_per_kwh": request.price_per_kwh, "budget_usd": request.budget,
            "cloud": request.cloud, "today": book.today.isoformat(), "rows": rows, "over_budget": over,
            "notes": notes(rows, book) + [f"left out {', '.join(label for label, said in cannot if said == why)}: {why}"
                                          for why in dict.fromkeys(why for _, why in cannot)]}


def _described_gpus(options) -> tuple[str, ...]:
    """The GPUs the options' specs describe that the catalog lacks (``[nodes.gpu]`` with a name of its own)."""
    from gpurig.spec import catalog
    from gpurig.spec.fields import SpecError

    names = []
    for o in options:
        for name in o.gpu_models():
            try:
                catalog.gpu(name)
            except SpecError:
                names.append(name)
    return tuple(dict.fromkeys(names))


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


def _nothing_fits(request: ChooseRequest, rows: list[dict]) -> str:
    """One line: no option fits; the closest one and the smallest change that makes it fit (checked by predict)."""
    closest = min(rows, key=lambda r: r["memory"]["total_gb"] / (r["memory"]["usable_gb"] or 1e-9))
    memory = closest["memory"]
    fix = " or ".join(closest["fit_advice"])
    what = f"{closest['model']} at {closest['batch_per_gpu']} per GPU ({request.precision})"
    return (f"{what} fits none of the {len(rows)} options: the closest, {closest['option']}, needs "
            f"{memory['total_gb']:.1f} GiB of {memory['usable_gb']:.1f} usable; {fix} would make it fit")


__all__ = ["ChooseRequest", "choose", "SCHEMA"]
