"""The catalog validates, names are found loosely, and bad spec / build files are one line and exit 2."""

import re

import pytest

from conftest import gpurig as gpurig_cli
from gpurig.spec import SpecError, catalog, load_spec, parse_description, save_spec
from gpurig.spec.catalog import read_table
from gpurig.spec.cluster import parse_network
from gpurig.spec.hardware import CATALOG_REQUIRED, GPU


def test_every_catalog_row_is_complete_sourced_and_unique():
    gpus = catalog.gpus()
    assert len(gpus) >= 60
    names = [g.name for g in gpus]
    assert len(names) == len(set(names))
    for g in gpus:
        assert len(g.source) > 10, g.name
        assert all(getattr(g, f) is not None for f in CATALOG_REQUIRED), g.name
        assert g.memory_bandwidth_gbs > 10 * g.memory_gb ** 0.5   # bandwidth in GB/s, not Gbit/s or TB/s
        if g.tensor_tflops:
            assert g.tensor_tflops >= g.fp32_tflops, g.name
    for table in (catalog.networks(), catalog.pcie_generations(), catalog.gpu_links()):
        assert table and all(row.source for row in table)
    vendors = {g.vendor for g in gpus}
    architectures = {g.architecture for g in gpus}
    assert vendors == {"NVIDIA", "AMD"}
    assert {"Kepler", "Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada Lovelace", "Hopper", "Blackwell",
            "CDNA 3"} <= architectures


def test_every_name_and_alias_finds_its_own_row():
    for g in catalog.gpus():
        assert catalog.gpu(g.name) is g
        for alias in filter(None, (g.aliases or "").split(";")):
            assert catalog.gpu(alias) is g


@pytest.mark.parametrize("query,name", [
    ("2080ti", "GeForce RTX 2080 Ti"), ("RTX 2080 Ti", "GeForce RTX 2080 Ti"), ("rtx2080 ti", "GeForce RTX 2080 Ti"),
    ("NVIDIA GeForce RTX 2080 Ti", "GeForce RTX 2080 Ti"), ("Tesla V100-SXM2-16GB", "Tesla V100 SXM2 16 GB"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80 GB"), ("NVIDIA H100 80GB HBM3", "H100 SXM5 80 GB"),
    ("gtx titan", "GeForce GTX Titan"), ("Titan RTX", "Titan RTX"), ("mi300x", "Instinct MI300X"),
    # a Cyrillic А, Greek Η, full-width digits: pasted from a web page or typed on another keyboard
    ("4070 Ti Super", "GeForce RTX 4070 Ti SUPER"), ("4060 Ti 16GB", "GeForce RTX 4060 Ti 16 GB"), ("L40", "L40"),
    ("rtx 2080 super", "GeForce RTX 2080 SUPER"), ("RTX 2080", "GeForce RTX 2080"),   # cards people asked about
    ("\u0410100 80GB", "A100 SXM4 80 GB"), ("\u0397100 PCIe", "H100 PCIe"), ("RTX \uff14\uff10\uff19\uff10", "GeForce RTX 4090")])
def test_loose_lookup(query, name):
    assert catalog.gpu(query).name == name


def test_famous_cards_match_their_datasheets():
    # hand-checked against the vendor documents named in each row's source
    expected = {"GeForce GTX 580": (1.5, 244), "GeForce GTX 1080 Ti": (11, 250), "GeForce RTX 2080 Ti": (11, 250),
                "Titan RTX": (24, 280), "Tesla V100 SXM2 16 GB": (16, 300), "A100 SXM4 40 GB": (40, 400),
                "H100 SXM5 80 GB": (80, 700), "GeForce RTX 3090": (24, 350), "GeForce RTX 4090": (24, 450),
                "GeForce RTX 5090": (32, 575), "Instinct MI100": (32, 300), "Instinct MI300X": (192, 750)}
    for name, (memory, tdp) in expected.items():
        g = catalog.gpu(name)
        assert (g.memory_gb, g.tdp_w) == (memory, tdp), name
    assert catalog.gpu("2080ti").fp32_tflops == pytest.approx(4352 * 1.545 * 2 / 1000, rel=1e-3)


# SMs / CUs per die, at most: the largest die of each family (GK110 15 SMX, GM200 24, GP100 60, GV100 84,
# TU102 72, GA100 128, AD102 144, GH100 144, GB202 192; Navi 10 40, Navi 21 80, Navi 31 96, GCN 64,
# CDNA / CDNA 2 dies up to 128, CDNA 3 / 4 XCDs up to 40)
MAX_UNITS_PER_DIE = {"Fermi": 16, "Kepler": 15, "Maxwell": 24, "Pascal": 60, "Volta": 84, "Turing": 72, "Ampere": 128,
                     "Ada Lovelace": 144, "Hopper": 144, "Blackwell": 192, "GCN 2": 64, "GCN 3": 64, "GCN 4": 64,
                     "GCN 5": 64, "RDNA": 40, "RDNA 2": 80, "RDNA 3": 96, "CDNA": 128, "CDNA 2": 128, "CDNA 3": 40,
                     "CDNA 4": 40}
DIES = {"Tesla K80": 2, "B200": 2, "Instinct MI250": 2, "Instinct MI250X": 2, "Instinct MI300X": 8,
        "Instinct MI325X": 8, "Instinct MI355X": 8}
NO_VENDOR_SM_COUNT = {"H100 NVL", "H200 NVL", "B200"}   # no NVIDIA document gives it (data/README.md)


def test_compute_units_are_there_and_right():
    expected = {"GeForce GTX 580": 16, "GeForce GTX 1080 Ti": 28, "GeForce RTX 2080 Ti": 68,
                "Tesla V100 SXM2 16 GB": 80, "A100 SXM4 40 GB": 108, "H100 SXM5 80 GB": 132, "H100 PCIe": 114,
                "GeForce RTX 4090": 128, "Instinct MI250X": 220, "Instinct MI300X": 304}
    for name, units in expected.items():
        assert catalog.gpu(name).compute_units == units, name
    for g in catalog.gpus():
        if g.architecture == "Fermi" or g.name in NO_VENDOR_SM_COUNT:
            continue
        assert g.compute_units, g.name     # every NVIDIA and AMD row from Kepler on
    for g in catalog.gpus():
        if g.compute_units:
            dies = DIES.get(g.name, 1)
            assert g.compute_units % dies == 0, g.name
            assert g.compute_units // dies <= MAX_UNITS_PER_DIE[g.architecture], g.name
    with pytest.raises(SpecError, match="compute_units: expected a whole number"):
        read_table("x.csv", GPU, text_of="name,memory_gb,compute_units,source\nA,8,13.5,datasheet\n")


def test_unknown_gpu_is_one_line_with_closest_matches():
    with pytest.raises(SpecError) as error:
        catalog.gpu("RTX 2090")
    message = str(error.value)
    assert "\n" not in message and "closest:" in message and "RTX 2080" in message


def test_bad_catalog_rows_are_refused_naming_line_and_field():
    header = "name,memory_gb,source\n"
    with pytest.raises(SpecError, match=r"x.csv line 2 \(A\): memory_gb: -1.0 GB is outside"):
        read_table("x.csv", GPU, text_of=header + "A,-1,datasheet\n")
    with pytest.raises(SpecError, match="memory_gb: expected a number"):
        read_table("x.csv", GPU, text_of=header + "A,lots,datasheet\n")
    with pytest.raises(SpecError, match="source: missing"):
        read_table("x.csv", GPU, text_of=header + "A,8,\n")


def test_spec_round_trip(tmp_path):
    spec = parse_description("2 nodes × 4 RTX 2080 Ti, PCIe 3.0 x8, 40 Gbit/s InfiniBand, no GPUDirect")
    assert (spec.node_count, spec.total_gpus, spec.gpudirect_rdma) == (2, 8, False)
    assert spec.network.gbit_per_s == 40 and spec.network.kind == "infiniband"
    save_spec(spec, tmp_path / "c.toml")
    assert load_spec(tmp_path / "c.toml") == spec


@pytest.mark.parametrize("text,count,gpus", [("7900 XTX", 1, 1), ("2 nodes x 7900 XTX, 10GbE", 2, 1),
                                              ("4 x 7900 XTX", 1, 4), ("4x3090", 1, 4), ("4 RTX 3090", 1, 4)])
def test_a_gpu_whose_name_starts_with_a_number_is_not_read_as_a_count(text, count, gpus):
    node = parse_description(text).nodes[0]
    assert (node.count, node.gpus) == (count, gpus)
    assert node.gpu.name in ("Radeon RX 7900 XTX", "GeForce RTX 3090")


def test_the_start_of_several_gpu_names_is_ambiguous_not_unknown():
    """'a100 sxm' begins two catalog names: it was "unknown", with a P100 and an H200 as the closest."""
    with pytest.raises(SpecError, match=r"GPU 'a100 sxm' is ambiguous: A100 SXM4 40 GB, A100 SXM4 80 GB$"):
        catalog.gpu("a100 sxm")
    with pytest.raises(SpecError, match=r"unknown GPU 'V100S'"):   # a one-letter part begins nothing
        catalog.gpu("V100S")
    # a name two generations answer to: asked which, not the 2018 card a buyer today rarely means
    with pytest.raises(SpecError, match=r"GPU 'rtx 6000' is ambiguous: Quadro RTX 6000, RTX 6000 Ada$"):
        catalog.gpu("rtx 6000")
    assert catalog.gpu("Quadro RTX 6000").name == "Quadro RTX 6000" and catalog.gpu("RTX 6000 Ada").name == "RTX 6000 Ada"


def test_description_errors():
    with pytest.raises(SpecError, match="unknown GPU 'RTX 2090'"):
        parse_description("4 RTX 2090")
    with pytest.raises(SpecError, match="names no GPU"):
        parse_description("PCIe 3.0 x8")
    with pytest.raises(SpecError, match="cannot read 'fast wires'"):  # not "names the GPUs twice"
        parse_description("2 nodes x 4 A100, fast wires")
    with pytest.raises(SpecError, match="names the GPUs twice"):
        parse_description("2 nodes x 4 A100, 4 V100")
    with pytest.raises(SpecError, match="cannot read '10 GB Ethernet'"):  # bytes, not a link's bits
        parse_description("2 nodes x 4 A100, 10 GB Ethernet")
    for bare in ("IB", "InfiniBand", "Ethernet"):   # a network without its rate: which one?
        with pytest.raises(SpecError, match=f"in '{bare}': which {bare}\\? give its rate"):
            parse_description(f"2 nodes x 4 A100, {bare}")


@pytest.mark.parametrize("part, kind, gbit", [("100 Gbit InfiniBand", "infiniband", 100), ("100Gbit IB", "infiniband", 100),
                                              ("InfiniBand 200 Gbit/s", "infiniband", 200),
                                              ("10 Gb Ethernet", "ethernet", 10), ("Ethernet 25 Gbit", "ethernet", 25),
                                              ("1 Gbit", "other", 1), ("56Gbps InfiniBand", "infiniband", 56),
                                              ("25 Gbit/s RoCE", "roce", 25), ("100 Gbit RDMA over Ethernet", "roce", 100)])
def test_a_network_is_read_as_people_write_it(part, kind, gbit, tmp_path):
    spec = parse_description(f"3 nodes x 8 x H100, {part}")
    assert (spec.network.kind, spec.network.gbit_per_s) == (kind, gbit)
    save_spec(spec, tmp_path / "c.toml")
    assert load_spec(tmp_path / "c.toml") == spec


@pytest.mark.parametrize("part", ["NVLink", "NVLink 2.0", "nvlink bridge", "NVSwitch"])
def test_a_gpu_link_part_confirms_the_catalogs(part):
    """A user names the link the GPUs have; it is the catalog's NVLink the prediction then uses."""
    from gpurig.perf.machine import spec_topology
    with_part = spec_topology(parse_description(f"8 x V100 SXM2 16GB, {part}"))
    assert with_part.local == spec_topology(parse_description("8 x V100 SXM2 16GB")).local
    assert with_part.local.bytes_per_s > 100e9  # NVLink 2.0's 300 GB/s both ways, not PCIe's 16
    with pytest.raises(SpecError, match="lists no NVLink .* GTX 1080 Ti"):
        parse_description(f"4 x GTX 1080 Ti, {part}")


def test_a_system_named_as_a_gpu_gets_a_description_that_parses():
    from gpurig.spec.describe import SYSTEMS
    for example, _ in SYSTEMS.values():  # each suggestion is itself a valid description, with its GPUs' link
        assert parse_description(example).nodes[0].gpu.gpu_link_gbs
    with pytest.raises(SpecError, match=r"'DGX A100' is a system, not a GPU: describe its GPUs, e.g. '8 x A100"):
        parse_description("2 nodes x DGX A100, 200 Gbit/s InfiniBand")


BAD_FILES = {
    "not toml": ("[[gpus]\nmodel = ", "not valid TOML"),
    "wrong type": ('[[gpus]]\nmodel = "2080ti"\ncount = "four"\n', "count: expected a number"),
    "unknown gpu": ('[[gpus]]\nmodel = "RTX 2090"\n', "unknown GPU 'RTX 2090'"),
    "negative count": ('[[gpus]]\nmodel = "2080ti"\ncount = -2\n', "count: -2 GPUs is outside"),
    "typo": ('[[gpus]]\nmodel = "2080ti"\n[psu]\nwats = 1000\n', "unknown field 'wats' (did you mean 'watts'?)"),
    "negative watts": ('[[gpus]]\nmodel = "2080ti"\n[psu]\nwatts = -1\n', "watts: -1 W is outside"),
    "no gpus": ("ram_gb = 32\n", "no GPUs"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_malformed_build_files_are_one_line_and_exit_2(tmp_path, case):
    text, expected = BAD_FILES[case]
    path = tmp_path / "build.toml"
    path.write_text(text)
    done = gpurig_cli("plan", "--build", path, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert expected in lines[0] and str(path) in lines[0]


@pytest.mark.parametrize("text,expected", [
    ("[[nodes]]\ngpus = 2\n", "gpu: missing"),
    ('[[nodes]]\ngpus = 2\ngpu = "RTX 2090"\n', "unknown GPU"),
    ('[[nodes]]\ngpus = -1\ngpu = "2080ti"\n', "gpus: -1 GPUs is outside"),
    ('[network]\nname = "FDR"\n', "nodes: missing"),
    ('gpudirect_rdma = "yes"\n[[nodes]]\ngpus = 0\n', "gpudirect_rdma: expected true or false"),
    ('[[nodes]]\ngpus = 0\ngpu = "RTX 3090"\n', "with gpus = 0: give how many it has, or leave gpu out"),
])
def test_malformed_spec_files_are_one_line_and_exit_2(tmp_path, text, expected):
    path = tmp_path / "spec.toml"
    path.write_text(text)
    done = gpurig_cli("plan", "--spec", path, "--gpu", "2080ti", timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert expected in done.stderr and re.search(r"spec\.toml", done.stderr)


@pytest.mark.parametrize("text,gbit", [("10 gbps", 10), ("10 gbit/s", 10), ("10 gb/s", 10), ("100 mbps", 0.1),
                                       ("10 Gbit/S", 10), ("10 GBIT/S ETHERNET", 10), ("10. Gbit/s", 10),
                                       ("12.5 GBps InfiniBand", 100), ("12.5 GB/s", 100), ("1.25 GB/s", 10),
                                       ("100 MBps", 0.8), ("Ethernet 10 Gb", 10), ("25 Gbit RoCE", 25)])
def test_link_rates_as_people_write_them(text, gbit):
    """Lower case crashed with a traceback; "GBps" (bytes) was read as Gbit/s, 8x off."""
    assert parse_network(text).gbit_per_s == pytest.approx(gbit)


@pytest.mark.parametrize("text,message", [("10 GBPS", "could be bits or bytes"), ("1.2.3 Gbit/s", "expected a rate")])
def test_unreadable_link_rates_are_one_line(text, message):
    with pytest.raises(SpecError, match=message):
        parse_description(f"2 nodes x 4 RTX 3090, {text}")


@pytest.mark.parametrize("text,name", [("RTX 3090 24 GB", "GeForce RTX 3090"), ("3090 24GB", "GeForce RTX 3090"),
                                       ("Tesla P100-SXM2-16GB", "Tesla P100 SXM2"),
                                       ("Tesla V100-SXM2-32GB", "Tesla V100 SXM2 32 GB"),
                                       ("A100 40GB", "A100 SXM4 40 GB"), ("A100 PCIe 40GB", "A100 PCIe 40 GB")])
def test_a_gpu_named_with_its_memory(text, name):
    """As nvidia-smi and shops write them; "A100 40GB" is the "A100" (the alias) of 40 GB, as "A100 80GB" was."""
    assert catalog.gpu(text).name == name


def test_memory_a_gpu_does_not_have_and_near_names():
    with pytest.raises(SpecError, match=r"unknown GPU 'RTX 3090 12GB'; closest: GeForce RTX 3090"):
        catalog.gpu("RTX 3090 12GB")
    with pytest.raises(SpecError, match=r"unknown GPU 'H20'"):   # not the start of "H200": a number is whole
        catalog.gpu("H20")
    with pytest.raises(SpecError, match=r"unknown GPU 'v100s'; closest: Tesla V100"):
        catalog.gpu("v100s")


def test_a_spec_saved_with_a_byte_order_mark_is_read(tmp_path):
    """Windows editors save UTF-8 with a BOM: "Invalid statement (at line 1, column 1)" before."""
    spec = tmp_path / "bom.toml"
    spec.write_bytes(b'\xef\xbb\xbf[[nodes]]\ngpu = "RTX 3090"\ngpus = 2\n')
    assert load_spec(spec).total_gpus == 2


@pytest.mark.parametrize("value", ['"4"', "4", "4.0", '"4.0"'])
def test_a_pcie_generation_as_people_write_it(tmp_path, value):
    """pcie_gen = 4 or "4" was refused for want of "4.0", while a description took "PCIe 4 x16"."""
    spec = tmp_path / "gen.toml"
    spec.write_text(f'[[nodes]]\ngpu = "RTX 3090"\ngpus = 2\npcie_gen = {value}\n')
    assert load_spec(spec).nodes[0].pcie_gen == "4.0"
