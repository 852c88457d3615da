"""gpurig plan: the hardware guide's rules and numbers through the command line and the library."""

import json

import pytest

from conftest import gpurig as gpurig_cli
from conftest import run_cli
from gpurig.perf import power
from gpurig.hardware.plan import inputs, plan
from gpurig.spec import catalog

EXAMPLES = "examples"


def verdicts(report):
    return {v["rule"]: v for v in report["verdicts"]}


def run_plan(**flags):
    return verdicts(plan(inputs(flags=flags)))


def test_guide_example_psu_and_energy_through_the_cli():
    code, out, err = run_cli(["plan", "--build", f"{EXAMPLES}/build-guide-example.toml", "--json"])
    assert code == 0, err
    report = json.loads(out)
    assert report["psu"] == {"gpurig_w": 1265.0, "gpurig_psu_w": 1300, "guide_example_w": 1250.0,
                             "guide_example_margin_w": 1375.0, "guide_example_psu_w": 1400}
    v = verdicts(report)
    assert v["PSU watts"]["verdict"] == "info" and "1300" in v["PSU watts"]["number"]
    kwh = power.wall_energy_kwh(4 * catalog.gpu("1080 ti").tdp_w + 150, 336, 0.8)
    assert v["energy"]["number"] == f"{kwh:.0f} kWh, {kwh * 0.2:.2f} €"


def test_guide_energy_example_with_its_draw():
    # 4 GPUs "at full power (1000-1500 watts)" for two weeks at 0.20 €/kWh behind an 80 % PSU
    for draw, kwh, extra in ((1000, 336, 16.8), (1500, 504, 25.2)):
        v = run_plan(gpus=[{"model": "2080ti", "count": 4}], psu={"efficiency": 0.8},
                     usage={"hours": 336, "price_per_kwh": 0.2, "draw_w": draw})
        assert v["energy"]["number"].startswith(f"{kwh / 0.8:.0f} kWh")
        assert f"+{extra:.2f} €" in v["PSU efficiency"]["number"]
        lossless = run_plan(gpus=[{"model": "2080ti", "count": 4}], usage={"hours": 336, "price_per_kwh": 0.2,
                                                                            "draw_w": draw})
        assert lossless["energy"]["number"] == f"{kwh} kWh, {kwh * 0.2:.2f} €"


@pytest.mark.parametrize("watts,verdict", [(1300, "ok"), (1200, "warning"), (1000, "problem")])
def test_psu_verdicts(watts, verdict):
    v = run_plan(gpus=[{"model": "2080ti", "count": 4}], cpu={"cores": 8, "tdp_w": 150}, psu={"watts": watts})
    assert v["PSU watts"]["verdict"] == verdict


def test_ram_at_least_the_largest_gpu():
    # the guide: a Titan RTX with 24 GB wants at least 24 GB of RAM; more GPUs need no more
    assert run_plan(gpus=[{"model": "Titan RTX", "count": 1}], ram_gb=16)["RAM size"]["verdict"] == "warning"
    assert run_plan(gpus=[{"model": "Titan RTX", "count": 4}], ram_gb=24)["RAM size"]["verdict"] == "ok"


@pytest.mark.parametrize("preprocessing,threads,verdict", [
    ("during", 16, "ok"), ("during", 8, "warning"), ("before", 8, "ok"), ("before", 2, "problem")])
def test_cpu_threads_per_gpu(preprocessing, threads, verdict):
    v = run_plan(gpus=[{"model": "2080ti", "count": 4}], cpu={"cores": threads, "threads": threads},
                 usage={"preprocessing": preprocessing})
    assert v["CPU threads"]["verdict"] == verdict
    assert f"need ≥ {4 * (4 if preprocessing == 'during' else 2)}" in v["CPU threads"]["number"]


def test_pcie_lanes_eight_per_gpu_at_four_gpus():
    ok = run_plan(gpus=[{"model": "2080ti", "count": 4}], board={"lanes": [16, 8, 8, 8]})["PCIe lanes"]
    assert ok["verdict"] == "ok" and "2.30 ms" in ok["number"]       # the guide's x8 batch time
    narrow = run_plan(gpus=[{"model": "2080ti", "count": 4}], board={"lanes": [8, 8, 4, 4]})["PCIe lanes"]
    assert narrow["verdict"] == "warning" and "4.60 ms" in narrow["number"]
    few = run_plan(gpus=[{"model": "2080ti", "count": 2}], board={"lanes": [4, 4]})["PCIe lanes"]
    assert few["verdict"] == "ok"                                     # hardly matters for 1–3 GPUs
    from_cpu = run_plan(gpus=[{"model": "2080ti", "count": 4}], cpu={"cores": 4, "pcie_lanes": 16})["PCIe lanes"]
    assert from_cpu["number"].startswith("4/4/4/4")


def test_cooling_rules():
    adjacent = {"gpu_slots": 4, "slot_pitch": 2}
    assert run_plan(gpus=[{"model": "2080ti", "count": 4}], board=adjacent)["cooling"]["verdict"] == "problem"
    blower = run_plan(gpus=[{"model": "2080ti", "count": 4, "cooler": "blower"}], board=adjacent)["cooling"]
    assert blower["verdict"] == "ok" and "10–15 %" in blower["number"]
    water = run_plan(gpus=[{"model": "2080ti", "count": 4, "cooler": "water"}])["cooling"]
    assert "$450" in water["reason"]                                   # $100 per GPU + $50
    spaced = run_plan(gpus=[{"model": "2080ti", "count": 2}], board={"gpu_slots": 4})["cooling"]
    assert spaced["verdict"] == "ok"


def test_slots_connectors_memory_network_and_mixed_models():
    v = run_plan(gpus=[{"model": "4090", "count": 4}], board={"gpu_slots": 4, "slot_pitch": 2})
    assert v["board slots"]["verdict"] == "problem"                  # 3-slot cards 2 slots apart
    assert "2 cards fit" in v["board slots"]["reason"], v["board slots"]
    v = run_plan(gpus=[{"model": "4090", "count": 2}], board={"gpu_slots": 4, "slot_pitch": 2})
    assert v["board slots"]["verdict"] == "ok"                       # slots 1 and 3: a spare slot under each
    v = run_plan(gpus=[{"model": "RTX A6000", "count": 2}], psu={"pcie_8pin": 4})
    assert v["power connectors"]["verdict"] == "problem" and "0 × EPS 8-pin" in v["power connectors"]["reason"]
    v = run_plan(gpus=[{"model": "RTX A6000", "count": 2}], psu={"pcie_8pin": 4, "eps_8pin": 2})
    assert v["power connectors"]["verdict"] == "ok"
    v = run_plan(gpus=[{"model": "2080ti", "count": 4}], psu={"pcie_8pin": 6})
    assert v["power connectors"]["verdict"] == "problem" and "8 × 8-pin" in v["power connectors"]["number"]
    v = run_plan(gpus=[{"model": "1080 ti", "count": 2}], psu={"pcie_6pin": 0, "pcie_8pin": 4})
    assert v["power connectors"]["verdict"] == "ok"                   # 6+2 plugs feed the 6-pin sockets
    v = run_plan(gpus=[{"model": "GTX 980"}], usage={"use_case": "kaggle"})
    assert v["GPU memory"]["verdict"] == "ok"
    v = run_plan(gpus=[{"model": "GTX 980"}], usage={"use_case": "sota-research"})
    assert v["GPU memory"]["verdict"] == "problem"
    v = run_plan(gpus=[{"model": "2070"}], usage={"use_case": "sota-research", "fp16": True})
    assert v["GPU memory"]["verdict"] == "ok"                         # 16-bit doubles the 8 GB
    v = run_plan(gpus=[{"model": "2080ti", "count": 4}], cluster={"nodes": 2, "network": "1GbE"})
    assert v["network"]["verdict"] == "problem"
    v = run_plan(gpus=[{"model": "2080ti", "count": 4}], cluster={"nodes": 2, "network": "FDR"})
    assert v["network"]["verdict"] == "ok"
    v = run_plan(gpus=[{"model": "2080ti"}, {"model": "1080 ti"}])
    assert v["GPU models"]["verdict"] == "warning"


def test_flags_override_the_build_file_and_table_output(monkeypatch):
    # in this process: the build's fp16 rule describes a ResNet-152, once per process (a fresh one takes seconds)
    code, out, err = run_cli(["plan", "--build", f"{EXAMPLES}/build-4x2080ti.toml", "--psu-watts", "900", "--json"])
    report = json.loads(out)
    assert code == 0 and verdicts(report)["PSU watts"]["verdict"] == "problem" and report["overall"] == "problem"
    psu = json.loads(run_cli(["plan", "--build", f"{EXAMPLES}/build-4x2080ti.toml", "--json"])[1])["psu"]
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(["plan", "--build", f"{EXAMPLES}/build-4x2080ti.toml"])
    assert code == 0 and "PSU watts" in out, err
    assert f"{psu['guide_example_margin_w']:g} W → {psu['guide_example_psu_w']} W" in out


def test_cli_unknown_gpu_and_help():
    done = gpurig_cli("plan", "--gpu", "rtx 2090", timeout=60)
    assert done.returncode == 2 and "closest:" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    for verb in ("plan", "doctor", "bench"):
        helped = gpurig_cli(verb, "--help", timeout=60)
        assert helped.returncode == 0 and "examples:" in helped.stdout and f"gpurig {verb}" in helped.stdout


@pytest.mark.parametrize("text,expected", [
    ('gpu = "2080ti"\nram_gb = 64\n', "unknown field 'gpu' (did you mean a [[gpus]] table, with model = \"2080ti\" in it?)"),
    ('ram_gb = 64\n[gpu]\nmodel = "2080ti"\n', "unknown field 'gpu' (did you mean [[gpus]]?)"),
    ('[[gpus]]\nmodel = "2080ti"\n[psus]\nwatts = 1000\n', "unknown field 'psus' (did you mean [psu]?)"),
    ('ram_gb = 64\n', "no GPUs: give --gpu NAME"),
])
def test_a_misplaced_field_is_named_not_taken_for_no_gpus(tmp_path, text, expected):
    build = tmp_path / "build.toml"
    build.write_text(text)
    code, out, err = run_cli(["plan", "--build", build])
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, err


def test_the_sections_plan_names_are_those_a_build_file_has():
    from gpurig.hardware.plan import BUILD_SECTIONS
    from gpurig.spec import build

    assert set(BUILD_SECTIONS) == set(build._TOP)


def test_list_gpus():
    done = gpurig_cli("plan", "--list-gpus", "--json", timeout=60)
    assert {g["name"] for g in json.loads(done.stdout)} == {g.name for g in catalog.gpus()}


def test_plan_reads_a_description():
    v = verdicts(plan(inputs(description="2 nodes x 4 RTX 2080 Ti, PCIe 3.0 x8, 10GbE")))
    assert v["network"]["verdict"] == "warning" and v["PCIe lanes"]["number"].startswith("8/8/8/8")


def test_the_network_example_of_plans_own_help_is_read():
    # `--network "40 Gbit/s InfiniBand"` is what `gpurig plan --help` shows; a rate and a kind, as predict reads them
    from gpurig.spec.cluster import network_from

    assert network_from("40 Gbit/s InfiniBand", "--network").gbit_per_s == 40.0
    code, out, err = run_cli(["plan", "--gpu", "4x2080ti", "--nodes", 2, "--network", "40 Gbit/s InfiniBand", "--json"])
    assert code in (0, 1), err
    network = next(v for v in json.loads(out)["verdicts"] if v["rule"] == "network")
    assert network["verdict"] == "ok" and "40" in network["number"]


@pytest.mark.parametrize("args,expected", [
    (["--gpu", "4x3090", "--network", "10GbE"],
     "flags: [cluster] network: one machine has no network between its GPUs: give the machines it joins "
     "([cluster] nodes = 2, --nodes 2), or leave it out"),
    (["--gpu", "4x3090", "--lanes", "16,16,16,16,16,16"],
     "flags: [board] lanes: 6 widths for 4 GPUs: give one per GPU, e.g. [16, 8, 8, 8]"),
    (["--gpu", "4x3090", "--lanes", "16,8"], "flags: [board] lanes: 2 widths for 4 GPUs: give one per GPU, "
                                              "e.g. [16, 8, 8, 8]"),
])
def test_a_part_the_build_cannot_use_is_one_line_not_ignored(args, expected):
    """A network card on one machine joins nothing, and lane widths must be one per GPU: both were taken and then
    ignored (or cut to the GPUs)."""
    code, out, err = run_cli(["plan", *args])
    assert code == 2 and out == "" and err.strip() == f"gpurig: error: {expected}", err


CUSTOM_GPU = """network = "100 Gbit/s InfiniBand"
[[nodes]]
count = 2
gpus = 4
[nodes.gpu]
name = "MyGPU"
vendor = "NVIDIA"
architecture = "Ampere"
year = 2022
segment = "datacenter"
form_factor = "pcie"
memory_gb = 24
memory_bandwidth_gbs = 900
fp32_tflops = 30
tdp_w = 300
pcie_gen = "4.0"
pcie_lanes = 16
source = "my vendor's sheet"
"""


@pytest.mark.parametrize("verb", ["plan", "choose"])
def test_a_spec_describing_its_own_gpu_is_planned_and_chosen_as_predict_prices_it(verb, tmp_path):
    """A ``[nodes.gpu]`` table for a GPU the catalog lacks: predict took it; plan and choose refused it as an
    unknown catalog name."""
    spec = tmp_path / "mine.toml"
    spec.write_text(CUSTOM_GPU)
    args = ["plan", "--spec", spec, "--json"] if verb == "plan" else \
        ["choose", "--model", "mnist-mlp", "--cluster", spec, "--json"]
    code, out, err = run_cli(args)
    assert code == 0, err
    report = json.loads(out)
    if verb == "plan":
        assert "PSU watts" in {v["rule"] for v in report["verdicts"]}
    else:
        assert report["rows"][0]["gpus"] == 8


def test_a_spec_with_a_node_without_gpus_plans_its_gpu_machines(tmp_path):
    """A head node first (``gpus = 0``), as predict takes it: plan said "no GPUs: give --gpu NAME", a flag that
    was not the problem."""
    spec = tmp_path / "headnode.toml"
    spec.write_text('[[nodes]]\ngpus = 0\n\n[[nodes]]\ngpu = "RTX 3090"\ngpus = 4\ncount = 2\n\n[network]\nname = "EDR"\n')
    code, out, err = run_cli(["plan", "--spec", spec, "--json"])
    assert code == 0, err
    report = json.loads(out)
    assert report["nodes"] == 2 and report["gpus"] == [{"model": "GeForce RTX 3090", "count": 4, "cooler": "open"}]


def test_a_link_runs_at_the_older_of_the_slot_and_the_card():
    """A PCIe 3.0 card in a PCIe 5.0 board was priced at 5.0; a GPU a spec describes without a generation was a
    traceback."""
    code, out, err = run_cli(["plan", "--gpu", "4x2080ti", "--cpu-lanes", "40", "--pcie-gen", "5.0", "--json"])
    verdicts = {v["rule"]: v for v in json.loads(out)["verdicts"]}
    assert code == 0 and "PCIe 3.0" in verdicts["PCIe generation"]["number"], verdicts["PCIe generation"]
    code, out, err = run_cli(["plan", "--gpu", "2x4090", "--psu-eps", "2", "--json"])   # the flag exists
    assert code == 0, err


def test_more_gpus_than_any_machine_holds_is_a_problem():
    """'1000x 4090' on one board: plan said "PSU ≥ 495200 W", "network: one machine" and nothing more."""
    code, out, err = run_cli(["plan", "--gpu", "1000x 4090", "--json"])
    assert code == 0, err
    verdicts = {v["rule"]: v for v in json.loads(out)["verdicts"]}
    assert verdicts["board slots"]["verdict"] == "problem" and "no machine holds 1000 GPUs" in verdicts["board slots"]["reason"]
