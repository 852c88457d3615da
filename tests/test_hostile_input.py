"""Hostile input: bad flags for every verb and arbitrary build/spec files never give a traceback (property-tested);
ranks listen on loopback or the interface named, nowhere else.

Every verb runs in this process (``gpurig.cli.main(argv)``). For the verbs that
start jobs or probe the machine (train, run, emulate, bench, doctor) each
generated command line holds at least one bad value among good ones, so the
answer must be exit code 2 with one line naming the problem, before anything
starts. ``plan`` and files given to it may be fine or not: either exit 0, or
exit 2 with one line.
"""

import json
import os
import sys
import tempfile

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import gpurig as gpurig_cli
from conftest import run_cli

EXAMPLES = settings(max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "40")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
NONE_DIR = os.path.join(tempfile.mkdtemp(prefix="gpurig-hostile-"), "none")  # never created: --resume finds nothing


def assert_one_line_usage_error(argv: list[str]) -> None:
    code, out, err = run_cli(argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (argv, code, out[-500:], err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("gpurig: error: "), (argv, err)
    assert "Traceback" not in err + out, (argv, err)


def commands(verb: str, good: dict, bad: dict, tail: list[str] = ()):
    """Command lines of ``verb``: some good flags, at least one bad one, in any order.

    A flag given a bad value is not also given a good one (the last would win).
    """
    def flag_value(table):
        return st.sampled_from(sorted(table)).flatmap(
            lambda flag: st.sampled_from(table[flag]).map(lambda value: [flag] if value is None else [flag, value]))

    def without_bad_flags(pieces):
        goods, bads = pieces
        flags = {group[0] for group in bads}
        return [group for group in goods if group[0] not in flags] + bads

    pieces = st.tuples(st.lists(flag_value(good), max_size=4), st.lists(flag_value(bad), min_size=1, max_size=2))
    return pieces.map(without_bad_flags).flatmap(st.permutations).map(
        lambda groups: [verb, *[word for group in groups for word in group], *tail])


UNKNOWN = {"--no-such-flag": [None, "1"], "--Epochs": ["3"]}

TRAIN_GOOD = {"--epochs": ["1", "3"], "--model": ["mlp", "cnn"], "--engine": ["mpi", "torch"],
              "--compression": ["none", "int8", "auto", "powersgd:2"], "--lr": ["0.1"], "-n": ["2"],
              "--global-batch": ["64", "128"], "--on-nonfinite": ["skip", "stop"], "--keep-checkpoints": ["2"],
              "--failure-timeout": ["5", "0"], "--stall-timeout": ["30"], "--momentum": ["0", "0.5"],
              "--bucket-mb": ["1", "0.5"], "--json": [None], "--max-restarts": ["0", "2"],
              "--checkpoint-every": ["5"]}
TRAIN_BAD = {"-n": ["0", "-2", "two", "1.5", "", "100000000"], "--epochs": ["0", "-1", "x", ""],
             "--global-batch": ["0", "-5", "x"], "--lr": ["0", "-0.1", "nan", "inf", "x"],
             "--momentum": ["1", "1.5", "-0.1", "nan", "x"], "--model": ["resnet", "", "MLP"], "--data": ["imagenet"],
             "--engine": ["nccl", "MPI", ""], "--compression": ["int4", "powersgd:0", "powersgd:x", ""],
             "--bucket-mb": ["0", "-1", "nan", "inf", "x"], "--keep-checkpoints": ["0", "-1", "x"],
             "--on-nonfinite": ["retry", ""], "--failure-timeout": ["-1", "nan", "inf", "x", "1e9"],
             "--stall-timeout": ["-1", "nan", "x"], "--iface": ["no-such-iface0", ""], "--hosts": ["a:0", "a:x", ",", "a b"],
             "--seed": ["x", "1.5"], "--resume": [None], "--max-restarts": ["-1", "x"],
             "--checkpoint-every": ["0", "-3", "x", "100000"], "--logdir": ["/dev/null/tb"],
             "--timeline": ["/dev/null/trace.json", "", os.path.join(NONE_DIR, "no", "trace.json")], **UNKNOWN}


@EXAMPLES
@given(commands("train", TRAIN_GOOD, TRAIN_BAD, ["--checkpoint-dir", NONE_DIR]))
def test_train_refuses_bad_flags_in_one_line(argv):
    assert_one_line_usage_error(argv)


RUN_GOOD = {"-n": ["2"], "--engine": ["mpi", "torch"], "--failure-timeout": ["3"], "--stall-timeout": ["0"],
            "--iface": ["lo"], "--max-restarts": ["0", "2"], "--tag-output": [None], "--master-port": ["29555"]}
RUN_BAD = {"-n": ["0", "-1", "x", "", "100000000"], "--hosts": ["a:0", "a:x", ",", "a;b"], "--engine": ["nccl", ""],
           "--mpi-args": ["--mca 'x", '"'], "--iface": ["no-such-iface0", ""], "--failure-timeout": ["-3", "nan", "x"],
           "--stall-timeout": ["inf", "-1"], "--max-restarts": ["-1", "x", "1.5"], "--nproc-per-node": ["0", "-2", "x"],
           "--nnodes": ["0", "-1", "x"], "--node-rank": ["-1", "x"], "--master-port": ["0", "70000", "x"],
           "--hostfile": [os.path.join(NONE_DIR, "hosts")], "--log-dir": ["/dev/null/logs"], **UNKNOWN}


@EXAMPLES
@given(commands("run", RUN_GOOD, RUN_BAD, ["--", "true"]))
def test_run_refuses_bad_flags_in_one_line(argv):
    assert_one_line_usage_error(argv)


@EXAMPLES
@given(commands("run", RUN_GOOD, {"--engine": ["mpi"]}))
def test_run_without_a_command_is_one_line(argv):
    assert_one_line_usage_error(argv)


BAD_CLUSTERS = ["0 nodes x 4 A100", "-1 nodes x 4 A100", "2 nodes x 0 A100", "1 node x 1000000 A100", "99999 A100",
                "2 nodes x 4 A100, -10GbE", "4 A100, 0 Gbit/s InfiniBand", "4 A100, PCIe 3.0 x0", "4 A100, PCIe 3.0 x1000",
                "4 A100, 0 GB RAM", "4 A100, 99999999 GB RAM", "4 A100, 10GbE, EDR", "4 A100, 2 V100", "", ","]


@pytest.mark.parametrize("description", BAD_CLUSTERS)
def test_bad_cluster_descriptions_are_one_line(description):
    """Zero, negative or absurd counts, rates and sizes, or a part named twice (the second would silently win)."""
    assert_one_line_usage_error(["predict", "--model", "resnet50", "--cluster", description])


EMULATE_GOOD = {"--nodes": ["2", "3"], "--rate": ["1gbit", "100mbit"], "--engine": ["mpi", "torch"],
                "--ranks-per-node": ["1", "2"], "--max-restarts": ["0"]}
EMULATE_BAD = {"--nodes": ["1", "0", "-1", "x", "100000"], "--rate": ["fast", "1 gbps", "", "-1gbit"],
               "--ranks-per-node": ["0", "-1", "x", "100000"], "--engine": ["nccl", ""],
               "--max-restarts": ["-1", "x"], **UNKNOWN}


@EXAMPLES
@given(commands("emulate", EMULATE_GOOD, EMULATE_BAD, ["--", "true"]))
def test_emulate_refuses_bad_flags_in_one_line(argv):
    assert_one_line_usage_error(argv)


BENCH_GOOD = {"--quick": [None], "--engine": ["mpi", "torch", "mpi,torch"], "--parts": ["comm", "gemm,disk"],
              "--min-kb": ["1"], "--max-mb": ["1"], "--json": [None]}
BENCH_BAD = {"-n": ["0", "-1", "x", "100000000"], "--engine": ["nccl", "mpi,,x"], "--parts": ["network", "comm,x"],
             "--min-kb": ["0", "-1", "nan", "inf", "x"], "--max-mb": ["0", "nan", "inf", "1e300", "x"],
             "--mpi-args": ["--mca 'x"], "--plot": ["/dev/null/plots"], **UNKNOWN}


@EXAMPLES
@given(commands("bench", BENCH_GOOD, BENCH_BAD, ["--out", os.path.join(tempfile.mkdtemp(), "profile.json")]))
def test_bench_refuses_bad_flags_in_one_line(argv):
    assert_one_line_usage_error(argv)


DOCTOR_GOOD = {"--json": [None], "--use-case": ["kaggle"], "--preprocessing": ["before"]}
DOCTOR_BAD = {"--use-case": ["gaming", ""], "--preprocessing": ["sometimes"],
              "--write-spec": [os.path.join(NONE_DIR, "no", "such", "spec.toml"), ""], **UNKNOWN}


@EXAMPLES
@given(commands("doctor", DOCTOR_GOOD, DOCTOR_BAD))
def test_doctor_refuses_bad_flags_in_one_line(argv):
    assert_one_line_usage_error(argv)


def assert_fine_or_one_line(argv: list[str]) -> None:
    code, out, err = run_cli(argv)
    assert "Traceback" not in err + out, (argv, err)
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("gpurig: error: "), (argv, err)


NUMBERS = st.sampled_from(["0", "-1", "1", "4", "2.5", "1e9", "nan", "inf", "-inf", "x", ""])
PLAN_FLAGS = ["--gpu", "--count", "--cooler", "--cpu-cores", "--cpu-threads", "--cpu-ghz", "--cpu-tdp", "--cpu-lanes",
              "--ram-gb", "--psu-watts", "--psu-efficiency", "--psu-6pin", "--psu-8pin", "--psu-16pin", "--slots",
              "--slot-pitch", "--lanes", "--pcie-gen", "--ssd-gb", "--hdd-gb", "--preprocessing", "--use-case",
              "--hours", "--price-per-kwh", "--draw-watts", "--nodes", "--network", "--describe"]
PLAN_TEXT = st.sampled_from(["2080ti", "4x2080ti", "0xA100", "99999x3090", "RTX 9999", "16,8,8,8", "x,y", "3.0",
                             "9.9", "10GbE", "EDR", "2 nodes x 4 RTX 2080 Ti, 10GbE", "blower", "during", "kaggle"])


@EXAMPLES
@given(st.lists(st.tuples(st.sampled_from(PLAN_FLAGS), st.one_of(NUMBERS, PLAN_TEXT)), min_size=1, max_size=6))
def test_plan_flags_are_fine_or_one_line(pairs):
    assert_fine_or_one_line(["plan", "--json", *[word for pair in pairs for word in pair]])


KEYS = ["gpus", "cpu", "psu", "board", "storage", "usage", "cluster", "ram_gb", "model", "count", "cooler", "cores",
        "threads", "ghz", "tdp_w", "pcie_lanes", "watts", "efficiency", "pcie_6pin", "pcie_8pin", "gpu_slots",
        "slot_pitch", "pcie_gen", "lanes", "ssd_gb", "hdd_gb", "preprocessing", "use_case", "fp16", "hours",
        "price_per_kwh", "currency", "nodes", "network", "name", "gpu", "disks", "nics", "kind", "size_gb",
        "gbit_per_s", "memory_gb", "gpudirect_rdma", "unknown"]
SCALARS = st.one_of(st.integers(-10, 10), st.integers(), st.floats(allow_nan=False), st.sampled_from([1e308, -0.0]),
                    st.booleans(), st.text(max_size=12), st.sampled_from(["RTX 2080 Ti", "A100", "3.0", "10GbE", "ssd"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)), max_leaves=12)
DOCUMENTS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6)


def _toml(document: dict) -> str | None:
    try:
        return tomli_w.dumps(document)
    except (TypeError, ValueError):  # what TOML cannot say (a list of mixed tables and values)
        return None


FILES = st.one_of(DOCUMENTS.map(_toml).filter(lambda text: text is not None),
                  st.text(max_size=200), st.binary(max_size=200))


@EXAMPLES
@given(FILES, st.sampled_from(["--build", "--spec"]))
def test_build_and_spec_files_are_fine_or_one_line(content, flag):
    with tempfile.NamedTemporaryFile("wb", suffix=".toml", delete=False) as f:
        f.write(content.encode() if isinstance(content, str) else content)
    try:
        assert_fine_or_one_line(["plan", "--json", flag, f.name])
    finally:
        os.unlink(f.name)


def test_a_missing_or_unreadable_file_is_one_line(tmp_path):
    assert_one_line_usage_error(["plan", "--build", str(tmp_path / "missing.toml")])
    assert_one_line_usage_error(["plan", "--spec", str(tmp_path)])  # a directory


LISTENING = """
import json, os, gpurig, psutil, torch
comm = gpurig.init()
comm.allreduce(torch.ones(4), name="x")  # the engine's connections are up
mine = sorted({c.laddr.ip for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN})
os.write(1, (json.dumps(mine) + "\\n").encode())
comm.barrier()
"""


@pytest.mark.parametrize("engine,iface", [("mpi", None), ("torch", None), ("torch", "lo")])
def test_ranks_listen_only_on_loopback_or_the_named_interface(engine, iface):
    """No rank socket on every interface: the rendezvous and side channel bound to one address, Gloo on lo, Open
    MPI through shared memory (its runtime daemon, prterun, is not a rank and listens everywhere regardless)."""
    done = gpurig_cli("run", "-n", 2, "--engine", engine, *(["--iface", iface] if iface else []), "--",
                      sys.executable, "-c", LISTENING, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    addresses = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(addresses) == 2 and {a for rank in addresses for a in rank} == {"127.0.0.1"}, addresses


# Found by going through every verb's flags (issue 29): a traceback, a flag taken and then ignored, an absurd count.
SWEEP = [
    (["train", "--checkpoint-dir", "/dev/null/runs"], "--checkpoint-dir /dev/null/runs: /dev/null is not a directory"),
    # root's access() says yes to /proc and /sys; making the directory says no (a QA sweep, session 54)
    (["train", "--checkpoint-dir", "/proc/gpurig-runs"], "--checkpoint-dir /proc/gpurig-runs: cannot make the directory"),
    (["train", "--logdir", "/proc/gpurig-tb"], "--logdir /proc/gpurig-tb: cannot make the directory"),
    (["train", "--epochs", "1", "--bogus"], "unrecognized arguments: --bogus (see gpurig train --help)"),
    (["train", "-n", "2", "--parallel", "model", "--bucket-mb", "4"], "--bucket-mb: gradients travel in buckets"),
    (["predict", "--model", "mnist-mlp", "--cluster", "1 GTX 980", "--compression", "int8"], "on 1 GPU none are"),
    (["predict", "--model", "mnist-mlp", "--cluster", "2 GTX 980", "--parallel", "model", "--compression", "int8"],
     "with --parallel model none are"),
    (["predict", "--model", "mnist-mlp", "--cluster", "2 GTX 980", "--gpus", "5"], "the cluster has 2 GPUs"),
    (["predict", "--model", "mnist-mlp", "--cluster", "2 GTX 980", "--engine", "torch"], "is no profile"),
    (["predict", "--model", "mnist-mlp", "--cluster", "2 GTX 980", "--algorithm", "x"], "--algorithm must be one of"),
    (["predict", "--model", "mnist-mlp", "--cluster", "2 GTX 980", "--plot", "/dev/null/x.png"],
     "--plot /dev/null/x.png: the directory /dev/null does not exist"),
    (["predict", "--model", "mnist-mlp", "--cluster", "2 GTX 980", "--timeline", "/dev/null/t.json"],
     "--timeline /dev/null/t.json: the directory /dev/null does not exist"),
    (["plan", "--gpu", "2080ti", "-c", "0"], "count: 0 GPUs is outside 1–1024 GPUs"),
    (["run", "-n", "2", "--master-addr", "", "--", "true"], "--master-addr '': give a value or leave the flag out"),
    (["run", "-n", "2", "--log-dir", "", "--", "true"], "--log-dir '': give a value or leave the flag out"),
    (["emulate", "--max-restarts", "-1", "--", "true"], "--max-restarts must be 0 or more, got -1"),
    (["bench", "--out", "/dev/null/profile.json"], "--out /dev/null/profile.json: /dev/null is not a directory"),
    # a batch past a 64-bit integer crashed torch's meta tensors; a second part that is no GPU was "the GPUs twice"
    (["predict", "--model", "resnet50", "--cluster", "1 x H100", "--batch", "99999999999999999999"],
     "--batch must be at most 1,000,000,000 per GPU"),
    (["choose", "--model", "resnet50", "--batch", "99999999999999999999"], "--batch must be at most"),
    (["predict", "--model", "resnet50", "--cluster", "2 nodes x 4 A100, fast wires"], "cannot read 'fast wires'"),
    # --plot checked before the prediction, the same for every verb that draws one (matplotlib's error came after)
    (["predict", "--model", "mnist-mlp", "--cluster", "2 GTX 980", "--plot", "p.txt"], "matplotlib cannot write .txt"),
    (["choose", "--model", "mnist-mlp", "--plot", "c.txt"], "--plot c.txt: matplotlib cannot write .txt"),
    (["choose", "--model", "mnist-mlp", "--plot", "no/c.png"], "--plot no/c.png: the directory no does not exist"),
    (["choose", "--model", "mnist-mlp", "--plot", "."], "--plot .: is a directory"),
    (["choose", "--model", "mnist-mlp", "--plot", "c"], "--plot c: no ending to name the format"),
    (["bench", "--parts", "disk", "--dir", "nodir"], "--dir nodir: no such directory"),
    # session 49's sweep: an empty profile written over the saved one, a traceback from tc, hosts taken as "here"
    (["bench", "--parts", ""], "--parts names no part"),
    (["bench", "--parts", "comm", "--engine", ""], "--engine names no engine to measure communication over"),
    (["bench", "--parts", "comm", "--repeat", "2"], "--repeat takes the compute and gemm parts again"),
    (["bench", "--parts", "gemm", "--quick", "--plot", "/proc/x"], "--plot /proc/x: cannot make the directory"),
    (["emulate", "--rate", "0bit", "--", "true"], "--rate '0bit': want at least 1kbit"),
    (["run", "--hosts", "", "--", "true"], "--hosts '': want HOST:SLOTS,... (leave it out to run here)"),
    (["train", "--hosts", ""], "--hosts '': want HOST:SLOTS,... (leave it out to run here)"),
    # the same sweep on predict and choose: numbers for hardware not asked about, flags taken and ignored
    (["predict", "--model", "resnet50", "--cluster", "2 nodes x 4 RTX 3090"],
     "--cluster: 2 machines and no network between them: name it"),
    (["predict", "--model", "torch.nn:ReLU", "--sample", "784", "--cluster", "2 x RTX 3090"],
     "--model torch.nn:ReLU has no weights to train"),
    (["predict", "--model", "resnet50", "--cluster", "1 x H100", "--software", "pytorch-1.4", "--precision", "fp8"],
     "--precision fp8 needs a later PyTorch than --software pytorch-1.4, which runs fp32, fp16"),
    (["predict", "--model", "resnet50", "--cluster", "1 x H100", "--shard", "optimizer"],
     "on 1 GPU there is nothing to split it over"),
    (["predict", "--model", "resnet50", "--cluster", "1 x H100", "--algorithm", "ring"], "on 1 GPU there is none"),
    (["predict", "--model", "resnet50", "--cluster", "2 x H100", "--compression", "powersgd:"],
     "the PowerSGD rank after ':' must be a positive integer"),
    (["predict", "--model", "alexnet", "--cluster", "2 nodes x 4 RTX 4090, 10GbE", "--parallel", "hybrid",
      "--algorithm", "ring"], "--algorithm ring prices data parallelism's allreduce"),
    (["predict", "--model", "alexnet", "--cluster", "4 x RTX 4090", "--engine", "mpi"], "is no profile: leave --engine"),
    (["predict", "--model", "alexnet", "--cluster", "4 x RTX 4090", "--network-efficiency", "0.1"],
     "4 GPU(s) on one machine use none"),
    (["predict", "--model", "alexnet", "--cluster", "1 x RTX 4090", "--parallel", "model"],
     "on 1 GPU there is nothing to split them over"),
    (["predict", "--model", "torch.nn:Linear", "--sample", "8", "--tokens", "99", "--cluster", "1 x T4"],
     "--tokens sizes the built-in transformers' sequences"),
    (["predict", "--model", "mnist-mlp", "--cluster", "2 x T4", "--timeline", "/dev/full"],
     "/dev/full is not a regular file"),
    (["choose", "--model", "resnet50", "--cluster", "4 x RTX 3090", "--gpus", "8"],
     "--gpus counts the candidate GPUs, and --cluster gives whole clusters"),
    (["choose", "--model", "resnet50", "--candidates", "RTX 4090", "--price", "RTX 4090=1/h"],
     "a rate per GPU-hour is what renting costs: add --cloud"),
    (["choose", "--model", "resnet50", "--gpus", "64"], "--gpus must be 1 to 8: a candidate is one machine"),
    # the sweep of session 51: rates as people type them, names that start with a number, writes that cannot land
    (["predict", "--model", "mnist-mlp", "--cluster", "2 nodes x 4 RTX 3090, 10 GBPS"], "could be bits or bytes"),
    (["predict", "--model", "mnist-mlp", "--cluster", "2 nodes x 4 RTX 3090, 1.2.3 Gbit/s"], "expected a rate"),
    (["predict", "--model", "mnist-mlp", "--cluster", "7900 xt"], "unknown GPU '7900 xt'; closest: Radeon RX 7900 XTX"),
    (["plan", "--gpu", "6900 xtx"], "unknown GPU '6900 xtx'; closest: Radeon RX 6900 XT"),
    (["plan", "--gpu", "v100s"], "closest: Tesla V100"),
    (["bench", "-n", "1", "--parts", "gemm", "--quick", "--out", "/proc/gpurig-profile.json"], "cannot write it"),
    (["bench", "-n", "100000", "--quick"], "bench measures this one machine"),
    (["predict", "--model", "mnist-mlp", "--cluster", "1 x A100", "--memory-format", "channels-last"],
     "lays out 2-D convolutions' activations, and mnist-mlp has none"),
]


@pytest.mark.parametrize("argv,message", SWEEP, ids=[" ".join(a[:1] + a[-2:]) for a, _ in SWEEP])
def test_flags_found_by_the_sweep_are_one_line(argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written by mistake would land here
    code, out, err = run_cli(argv)
    assert code == 2 and err.strip().startswith("gpurig: error: ") and message in err, (code, err[-1000:])
    assert "Traceback" not in out + err and list(tmp_path.iterdir()) == []


def test_a_gpu_the_catalog_lacks_needs_its_peaks_in_one_line(tmp_path):
    """`doctor --write-spec` describes a GPU the catalog lacks by its name and memory: predict and choose said
    TypeError; now they name the numbers to add, and take the table once they are there."""
    spec = tmp_path / "h20.toml"
    spec.write_text('[[nodes]]\ngpus = 1\n[nodes.gpu]\nname = "NVIDIA H20"\nmemory_gb = 96.0\nvendor = "NVIDIA"\n'
                    'source = "NVML (not in the catalog)"\n')
    for verb in ("predict", "choose"):
        assert_one_line_usage_error([verb, "--model", "mnist-mlp", "--cluster", str(spec)])
    with open(spec, "a") as out:
        out.write("fp32_tflops = 44.0\nmemory_bandwidth_gbs = 4000\n")
    code, out, err = run_cli(["predict", "--model", "mnist-mlp", "--cluster", str(spec), "--json"])
    assert code == 0 and json.loads(out)["samples_per_s"] > 0, err


@pytest.mark.parametrize("path,value,why", [
    (("comm", "ranks"), 0, "must be above 0"), (("comm", "ranks"), "2", "a number belongs here"),
    (("disk", "mb_per_s"), float("nan"), "not a finite number"), (("disk", "mb_per_s"), -3, "must be above 0"),
    (("compute", "1", "memory_bytes_per_s"), 0, "must be above 0"), (("compute", "1", "gemm"), [], "GEMM timings"),
    (("compute",), "fast", "a table of measurements"), (("device",), 123, "the name of what bench ran on"),
    (("comm", "engines", "mpi", "allreduce", "beta_s_per_byte"), 0, "must be above 0"),
    (("comm", "engines", "mpi", "allreduce", "alpha_s"), -1.0, "cannot be below 0")])
def test_a_damaged_profile_is_one_line(path, value, why, tmp_path):
    """A hand-edited profile gave ZeroDivisionError, TypeError or a prediction from NaN (and JSON with NaN in it)."""
    from gpurig.measure.profile import SCHEMA

    profile = {"schema": SCHEMA, "device": "cpu",
               "comm": {"ranks": 2, "engines": {"mpi": {"allreduce": {"alpha_s": 1e-5, "beta_s_per_byte": 1e-9}}}},
               "compute": {"1": {"ranks": 1, "threads_per_rank": 1, "memory_bytes_per_s": 1e10, "layer_overhead_s": 1e-5,
                                 "gemm": [{"m": 64, "n": 64, "k": 64, "seconds": 1e-5, "gflops": 50.0}]}},
               "disk": {"mb_per_s": 900.0}}
    where = profile
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    damaged = tmp_path / "profile.json"
    damaged.write_text(json.dumps(profile))
    code, out, err = run_cli(["predict", "--model", "mnist-mlp", "--cluster", str(damaged)])
    assert code == 2 and err.count("\n") == 1 and why in err and ".".join(path) in err, err


@pytest.mark.parametrize("variable,value,message", [
    ("GPURIG_FAILURE_TIMEOUT", "abc", "GPURIG_FAILURE_TIMEOUT must be a number of seconds"),
    ("GPURIG_STALL_TIMEOUT", "-1", "GPURIG_STALL_TIMEOUT must be a number of seconds"),
    ("GPURIG_CHECK", "maybe", "GPURIG_CHECK must be 0 or 1"),
    ("GPURIG_LOG_DIR", "/dev/null/x", "GPURIG_LOG_DIR /dev/null/x: cannot create it"),
])
def test_a_bad_setting_left_in_the_environment_is_one_line_from_the_launcher(variable, value, message, tmp_path,
                                                                             monkeypatch):
    # refused before any rank starts (each rank used to print its own traceback and the job exit 1)
    monkeypatch.setenv(variable, value)
    code, out, err = run_cli(["run", "-n", "2", "--", sys.executable, "-c", "print('ran')"])
    assert code == 2 and err.strip().startswith("gpurig: error: ") and message in err, (code, err[-1000:])
    assert "Traceback" not in out + err and "ran" not in out


def test_a_rank_number_that_is_not_one_is_refused_not_waited_on():
    import subprocess

    env = {**os.environ, "RANK": "abc", "WORLD_SIZE": "2"}
    done = subprocess.run([sys.executable, "-c", "import gpurig; gpurig.init(engine='torch')"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "RANK='abc' with WORLD_SIZE=2: a rank is a whole number from 0 to 1" in done.stderr
