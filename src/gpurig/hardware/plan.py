"""``gpurig plan``: a parts list (build file, flags, cluster spec or description) checked against every rule.

>>> report = plan(inputs(flags={"gpus": [{"model": "2080ti", "count": 4}], "ram_gb": 32}))
>>> [v["verdict"] for v in report["verdicts"] if v["rule"] == "RAM size"]
['ok']

A cluster of different machines is checked machine by machine (PSU, connectors, lanes, cooling…), and as a
whole (energy, network, the slowest GPU).
"""

from __future__ import annotations

import dataclasses
import difflib

from gpurig.hardware import rules
from gpurig.perf import power
from gpurig.spec.build import Build, build_data_from_spec, build_from, load_build
from gpurig.spec.cluster import load_spec
from gpurig.spec.describe import parse_description
from gpurig.spec.fields import SpecError


def merge(base: dict, flags: dict) -> dict:
    """``flags`` over ``base``, table by table (a flag replaces one field, not its whole table).

    >>> merge({"psu": {"watts": 1000, "efficiency": 0.9}}, {"psu": {"watts": 1600}})
    {'psu': {'watts': 1600, 'efficiency': 0.9}}
    """
    out = dict(base)
    for key, value in flags.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


# A build file's top level as the file writes each key: arrays of tables, tables, plain values (read by
# gpurig.spec.build.build_from, which refuses any other key; tests/test_plan.py keeps the two lists the same).
BUILD_SECTIONS = {"gpus": "[[gpus]]", "other_nodes": "[[other_nodes]]", "cpu": "[cpu]", "psu": "[psu]",
                  "board": "[board]", "storage": "[storage]", "case": "[case]", "usage": "[usage]",
                  "cluster": "[cluster]", "ram_gb": "ram_gb"}


def check_top_level(data: dict, where: str) -> None:
    """Refuse an unknown top-level key before anything else is said of the build (a misplaced ``gpu = "2080ti"``
    would read as "no GPUs"), naming the closest section as the file writes it.

    >>> check_top_level({"gpu": "2080ti", "ram_gb": 64}, "b.toml")
    Traceback (most recent call last):
    ...
    gpurig.spec.fields.SpecError: b.toml: unknown field 'gpu' (did you mean a [[gpus]] table, with model = "2080ti" in it?)
    >>> check_top_level({"psus": {"watts": 1000}}, "b.toml")
    Traceback (most recent call last):
    ...
    gpurig.spec.fields.SpecError: b.toml: unknown field 'psus' (did you mean [psu]?)
    """
    for key, value in data.items():
        if key in BUILD_SECTIONS:
            continue
        close = difflib.get_close_matches(str(key).lower(), BUILD_SECTIONS, n=1)
        if not close:
            raise SpecError(f"{where}: unknown field {key!r} (a build file has {', '.join(BUILD_SECTIONS.values())})")
        form = BUILD_SECTIONS[close[0]]
        hint = f'a {form} table, with model = "{value}" in it' if close[0] == "gpus" and isinstance(value, str) \
            else form
        raise SpecError(f"{where}: unknown field {key!r} (did you mean {hint}?)")


def inputs(build_file: str | None = None, spec_file: str | None = None, description: str | None = None,
           flags: dict | None = None) -> Build:
    """The :class:`Build` from one source of parts (file, spec, description or none) with ``flags`` on top."""
    if sum(x is not None for x in (build_file, spec_file, description)) > 1:
        raise SpecError("give one of --build, --spec and --describe")
    where = build_file or spec_file or "flags"
    if build_file is not None:
        base = load_build(build_file)
    elif spec_file is not None:
        base = build_data_from_spec(load_spec(spec_file))
    elif description is not None:
        base, where = build_data_from_spec(parse_description(description)), "--describe"
    else:
        base = {}
    flags = flags or {}
    data = merge(base, flags)
    if data.get("other_nodes"):
        # a cluster of different machines: a part given by a flag is every machine's; GPUs and counts are per machine
        per_machine = (["--gpu"] if "gpus" in flags else []) + \
            (["--nodes"] if "nodes" in flags.get("cluster", {}) else [])
        if per_machine:
            raise SpecError(f"{where} describes {1 + len(data['other_nodes'])} kinds of machine: "
                            f"{', '.join(per_machine)} would change only the first; edit the file instead")
        shared = {k: v for k, v in flags.items() if k != "cluster"}
        data["other_nodes"] = [merge(other, shared) for other in data["other_nodes"]]
    check_top_level(data, where)
    if not data.get("gpus"):
        raise SpecError(f"{where}: no GPUs: give --gpu NAME (and --count N) or a build file with [[gpus]]")
    return build_from(data, where)


def psu_versions(build: Build) -> dict:
    """gpurig's PSU number beside the hardware guide's other versions of the rule, for this build.

    >>> from gpurig.spec.build import build_from
    >>> psu_versions(build_from({"gpus": [{"model": "2080ti", "count": 4}], "cpu": {"cores": 8, "tdp_w": 150}}, "x"))
    {'gpurig_w': 1265.0, 'gpurig_psu_w': 1300, 'guide_example_w': 1250.0, 'guide_example_margin_w': 1375.0, 'guide_example_psu_w': 1400}
    """
    tdps = [g.tdp_w or 0 for g in build.each_gpu()]
    cpu = rules.cpu_tdp(build)
    ours = power.psu_watts(tdps, cpu)
    other = 0.1 * sum(tdps)  # the guide's example adds 100 W for 4 × 250 W: 10 % of the GPUs' watts
    example = power.psu_watts(tdps, cpu, other_w=other, headroom=0.0)
    margin = power.psu_watts(tdps, cpu, other_w=other)
    return {"gpurig_w": round(ours, 1), "gpurig_psu_w": power.psu_size(ours), "guide_example_w": round(example, 1),
            "guide_example_margin_w": round(margin, 1), "guide_example_psu_w": power.psu_size(margin, step_w=100)}


def plan(build: Build) -> dict:
    """Every rule applied to ``build``, as a JSON-ready report."""
    verdicts, skipped = rules.check(build)
    worst = max((rules.VERDICTS.index(v.verdict) for v in verdicts if v.verdict != rules.INFO), default=0)
    return {
        "gpus": [{"model": g.gpu.name, "count": g.count, "cooler": g.cooling} for g in build.gpus],
        "nodes": build.node_count,
        "machines": [{"name": rules.machine_name(m, i), "nodes": m.nodes,
                      "gpus": [{"model": g.gpu.name, "count": g.count, "cooler": g.cooling} for g in m.gpus],
                      "psu": psu_versions(m)} for i, m in enumerate(build.machines())],
        "verdicts": [dataclasses.asdict(v) for v in verdicts],
        "skipped": [dataclasses.asdict(s) for s in skipped],
        "psu": psu_versions(build),
        "overall": rules.VERDICTS[worst],
    }
