"""gpurig predict: the source's worked examples from the model's general formulas, the model's behaviour, the CLI.

Every number of SEEDS.md's data-parallelism examples comes out of the same
functions the predictor uses for any cluster (perf.collectives, perf.transfer,
perf.step), never from a special case.
"""

import json

import pytest
import torch

from conftest import gpurig as gpurig_cli
from conftest import run_cli
from gpurig.perf import transfer
from gpurig.perf.collectives import Link, Topology, allreduce_seconds, naive_exchange_seconds, syncs_per_second
from gpurig.perf.compute import GemmModel
from gpurig.predict import PredictRequest, predict
from gpurig.units import BINARY, bytes_per_second

GRADIENT = 1000 * 1000 * 4  # the source's 1000 x 1000 fp32 weight matrix


def nic_40_gbit(base=BINARY):
    return Link(0.0, bytes_per_second(40, "Gbit/s", base))


def pcie_3x_faster():
    return Link(0.0, 3 * bytes_per_second(40, "Gbit/s", BINARY))


@pytest.mark.parametrize("nodes,shared,exact_ms,source_ms", [
    (2, False, 2.235, 2.25),   # 3 remote peers through the NIC; the 2 PCIe peers overlap
    (2, True, 6.706, 6.75),    # one GPU at a time on the NIC: x 3 (the post misprints 7.75)
    (4, True, 20.117, 20.25),  # 4 nodes x 3 GPUs: 9 remote peers x 3 GPUs per NIC
])
def test_the_sources_gradient_exchange_between_nodes(nodes, shared, exact_ms, source_ms):
    topology = Topology(nodes=nodes, gpus_per_node=3, local=pcie_3x_faster(), network=nic_40_gbit(), nic_shared=shared)
    assert naive_exchange_seconds(GRADIENT, topology) * 1000 == pytest.approx(exact_ms, abs=5e-4)
    # the post rounds each transfer to 0.75 ms before multiplying: the same formula with its rounded input
    rounded = Topology(nodes, 3, Link(0, GRADIENT / 0.25e-3), Link(0, GRADIENT / 0.75e-3), nic_shared=shared)
    assert naive_exchange_seconds(GRADIENT, rounded) * 1000 == pytest.approx(source_ms)
    assert allreduce_seconds(GRADIENT, topology, "naive") == naive_exchange_seconds(GRADIENT, topology)


def test_one_transfer_is_0745_ms_and_the_layers_compute_is_far_less():
    assert transfer.transfer_seconds(GRADIENT, nic_40_gbit().bytes_per_s) * 1000 == pytest.approx(0.745, abs=5e-4)
    # "0.2 ms for a matrix multiply through that layer (100x1000 dot 1000x1000)" on a GPU of the time:
    # 0.2 GFLOP; at 1 TFLOP/s, 0.2 ms; backward twice that: communication >> compute, the source's point
    gpu_2014 = GemmModel(0.0, 1e12, 200e9)
    forward = gpu_2014.seconds(100, 1000, 1000)
    assert forward * 1000 == pytest.approx(0.2, rel=0.01)
    assert naive_exchange_seconds(GRADIENT, Topology(2, 3, pcie_3x_faster(), nic_40_gbit())) > 10 * 3 * forward


def test_mnist_over_1_gbit_ethernet_is_28x_slower():
    per_gpu = transfer.shared_rate(bytes_per_second(1, "Gbit/s"), 4)   # "31 MB/s for each GPU"
    assert per_gpu / 1e6 == pytest.approx(31.25)
    syncs = syncs_per_second(1200 * 1200 * 4, per_gpu)                  # a 5.76 MB matrix (the post: "about 5 MB")
    assert syncs == pytest.approx(5.43, abs=0.01)                       # the post rounds to 6 per second
    assert 150 / syncs == pytest.approx(27.6, abs=0.1)                  # vs 150 batches/s: ~28x (the post: ~25x)


def test_16_gpus_on_4_pcie_lanes():
    # "16 GPUs means 15 data transfers; 4 PCIe lanes / 15 transfers = 0.2666 GB/s; 800x1200 floats = 0.0036 GB"
    matrix = 800 * 1200 * 4 / 2**30
    assert matrix == pytest.approx(0.0036, abs=1e-4)                    # the post writes 800x1200x1024^-3 but means x4
    assert syncs_per_second(matrix, 4.0, transfers=15) == pytest.approx(74, abs=1)
    # the same post's 4 GPUs on 16 lanes: 16/3 = 5.33 GB/s, 1491 syncs/s (the post's 647 is an arithmetic slip)
    assert syncs_per_second(matrix, 16.0, transfers=3) == pytest.approx(1491, abs=1)


def test_ring_beats_the_naive_exchange_as_the_cluster_grows():
    for nodes in (2, 4, 8, 16):
        topology = Topology(nodes, 4, pcie_3x_faster(), nic_40_gbit())
        assert allreduce_seconds(GRADIENT, topology, "ring") < naive_exchange_seconds(GRADIENT, topology)
    ring_8, ring_64 = (allreduce_seconds(GRADIENT, Topology(n, 1, Link(0, 1e10), Link(0, 1e9)), "ring")
                       for n in (8, 64))
    assert ring_64 < 1.15 * ring_8   # a ring's time barely grows with the ranks: 2(P-1)/P of the bytes


def test_compression_and_a_faster_network_help_where_the_network_is_the_bottleneck():
    slow = predict(PredictRequest(model="mnist-mlp", cluster="2 nodes x 1 RTX 2080 Ti, 1 Gbit/s Ethernet"))
    assert slow["bottleneck"] == "communication" and slow["scaling"][-1]["speedup"] < 1  # slower than one GPU
    gains = {a["what"]: a["samples_per_s_gain"] for a in slow["advice"]}
    assert gains["--compression int8"] > gains["--compression fp16"] > 1.5
    assert gains["a 10x faster network"] > 5
    fast = predict(PredictRequest(model="resnet50", cluster="1 node x 4 V100", batch=64))
    assert fast["bottleneck"] == "compute" and fast["scaling"][-1]["efficiency"] > 0.9


def test_roce_is_priced_as_rdma_not_tcp():
    """RDMA over Converged Ethernet moves gradients as InfiniBand does: a network-bound model scales better over
    25 Gbit/s RoCE than over 25 Gbit/s Ethernet used by TCP, and as well as over 25 Gbit/s InfiniBand."""
    def efficiency(network):
        result = predict(PredictRequest(model="vgg16", cluster=f"4 nodes x 4 P100 PCIe, {network}", batch=64))
        return result["scaling"][-1]["efficiency"]
    roce, tcp, infiniband = efficiency("25 Gbit/s RoCE"), efficiency("25 Gbit/s Ethernet"), efficiency("25 Gbit/s InfiniBand")
    assert roce > 1.2 * tcp and abs(roce - infiniband) < 0.02


def test_the_tile_rule_is_advised_and_predicted():
    result = predict(PredictRequest(model="resnet50", cluster="2 V100", batch=33))
    item = next(a for a in result["advice"] if a["what"].startswith("per-GPU batch"))
    assert item["what"] == "per-GPU batch 64" and item["samples_per_s_gain"] > 1


def test_cli_table_json_and_plot(tmp_path):
    done = gpurig_cli("predict", "--model", "mnist-mlp", "--cluster", "2 nodes x 4 GTX 980, 1 Gbit/s Ethernet",
                      "--plot", tmp_path / "s.png", timeout=120, env={"COLUMNS": "160"})
    assert done.returncode == 0, done.stderr
    assert "speed-up by GPU count" in done.stdout and "communication" in done.stdout
    assert "at the step's peak: " in done.stdout and " GiB" in done.stdout
    assert (tmp_path / "s.png").stat().st_size > 1000
    # the console command's table and plot above, in a fresh process; its JSON here, in this one
    code, out, err = run_cli(["predict", "--model", "alexnet", "--cluster", "4 RTX 2080 Ti", "--json"])
    assert code == 0, err
    result = json.loads(out)
    assert [r["gpus"] for r in result["scaling"]] == [1, 2, 4] and result["parameters"] == 61_100_840


def test_what_would_help_lists_only_what_is_predicted_faster(monkeypatch):
    """A change predicted slower (AlexNet's fully connected layers split over 4 GPUs: 0.3x) is shown apart,
    not as help; one predicted faster (Krizhevsky's hybrid) under "what would help"."""
    monkeypatch.setenv("COLUMNS", "160")
    code, out, err = run_cli(["predict", "--model", "alexnet", "--cluster", "4 RTX 2080 Ti"])
    assert code == 0, err
    helps, _, slower = out.partition("predicted not to help")
    helps = helps[helps.index("what would help"):]
    assert "--parallel hybrid" in helps and "--parallel model" not in helps
    assert "--parallel model" in slower and "--parallel hybrid" not in slower


def test_a_way_to_fit_memory_that_still_does_not_fit_is_not_listed_as_help(monkeypatch):
    """BERT-large with Adam on two 6 GB RTX 2060s: of the memory changes only --shard gradients fits; the ones
    that still do not fit go with what does not help (a QA sweep found mixed precision there, needing more)."""
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(["predict", "--model", "bert-large", "--cluster", "2 x RTX 2060", "--batch", "1",
                              "--tokens", "16", "--optimizer", "adam"])
    assert code == 0, err
    helps, _, slower = out.partition("predicted not to help (2 % or less, or it still does not fit)")
    helps = helps[helps.index("what would help"):]
    assert "--shard gradients" in helps and "--shard gradients" not in slower
    for change in ("--precision fp16", "--optimizer-impl fused", "--shard optimizer"):
        assert change in slower and change not in helps, change


def test_the_header_and_json_name_the_catalog_gpu_a_short_name_found(monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    code, out, err = run_cli(["predict", "--model", "mnist-mlp", "--cluster", "8 A100", "--precision", "FP16"])
    assert code == 0, err
    assert "on 8 GPUs in 1 node: 8 A100 = A100 SXM4 40 GB (catalog)" in " ".join(out.split()) and ", fp16," in out
    code, out, err = run_cli(["predict", "--model", "mnist-mlp", "--cluster", "8 A100", "--json"])
    assert code == 0 and json.loads(out)["gpu"] == "A100 SXM4 40 GB"


def test_a_network_named_for_one_machine_is_said_to_carry_nothing(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(["predict", "--model", "mnist-mlp", "--cluster", "4 RTX 3090, 10 GbE", "--json"])
    result = json.loads(out)
    assert code == 0 and result["nodes"] == 1 and "the 10 Gigabit Ethernet carries nothing" in result["hardware_note"]
    assert "'4 nodes x 1 GeForce RTX 3090, 10 Gigabit Ethernet'" in result["hardware_note"]
    code, out, err = run_cli(["predict", "--model", "mnist-mlp", "--cluster", "4 nodes x 1 GeForce RTX 3090, "
                              "10 Gigabit Ethernet", "--json"])   # what the note suggests reads as 4 machines
    assert code == 0 and json.loads(out)["nodes"] == 4 and json.loads(out)["hardware_note"] == ""


@pytest.mark.parametrize("args,message", [
    (["--model", "resnet51", "--cluster", "2 V100"], "closest: resnet50"),
    (["--model", "resnet50", "--cluster", "2 V101"], "unknown GPU"),
    (["--model", "resnet50", "--cluster", "2 V100", "--batch", "0"], "--batch"),
    (["--model", "resnet50", "--cluster", "2 V100", "--compression", "int4"], "unknown compression"),
    (["--model", "resnet50", "--cluster", "2 V100", "--parallel", "pipeline"], "--parallel"),
    (["--model", "resnet50"], "--cluster"),
    (["--model", "nosuchmodule:make", "--sample", "3x8x8", "--cluster", "2 V100"], "nosuchmodule"),
])
def test_bad_input_is_one_line(args, message):
    code, out, err = run_cli(["predict", *args])
    assert code == 2 and message in err and "Traceback" not in err + out
    assert len(err.strip().splitlines()) == 1


PARTIAL_PROFILES = {  # bench run with --parts that leave out what predict reads
    "comm,p2p": {"comm": {"ranks": 2, "engines": {"mpi": {"allreduce": {"rows": [], "busbw_gbs": 0.1,
                                                                         "alpha_s": 5e-5, "beta_s_per_byte": 8e-9}}}}},
    "disk": {"disk": {"mb_per_s": 900.0}},
}


@pytest.mark.parametrize("parts", PARTIAL_PROFILES)
@pytest.mark.parametrize("device", ["cpu", "NVIDIA A100-SXM4-40GB"])
def test_a_profile_without_the_compute_part_is_one_line(tmp_path, parts, device):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"schema": "gpurig-profile/1", "device": device, **PARTIAL_PROFILES[parts]}))
    flags = [["--cluster", profile], ["--profile", profile]]
    if device != "cpu":  # a GPU's profile calibrates a catalog cluster; a CPU's disk alone may go with one
        flags.append(["--cluster", "2 x A100", "--profile", profile])
    for more in flags:
        code, out, err = run_cli(["predict", "--model", "mnist-mlp", *more])
        assert code == 2 and "Traceback" not in err + out and len(err.strip().splitlines()) == 1, err
        assert "the profile has no compute measurements: run gpurig bench with the compute part" in err


def frozen_mlp():
    """An MLP whose first layer is frozen (fine-tuning a head): 203,530 parameters, 2,570 trainable."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    model[1].requires_grad_(False)
    return model


def test_frozen_parameters_are_weights_but_not_trainable():
    from gpurig.models.describe import ModelSpec, describe

    spec = describe(frozen_mlp(), (1, 28, 28), batch=64)
    assert (spec.parameters, spec.trainable_parameters) == (203_530, 2_570)
    assert spec.layer("1").trainable_shapes == () and spec.layer("3").trainable_parameters == 2_570
    assert ModelSpec.from_json(spec.to_json()) == spec
    result = predict(PredictRequest(model="test_predict:frozen_mlp", sample="1x28x28",
                                    cluster="2 nodes x 1 A100, 10GbE"))
    assert (result["parameters"], result["trainable_parameters"]) == (203_530, 2_570)


def test_frozen_parameters_have_no_gradient_bucket_or_optimizer_state():
    """DataParallel averages only tensors that require a gradient, and the optimizer keeps state only for them;
    the frozen weights still take memory."""
    result = predict(PredictRequest(model="test_predict:frozen_mlp", sample="1x28x28",
                                    cluster="2 nodes x 1 A100, 10GbE"))
    assert sum(bucket["values"] for bucket in result["buckets"]) == 2_570
    assert result["memory"]["parts_gb"]["weights"] == round(203_530 * 4 / 2**30, 3)
    # one tensor at a time, the host's launches count tensors: the head's weight and bias, not the frozen two
    from gpurig.perf.machine import GPU_EFFICIENCY
    from gpurig.perf.optimizer import FOR_LOOP_HOST_SHARE

    loop = predict(PredictRequest(model="test_predict:frozen_mlp", sample="1x28x28", cluster="1 x A100",
                                  optimizer_impl="for-loop"))
    per_tensor_ms = FOR_LOOP_HOST_SHARE["momentum"] * GPU_EFFICIENCY.layer_overhead_s * 1e3
    assert loop["step"]["optimizer_ms"] == pytest.approx(2 * per_tensor_ms)


@pytest.mark.parametrize("sample,expected", [
    ("20x16:int64", "fails on samples of 20x16:int64 (ValueError: RNN input dtype (torch.int64) does not match "
                    "weight dtype (torch.float32)"),
    ("20x16:int64", "it takes floating-point values, e.g. 20x16"),
])
def test_a_sample_of_the_wrong_type_says_what_the_model_said(sample, expected):
    code, out, err = run_cli(["predict", "--model", "test_predict:gru", "--sample", sample, "--cluster", "1 x A100"])
    assert code == 2 and expected in err and "reads tensor values" not in err, err
    assert len(err.strip().splitlines()) == 1


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x, y):
        return self.fc(x) + self.fc(y)


class DictInput(TwoInputs):
    def forward(self, batch):
        return self.fc(batch["x"])


@pytest.mark.parametrize("factory", ["TwoInputs", "DictInput"])
def test_a_model_of_several_inputs_is_told_so_not_asked_for_another_shape(factory):
    code, out, err = run_cli(["predict", "--model", f"test_predict:{factory}", "--sample", "16", "--cluster", "1 x A100"])
    assert code == 2 and "its forward takes more than one input, and --sample describes one tensor" in err, err
    assert len(err.strip().splitlines()) == 1 and "is that the input it takes" not in err


class Gru(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gru, self.fc = torch.nn.GRU(16, 32, batch_first=True), torch.nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(self.gru(x)[0][:, -1])


def gru():
    return Gru()


@pytest.fixture(scope="module")
def quick_compute():
    """bench's compute part (--quick), really run here once for the tests that predict from it."""
    import gpurig
    from gpurig.measure.compute import measure_all

    return measure_all(gpurig.init(), quick=True)


def chain_profile(path, compute: dict, codec: str, alpha: float, beta: float, rows=(), slowdown: float = 1.0,
                  posted: float = 0.0, link: tuple[float, float] = (5e-5, 8e-9), posting=None):
    """A 2-rank CPU profile at ``path``: ``compute`` and a compressed chain for ``codec`` fitted to ``alpha``
    and ``beta`` (``rows``: its measured rows); computing runs ``slowdown`` times slower under a collective
    and each collective posted under it costs it ``posted`` seconds (a compressed bucket, if ``posting`` is
    given, its line: seconds, seconds per gradient byte); ``link`` is the allreduce fit (alpha seconds, beta
    seconds per byte)."""
    chain = {"rows": list(rows), "busbw_gbs": 0.1, "alpha_s": alpha, "beta_s_per_byte": beta}
    if posting:
        chain.update(posted_alpha_s=posting[0], posted_beta_s_per_byte=posting[1])
    comm = {"ranks": 2, "nodes": 2, "ranks_per_machine": 2,
            "engines": {"mpi": {"allreduce": {"rows": [], "busbw_gbs": 0.1, "alpha_s": link[0],
                                              "beta_s_per_byte": link[1]},
                                f"compressed:{codec}": chain}},
            "overlap": {"mpi": {"slowdown": slowdown, "posted_s": posted}}}
    path.write_text(json.dumps({"schema": "gpurig-profile/1", "device": "cpu", "cpu": "test",
                                "compute": {"2": compute}, "comm": comm}))
    return path


def test_bench_measured_layers_and_optimizer_are_predicted_as_measured(quick_compute):
    """bench's compute part, really run here, feeds the predictor: each layer it timed is predicted at its
    measured forward and backward time (in a step, forward also reads the weights from memory: bench's
    repeats find them in the CPU's cache), and the optimizer at its measured cost; other kinds keep the
    model."""
    from gpurig.perf.machine import build_layer, profile_device
    from gpurig.perf.step import layer_costs, layer_seconds
    from gpurig.models.describe import describe

    measured = quick_compute
    device = profile_device({"device": "cpu", "compute": {"1": measured}}, ranks_per_node=1)
    assert {row["kind"] for row in measured["layers"]} == {"linear", "conv", "pool", "activation"}
    for row in measured["layers"]:
        example = torch.empty(1, *row["input"][1:], requires_grad=row["input_grad"])
        layer = layer_costs(describe(build_layer(row["kind"], tuple(row["arguments"])), example,
                                     batch=row["input"][0]))[0]
        forward, backward = layer_seconds(layer, device, in_step=False)
        assert forward == pytest.approx(row["forward_s"], rel=2e-3)
        assert backward == pytest.approx(row["backward_s"], rel=2e-3)
        in_step = layer_seconds(layer, device)
        assert in_step[0] == pytest.approx(forward + 4 * layer.params / measured["memory_bytes_per_s"])
        assert in_step[1] == backward
    momentum = next(r for r in measured["optimizers"] if r["optimizer"] == "momentum")
    assert device.optimizer_seconds("momentum", momentum["values"]) == pytest.approx(
        momentum["values"] * momentum["seconds_per_value"])
    unmeasured = [layer for layer in layer_costs(describe(torch.nn.LayerNorm(64), (64,), batch=8))]
    assert device.layer_scale(unmeasured[0]) == (1.0, 1.0)


def test_powersgd_chain_pays_bench_s_per_matrix_cost_for_each_matrix_beyond_the_first(quick_compute, tmp_path):
    """bench times PowerSGD's chain on one matrix and what each further matrix adds; each bucket of the CNN
    holds two compressed matrices (its dense layers, then its convolutions), so each pays one more."""
    from gpurig.parallel.powersgd import split
    from gpurig.predict.configuration import bucket_of_tensors
    from gpurig.models import model_spec

    alpha, beta, per_matrix = 3e-4, 1 / 500e6, 2.5e-4
    rows = [{"bytes": 1 << 20, "seconds": 1e-3, "per_matrix_s": per_matrix},
            {"bytes": 1 << 22, "seconds": 4e-3, "per_matrix_s": per_matrix}]
    path = chain_profile(tmp_path / "profile.json", quick_compute, "powersgd", alpha, beta, rows)
    result = predict(PredictRequest(model="mnist-cnn", cluster=str(path), gpus=2, batch=32, compression="powersgd"))
    spec = model_spec("mnist-cnn", batch=32)
    shapes = [shape for layer in spec.layers for _, shape in layer.parameter_shapes]
    owners = bucket_of_tensors(spec, 4.0)
    assert len(result["buckets"]) == 2
    for b, bucket in enumerate(result["buckets"]):
        matrices = len(split([s for s, owner in zip(shapes, owners) if owner == b], 4)[0])
        assert matrices == 2
        # on CPU ranks, the arithmetic (codec_s) and the rest (seconds) together are the chain
        assert bucket["seconds"] + bucket["codec_s"] == pytest.approx(
            alpha + beta * 4 * bucket["values"] + (matrices - 1) * per_matrix)


@pytest.mark.parametrize("model", ["mnist-mlp", "mnist-cnn"])
def test_posting_a_bucket_under_backward_costs_what_bench_measured(quick_compute, tmp_path, model):
    """Each bucket begun while backward still has work to do costs backward bench's posted_s (waking the
    communication thread on cores the ranks' compute fills); the bucket that leaves as backward ends costs
    nothing (the rank only waits then)."""
    paths = {posted: chain_profile(tmp_path / f"profile-{posted}.json", quick_compute, "int8", 2e-4, 1e-8,
                                   posted=posted) for posted in (0.0, 0.004)}
    early_counts = []
    for bucket_mb in (None, 0.01):   # DDP's two buckets (the last layers' leaves early); one per layer
        steps = {posted: predict(PredictRequest(model=model, cluster=str(path), gpus=2, batch=32,
                                                bucket_mb=bucket_mb)) for posted, path in paths.items()}
        buckets = steps[0.0]["buckets"]
        early = sum(b["lead_s"] > 1e-9 for b in buckets)
        assert early == len(buckets) - 1   # all but the first layer's, which is done as backward ends
        assert steps[0.004]["step"]["backward_ms"] == pytest.approx(steps[0.0]["step"]["backward_ms"] + 4.0 * early)
        assert steps[0.004]["step"]["forward_ms"] == steps[0.0]["step"]["forward_ms"]
        early_counts.append(early)
    assert early_counts[0] == 1 < early_counts[1]


@pytest.mark.parametrize("chain_over_lead", [0.5, 3.0])   # the chain shorter than backward's rest, then longer
def test_posting_a_compressed_bucket_under_backward_costs_bench_s_measured_line(quick_compute, tmp_path,
                                                                                  chain_over_lead):
    """bench measured what posting a compressed bucket under computation costs it (the chain's work on the
    communication thread, beside backward on the same cores) as a line in the gradient's bytes: the CNN's
    first bucket, begun while backward still runs, costs backward that line's fixed part (the hand-offs) and
    what its size adds for the share of its chain that backward's rest covers, in place of the plain posting
    cost and of that share of its codec's arithmetic (the measurement holds it); the last bucket, begun as
    backward ends, keeps its codec and costs no posting."""
    posting = (3e-3, 2e-9)
    # the chain's length against backward's rest after the first bucket (which this machine's compute sets):
    # half of it, then three times it
    probe = predict(PredictRequest(model="mnist-cnn", cluster=str(chain_profile(
        tmp_path / "probe.json", quick_compute, "int8", 1e-6, 1e-14, posted=1e-3, link=(5e-6, 1e-11))),
        gpus=2, batch=32, compression="int8"))["buckets"][0]
    alpha = 0.1 * probe["lead_s"]
    beta = (chain_over_lead * probe["lead_s"] - alpha) / (4 * probe["values"])
    paths = {kind: chain_profile(tmp_path / f"{kind}.json", quick_compute, "int8", alpha, beta, posted=1e-3,
                                 link=(5e-6, 1e-11), posting=posting if kind == "measured" else None)
             for kind in ("plain", "measured")}
    steps = {kind: predict(PredictRequest(model="mnist-cnn", cluster=str(path), gpus=2, batch=32,
                                          compression="int8")) for kind, path in paths.items()}
    plain, measured = steps["plain"], steps["measured"]
    first, last = plain["buckets"]
    assert first["lead_s"] > 1e-4 and last["lead_s"] < 1e-12 and first["codec_s"] > 0 and last["codec_s"] > 0
    share = min(1.0, first["lead_s"] / (first["seconds"] + first["codec_s"]))
    assert (share == 1.0) == (chain_over_lead < 1)
    assert [b["codec_s"] for b in measured["buckets"]] == pytest.approx([(1 - share) * first["codec_s"],
                                                                         last["codec_s"]])
    cost = posting[0] + share * posting[1] * 4 * first["values"]
    assert measured["step"]["backward_ms"] == pytest.approx(
        plain["step"]["backward_ms"] + 1e3 * (cost - 1e-3 - share * first["codec_s"]))
    assert measured["step"]["forward_ms"] == plain["step"]["forward_ms"]


def test_measured_compressed_chain_and_compute_slowdown_are_what_the_step_uses(quick_compute, tmp_path):
    """bench's timed compressed average replaces the codec-and-wire model per bucket, and its measured
    slowdown of computing under a collective stretches backward exactly as perf.overlap.timeline says."""
    import math

    from gpurig.perf.codec import elementwise_seconds
    from gpurig.perf.overlap import timeline

    compute = quick_compute
    alpha, beta = 2e-4, 1 / 120e6   # a compressed chain: 0.2 ms, then 120 MB of float32 gradient per second
    steps = {}
    for slowdown in (1.0, 2.0):
        path = chain_profile(tmp_path / f"profile-{slowdown}.json", compute, "int8", alpha, beta, slowdown=slowdown)
        result = predict(PredictRequest(model="mnist-mlp", cluster=str(path), gpus=2, batch=64, compression="int8"))
        steps[slowdown] = result["step"]
        buckets = result["buckets"]
        assert buckets and all(b["algorithm"] == "measured" for b in buckets)
        int8 = compute["codecs"]["int8"]
        encode, decode = int8["encode_s_per_value"], int8["decode_s_per_value"]
        for b in buckets:
            # On CPU ranks the chain's arithmetic (the codec, as bench timed it per value) is on the cores, the
            # rest can travel under backward: together, the chain bench timed.
            assert b["seconds"] + b["codec_s"] == pytest.approx(alpha + beta * 4 * b["values"])
            assert 0 < b["codec_s"] == pytest.approx(elementwise_seconds(b["values"], encode, decode, 2))
    # the same prediction, one with backward at half pace while buckets travel
    leads = [b["lead_s"] for b in buckets]
    _, stretch = timeline(leads, [b["seconds"] for b in buckets], [b["codec_s"] for b in buckets], slowdown=2.0)
    assert stretch > 0
    assert steps[2.0]["backward_ms"] == pytest.approx(steps[1.0]["backward_ms"] + 1000 * stretch, rel=1e-6)
    assert math.isclose(steps[2.0]["forward_ms"], steps[1.0]["forward_ms"])


def test_a_measured_chain_leaves_the_link_at_least_its_bytes_time(quick_compute, tmp_path):
    """On CPU ranks a measured compressed chain is split into the model's arithmetic (compute) and the rest
    (what can travel under backward); the rest is never less than the compressed bytes' time on the link,
    however large the arithmetic estimate (PowerSGD behind 100 Mbit/s was predicted to send its factors in
    0.1 ms)."""
    alpha_link, beta_link = 5e-5, 8e-8           # the allreduce fit of a 100 Mbit/s link
    first = predict(PredictRequest(model="mnist-mlp", cluster=str(chain_profile(
        tmp_path / "any.json", quick_compute, "powersgd", 1.0, 1e-15, link=(alpha_link, beta_link))), gpus=2,
        batch=64, compression="powersgd"))
    # a ring allreduce of the payload on 2 ranks, P then Q (one more latency: half the fit's alpha)
    floors = [alpha_link + beta_link * b["wire_bytes"] + alpha_link / 2 for b in first["buckets"]]
    whole = max(floors) + 1e-5                   # every bucket's chain: just above the largest floor
    path = chain_profile(tmp_path / "profile.json", quick_compute, "powersgd", whole, 1e-15,  # (a fit needs a slope)
                         link=(alpha_link, beta_link))
    buckets = predict(PredictRequest(model="mnist-mlp", cluster=str(path), gpus=2, batch=64,
                                     compression="powersgd"))["buckets"]
    assert len(buckets) == len(floors) == 2
    for b, floor in zip(buckets, floors):
        assert b["seconds"] + b["codec_s"] == pytest.approx(whole, rel=1e-5)
        assert b["seconds"] >= floor * (1 - 1e-9) and b["codec_s"] >= 0
    largest = floors.index(max(floors))
    assert buckets[largest]["seconds"] == pytest.approx(floors[largest], rel=1e-5)   # the arithmetic estimate gave way


def test_a_transformers_model_parallel_plan_splits_each_blocks_mlp_and_exchanges_every_token():
    """The text presets' feed-forward is a plain nn.Sequential, so Krizhevsky's plan splits fc by columns and proj
    by rows in every block (Megatron-LM's MLP split) and leaves attention whole; each split layer's exchange holds
    all of a sample's tokens, so twice the tokens exchange about twice the bytes."""
    from gpurig.models.text import Block
    from gpurig.parallel.layer_plan import krizhevsky_plan

    block = Block(64, 4, causal=False, pre_norm=False, fused_qkv=False, dropout=0.1, gelu="none", eps=1e-12)
    assert krizhevsky_plan(block) == {"mlp.fc": "column", "mlp.proj": "row"}
    comm = [predict(PredictRequest(model="bert-base", cluster="4 x A100", parallel="model", batch=32,
                                   tokens=tokens))["step"]["comm_total_ms"] for tokens in (128, 256)]
    assert 1.8 < comm[1] / comm[0] < 2.2, comm


def test_model_parallelism_holds_a_share_of_the_split_layers_per_gpu():
    """AlexNet's split pair of dense layers holds 89 % of its weights: on 4 GPUs each holds a quarter of them, and of
    their gradients and momentum, with what that leaves for a larger batch."""
    data = predict(PredictRequest(model="alexnet", cluster="4 x RTX 3090"))["memory"]
    split = predict(PredictRequest(model="alexnet", cluster="4 x RTX 3090", parallel="model"))["memory"]
    for part in ("weights", "gradients", "optimizer"):
        assert split["parts_gb"][part] < 0.35 * data["parts_gb"][part], part
    assert split["total_gb"] < data["total_gb"]
    assert split["parts_gb"]["buckets"] == 0                  # nothing of the model is averaged across the GPUs
    # hybrid: the layers left whole (the convolutions, 11 % of the weights) are data-parallel: their gradients
    # are averaged in buckets, the split layers' are not
    hybrid = predict(PredictRequest(model="alexnet", cluster="4 x RTX 3090", parallel="hybrid"))["memory"]
    assert 0.05 * data["parts_gb"]["buckets"] < hybrid["parts_gb"]["buckets"] < 0.15 * data["parts_gb"]["buckets"]


def test_a_board_of_two_devices_trains_as_two_gpus_of_half_each():
    """A Tesla K80 (two GK210) and an MI250 (two GCDs) are two devices each to CUDA and ROCm: a rank holds half the
    board's memory and computes at half its peak. Priced as one device, ResNet-50 fit 13 GiB into a K80's 12 GB
    per device and ran at twice one device's speed."""
    one = predict(PredictRequest(model="resnet50", cluster="1 x Tesla K80", batch=160))
    assert one["gpus"] == 2 and one["memory"]["gpu_gb"] == 12 and not one["memory"]["fits"]
    half = predict(PredictRequest(model="resnet50", cluster="1 x Tesla K80", batch=32, gpus=1))
    board = predict(PredictRequest(model="resnet50", cluster="1 x Tesla K80", batch=32))
    assert 1.6 < board["samples_per_s"] / half["samples_per_s"] <= 2.0
    assert predict(PredictRequest(model="resnet50", cluster="1 x MI250", batch=32))["memory"]["gpu_gb"] == 64


def test_a_cluster_of_a_hundred_thousand_machines_is_priced_by_its_kinds():
    """"100000 nodes x 8 A100" took 5 minutes (every machine priced one by one at every GPU count); the machines of
    one [[nodes]] table are priced once, and the curve still counts them (a QA sweep, session 53)."""
    result = predict(PredictRequest(model="mnist-mlp", cluster="100000 nodes x 8 A100, 100 Gb InfiniBand"))
    assert (result["gpus"], result["nodes"]) == (800_000, 100_000)
    assert [(row["gpus"], row["nodes"]) for row in result["scaling"]][-2:] == [(524_288, 65_536), (800_000, 100_000)]


def test_the_sequence_length_priced_is_said(monkeypatch):
    """--tokens, or a token preset's own length when it is left out, in the header and the JSON; none for images."""
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(["predict", "--model", "bert-base", "--batch", "16", "--cluster", "2 x 3090"])
    assert code == 0 and "16 samples of 128 tokens per GPU" in out, err
    code, out, err = run_cli(["predict", "--model", "bert-base", "--tokens", "256", "--cluster", "2 x 3090", "--json"])
    assert code == 0 and json.loads(out)["tokens"] == 256
    code, out, err = run_cli(["predict", "--model", "mnist-mlp", "--cluster", "2 x 3090", "--json"])
    assert code == 0 and json.loads(out)["tokens"] is None


def test_more_gpus_than_any_machine_holds_is_said(monkeypatch):
    """"1000 A100" is one machine of a thousand GPUs: priced as asked, and said to be no machine there is."""
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(["predict", "--model", "mnist-mlp", "--cluster", "1000 A100", "--json"])
    assert code == 0, err
    assert "no machine holds 1000 GPUs" in json.loads(out)["hardware_note"]
    code, out, err = run_cli(["predict", "--model", "mnist-mlp", "--cluster", "8 A100", "--json"])
    assert code == 0 and json.loads(out)["hardware_note"] == ""


def test_fp32s_note_speaks_of_convolutions_only_for_a_model_that_has_them():
    """On an A100 PyTorch runs convolutions in TF32 by default: that note is for ResNet-50; BERT's is its products."""
    conv = predict(PredictRequest(model="resnet50", cluster="1 x A100", batch=8))["precision_note"]
    products = predict(PredictRequest(model="bert-base", cluster="1 x A100", batch=8, tokens=128))["precision_note"]
    assert conv.startswith("convolutions in TF32") and "convolutions" not in products
    assert products.startswith("matrix multiplies in FP32 (PyTorch's default; --precision tf32")


def test_a_cluster_of_two_gpu_models_names_both_and_its_mfu_is_against_their_peaks(tmp_path):
    """4 RTX 4090 and 2 RTX 3090: both named (the header said only the 4090), and the MFU's peak is the GPUs'
    mean, the 4090's counted four times (it was the 4090's alone, while the step is the 3090's)."""
    spec = tmp_path / "mixed.toml"
    spec.write_text('network = "100 Gbit/s InfiniBand"\n[[nodes]]\ngpus = 4\ngpu = "RTX 4090"\n'
                    '[[nodes]]\ngpus = 2\ngpu = "RTX 3090"\n')
    mixed = predict(PredictRequest(model="resnet50", cluster=str(spec)))
    alone = {name: predict(PredictRequest(model="resnet50", cluster=f"1 x {name}"))["utilization"]["peak_tflops"]
             for name in ("RTX 4090", "RTX 3090")}
    assert mixed["gpu"] == "GeForce RTX 4090 + GeForce RTX 3090"
    assert mixed["utilization"]["peak_tflops"] == pytest.approx((4 * alone["RTX 4090"] + 2 * alone["RTX 3090"]) / 6,
                                                                abs=1e-3)
