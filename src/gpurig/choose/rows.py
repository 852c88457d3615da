"""One option's row: ``predict``'s speed and memory, ``plan``'s build and energy, the prices, what it costs per
unit of work, and the guide's reasons beside it.

>>> from gpurig.choose.options import option
>>> from gpurig.choose.prices import price_book
>>> o = option("1 x GTX 980")
>>> row = evaluate(o, purchase(o, price_book((), None)), ChooseRequest(model="mnist-mlp"), price_book((), None))
>>> row["samples_per_s"] == predict(predict_request(o, ChooseRequest(model="mnist-mlp")))["samples_per_s"]
True
"""

from __future__ import annotations

from gpurig.choose.build import PricedBuild, build_with_parts, energy, plan_report
from gpurig.choose.options import Option
from gpurig.choose.prices import PriceBook
from gpurig.choose.request import ChooseRequest, work_of
from gpurig.hardware import rules
from gpurig.perf.machine import nvlink_ring
from gpurig.predict import PredictRequest, predict
from gpurig.spec.hardware import DEVICES_PER_BOARD

PER = 1e6   # cost, time and energy are per million samples


def purchase(o: Option, book: PriceBook) -> dict:
    """What buying the option costs: its GPUs at their prices, every machine's parts by plan's rules.

    >>> from gpurig.choose.options import option
    >>> from gpurig.choose.prices import price_book
    >>> p = purchase(option("2 x RTX 4090"), price_book((), None))
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


def _cloud_rate(o: Option, book: PriceBook) -> float | None:
    """USD per hour to rent the option's GPUs, None when a GPU has no cloud price.

    >>> from gpurig.choose.options import option
    >>> from gpurig.choose.prices import price_book
    >>> _cloud_rate(option("2 x L4"), price_book((), None))
    1.61
    """
    prices = {name: book.cloud(name) for name in o.gpu_models()}
    if any(price is None for price in prices.values()):
        return None
    return sum(n * prices[name].usd for name, n in o.gpu_models().items())


def _cloud_prices(o: Option, book: PriceBook) -> list[dict]:
    return [{"gpu": name, **price.as_dict()} for name in o.gpu_models() if (price := book.cloud(name)) is not None]


def predict_request(o: Option, request: ChooseRequest) -> PredictRequest:
    """What ``predict`` is asked for one option: the same as ``gpurig predict --cluster`` with these flags.

    >>> from gpurig.choose.options import option
    >>> predict_request(option("2 x RTX 4090"), ChooseRequest(model="resnet50", batch=32)).cluster
    '2 x RTX 4090'
    """
    return PredictRequest(model=request.model, cluster=o.cluster, batch=request.batch, tokens=request.tokens,
                          sample=request.sample, precision=request.precision, optimizer=request.optimizer,
                          optimizer_impl=request.optimizer_impl)


def evaluate(o: Option, bought: dict, request: ChooseRequest, book: PriceBook) -> dict:
    """One option's row: predict's speed and memory, plan's build and energy, the prices, the guide's reasons."""
    predicted = predict(predict_request(o, request))
    rate = predicted["samples_per_s"]
    work = work_of(request)
    hours = work["samples"] / rate / 3600 if work["mode"] == "epochs" else work["hours"]
    samples = work["samples"] if work["mode"] == "epochs" else rate * hours * 3600
    priced: PricedBuild = build_with_parts(o.build, book, hours, request.price_per_kwh)
    used = energy(priced.build, hours, request.price_per_kwh)
    report = plan_report(priced)
    build_usd = bought["build_usd"]
    own = None if build_usd is None else build_usd + used["usd"]
    rate_usd = _cloud_rate(o, book) if request.cloud else None
    rent = None if rate_usd is None else rate_usd * hours
    break_even, never = None, False
    if rate_usd is not None and build_usd is not None:
        saved_per_hour = rate_usd - used["usd"] / hours
        if saved_per_hour > 0:
            break_even = build_usd / saved_per_hour
        else:   # the electricity alone costs more than the rent: buying never pays
            never = True
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
        "rent_usd": rent, "break_even_hours": break_even, "break_even_never": never,
        "cost_usd": cost, "cost_how": None if cost is None else "rent" if cost == rent and cost != own else "buy",
        "usd_per_m_samples": None if cost is None else cost / samples * PER,
        "kwh_per_m_samples": used["kwh"] / samples * PER,
    }
    row["reasons"] = reasons(o, row, request)
    return row


def fit_fixes(predicted: dict) -> list[str]:
    """What would make an option that does not fit fit: the items of ``predict``'s advice that say they fit
    (a smaller per-GPU batch, 16-bit activations, sharded optimizer state and gradients), else model parallelism or more memory.

    >>> fit_fixes(predict(PredictRequest(model="bert-large", cluster="4 x RTX 4070", batch=8, tokens=512,
    ...                                  optimizer="adam")))
    ['per-GPU batch 7', '--precision bf16', '--shard optimizer', '--shard gradients']
    """
    if predicted["memory"].get("fits", True):
        return []
    fixes = [item["what"].split(" (")[0] for item in predicted["advice"] if item.get("fits")]
    return fixes or ["model parallelism or a GPU with more memory"]


def reasons(o: Option, row: dict, request: ChooseRequest) -> list[str]:
    """The guide's reasons beside a row: does it fit, tensor cores, memory bandwidth, scaling and the link, plan's
    warnings, and a missing price.

    >>> from gpurig.choose.options import option
    >>> row = {"memory": {"fits": True}, "gpus": 1, "plan_concerns": [], "gpu_usd": 1.0, "bottleneck": "compute"}
    >>> reasons(option("1 x GTX 980"), row, ChooseRequest(model="m"))
    ['4 GB, memory bandwidth 224 GB/s, no tensor cores']
    """
    out = []
    memory = row["memory"]
    if not memory["fits"]:
        fix = " or ".join(row.get("fit_advice") or []) or "model parallelism or a GPU with more memory"
        out.append(f"does not fit: {memory['total_gb']:.2f} of {memory['usable_gb']:.2f} GiB; {fix} would fit")
    machine = o.build.machines()[0]
    gpu = min((g.gpu for m in o.build.machines() for g in m.gpus), key=lambda g: g.memory_gb)
    cores = f"tensor cores {gpu.tensor_tflops:g} TF" if gpu.tensor_tflops else "no tensor cores"
    devices = DEVICES_PER_BOARD.get(gpu.name, 1)
    board = f" (a board of {devices} devices, {gpu.memory_gb / devices:g} GB each)" if devices > 1 else ""
    out.append(f"{gpu.memory_gb:g} GB{board}, memory bandwidth {gpu.memory_bandwidth_gbs:g} GB/s, {cores}")
    if row["gpus"] > 1:
        if o.build.node_count > 1:
            link = o.build.network.name if o.build.network is not None else "no network given"
        elif nvlink_ring(gpu, row["gpus"], row["gpus"]):   # as predict prices it: a PCIe card's bridge joins a pair
            link = gpu.gpu_link or "NVLink"
        else:
            lanes = rules.gpu_lanes(machine)
            link = f"PCIe {machine.board.pcie_gen or gpu.pcie_gen}" + (f" x{min(lanes)}" if lanes else "")
        out.append(f"{row['speedup']:.2f}x on {row['gpus']} GPUs over {link} ({row['bottleneck']}-bound)")
    for concern in row["plan_concerns"]:
        out.append(f"plan: {concern['rule']} {concern['verdict']} ({concern['number']})")
    if row["gpu_usd"] is None:
        out.append("no purchase price: give --price")
    return out


