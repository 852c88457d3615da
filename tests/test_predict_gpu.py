"""gpurig predict on catalog GPUs: precision as the frameworks run it, the catalog's tensor peaks, the 80-column
tables, and the published-results benchmark predicting exactly what ``gpurig predict`` does."""

import csv
import dataclasses
import json
import sys
from pathlib import Path

import pytest

from conftest import gpurig as gpurig_cli
from conftest import run_cli
from gpurig.errors import UsageError
from gpurig.perf import machine
from gpurig.perf.precision import PRECISIONS, precision_on
from gpurig.predict import PredictRequest, predict
from gpurig.spec import catalog

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def samples_per_s(model, gpu, precision, batch=64, tokens=None):
    return predict(PredictRequest(model=model, cluster=f"1 x {gpu}", batch=batch, tokens=tokens,
                                  precision=precision))["samples_per_s"]


def test_an_unknown_precision_is_one_line_with_the_choices():
    code, out, err = run_cli(["predict", "--model", "resnet50", "--cluster", "1 x A100", "--precision", "int4"])
    assert code == 2 and out == ""
    assert err.strip() == "gpurig: error: unknown precision 'int4'; choose one of: fp32, tf32, fp16, bf16, fp8"


def test_fp8_without_fp8_tensor_cores_is_refused():
    code, _, err = run_cli(["predict", "--model", "bert-base", "--cluster", "1 x V100", "--precision", "fp8"])
    assert code == 2 and "needs FP8 tensor cores" in err and "V100" in err and len(err.strip().splitlines()) == 1


def test_a_measured_profile_refuses_a_precision_it_did_not_measure(tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text('{"schema": "gpurig-profile/1", "device": "cpu"}')
    code, _, err = run_cli(["predict", "--model", "mnist-mlp", "--cluster", profile, "--precision", "bf16"])
    assert code == 2 and "prices fp32" in err


def test_fp16_on_a_card_without_fast_fp16_runs_near_fp32_speed_and_says_why():
    # The GTX 1080 Ti's native FP16 is 1/64 of FP32; frameworks store 16 bits and compute in FP32.
    fp32 = samples_per_s("resnet50", "GTX 1080 Ti", "fp32")
    fp16 = predict(PredictRequest(model="resnet50", cluster="1 x GTX 1080 Ti", batch=64, precision="fp16"))
    assert 1.0 <= fp16["samples_per_s"] / fp32 < 1.6      # half the bytes, the same arithmetic
    assert "no FP16 tensor cores" in fp16["precision_note"]


def test_tf32_speeds_up_ampere_but_not_volta():
    assert samples_per_s("bert-base", "A100", "tf32", 32, 384) > 2 * samples_per_s("bert-base", "A100", "fp32", 32, 384)
    v100 = predict(PredictRequest(model="bert-base", cluster="1 x V100", batch=32, tokens=384, precision="tf32"))
    assert v100["samples_per_s"] == pytest.approx(samples_per_s("bert-base", "V100", "fp32", 32, 384))
    assert "no TF32 tensor cores" in v100["precision_note"]


def test_pytorchs_default_fp32_runs_convolutions_in_tf32_on_ampere():
    a100 = machine.gpu_device(catalog.gpu("A100"), "fp32")
    assert a100.conv_gemm.flops_per_s == pytest.approx(a100.gemm.flops_per_s * 156 / 19.5
                                                        * machine.GPU_EFFICIENCY.tensor_gemm
                                                        * machine.GPU_EFFICIENCY.conv / machine.GPU_EFFICIENCY.cuda_gemm)
    # so a convolutional net gets (nearly) all of tf32's speed in fp32, only its classifier in FP32; a transformer,
    # matmuls only, under half of it
    conv_net = samples_per_s("resnet50", "A100", "fp32") / samples_per_s("resnet50", "A100", "tf32")
    transformer = samples_per_s("bert-base", "A100", "fp32", 32, 384) / samples_per_s("bert-base", "A100", "tf32", 32, 384)
    assert 0.9 < conv_net <= 1.0 and transformer < 0.5


def test_each_architecture_scales_its_own_tensor_cores_and_nothing_else():
    halved = machine.GpuEfficiency(architecture=(("Hopper", 0.5),))
    plain = machine.GpuEfficiency(architecture=())
    h100, a100 = catalog.gpu("H100"), catalog.gpu("A100")
    assert machine.gpu_device(h100, "bf16", halved).gemm.flops_per_s == pytest.approx(
        0.5 * machine.gpu_device(h100, "bf16", plain).gemm.flops_per_s)
    assert machine.gpu_device(a100, "bf16", halved).gemm.flops_per_s == machine.gpu_device(a100, "bf16", plain).gemm.flops_per_s
    # PyTorch's default FP32 matmuls run on the CUDA cores: no tensor-core factor
    assert machine.gpu_device(h100, "fp32", halved).gemm.flops_per_s == machine.gpu_device(h100, "fp32", plain).gemm.flops_per_s


def test_a_generation_without_a_factor_of_its_own_is_priced_as_the_one_its_kernels_descend_from():
    """The published rows hold one Blackwell (a B200): no factor can be fitted to it, and Ampere's (1) priced it
    2.1-2.6x an H100 where Lambda measured 1.6-2.0x. A data-centre Blackwell takes Hopper's factor, a GeForce one
    Ada's; another vendor's GPUs take none."""
    fitted = machine.GpuEfficiency(architecture=(("Hopper", 0.5), ("Ada Lovelace", 1.2)))
    plain = machine.GpuEfficiency(architecture=())

    def rate(gpu, efficiency):
        return machine.gpu_device(catalog.gpu(gpu), "bf16", efficiency).gemm.flops_per_s

    assert rate("B200", fitted) == pytest.approx(0.5 * rate("B200", plain))
    assert rate("RTX 5090", fitted) == pytest.approx(1.2 * rate("RTX 5090", plain))
    assert rate("MI300X", fitted) == rate("MI300X", plain)
    b200_over_h100 = samples_per_s("bert-base", "B200", "tf32", 64, 384) / samples_per_s("bert-base", "H100 SXM5 80 GB",
                                                                                       "tf32", 64, 384)
    assert 1.6 < b200_over_h100 < 2.1     # Lambda's NGC 24.xx runs: 1.98x


def test_predict_advises_the_kernels_a_script_can_switch_to_each_as_predict_prices_it():
    """A GPU step in PyTorch's defaults leaves speed behind: matrix multiplies in FP32, no autocast, NCHW tensors
    transposed around 16-bit convolutions. predict says so, each switch predicted by predict itself, and only on
    GPUs that have the kernels."""
    def advised(model, gpu, precision, batch=64, **request):
        result = predict(PredictRequest(model=model, cluster=f"1 x {gpu}", batch=batch, precision=precision, **request))
        return result["samples_per_s"], {item["what"]: item["samples_per_s_gain"] for item in result["advice"]}

    rate, items = advised("bert-base", "A100", "fp32", 32)
    assert items["--precision tf32"] > 1.5 and items["--precision bf16"] > items["--precision tf32"]
    for flag, gain in (("--precision tf32", "tf32"), ("--precision bf16", "bf16")):
        assert items[flag] == pytest.approx(samples_per_s("bert-base", "A100", gain, 32) / rate)
    _, v100 = advised("bert-base", "V100", "fp32", 32)
    assert "--precision fp16" in v100 and not {"--precision tf32", "--precision bf16"} & set(v100)
    rate, convnet = advised("resnet50", "H100", "bf16", 128)
    assert convnet["--memory-format channels-last"] == pytest.approx(
        predict(PredictRequest(model="resnet50", cluster="1 x H100", batch=128, precision="bf16",
                               memory_format="channels-last"))["samples_per_s"] / rate)
    _, done = advised("resnet50", "H100", "bf16", 128, memory_format="channels-last")
    assert not [what for what in done if what.startswith(("--precision", "--memory-format"))]
    _, gtx = advised("bert-base", "GTX 1080 Ti", "fp32", 32)     # Pascal: no tensor cores to switch to
    assert not [what for what in gtx if what.startswith(("--precision", "--memory-format"))]


def test_an_unknown_software_is_one_line_with_the_choices():
    code, out, err = run_cli(["predict", "--model", "bert-base", "--cluster", "1 x A100", "--software", "tensorflow"])
    assert code == 2 and out == ""
    assert err.strip() == "gpurig: error: unknown software 'tensorflow'; choose one of: current, pytorch-1.7, pytorch-1.4"


def test_a_measured_profile_refuses_a_software_it_did_not_run(tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text('{"schema": "gpurig-profile/1", "device": "cpu"}')
    code, _, err = run_cli(["predict", "--model", "mnist-mlp", "--cluster", profile, "--software", "pytorch-1.4"])
    assert code == 2 and "--software pytorch-1.4" in err and len(err.strip().splitlines()) == 1


def test_an_older_software_release_scales_every_compute_rate_by_its_factor():
    e = machine.GpuEfficiency(software=((("pytorch-1.4", "mixed"), 0.5),))
    v100 = catalog.gpu("V100")
    old, new = machine.gpu_device(v100, "fp16", e, "pytorch-1.4"), machine.gpu_device(v100, "fp16", e)
    assert old.gemm.flops_per_s == pytest.approx(0.5 * new.gemm.flops_per_s)
    assert old.memory_bytes_per_s == pytest.approx(0.5 * new.memory_bytes_per_s)
    assert machine.gpu_device(v100, "fp32", e, "pytorch-1.4").gemm.flops_per_s == \
        machine.gpu_device(v100, "fp32", e).gemm.flops_per_s           # its mixed-precision factor only
    request = dict(model="bert-base", cluster="1 x V100", batch=32, tokens=384, precision="fp16")
    assert dict(machine.GPU_EFFICIENCY.software)[("pytorch-1.4", "mixed")] < 1     # fitted: apex AMP was slower
    slower = predict(PredictRequest(**request, software="pytorch-1.4"))
    assert slower["software"] == "pytorch-1.4"
    assert slower["samples_per_s"] < predict(PredictRequest(**request))["samples_per_s"]


def test_mixed_precision_convolutions_have_their_own_efficiency():
    a100 = catalog.gpu("A100")
    fast = machine.GpuEfficiency(conv_mixed=1.5)
    assert machine.gpu_device(a100, "fp16", fast).conv_gemm.flops_per_s == pytest.approx(
        1.5 * machine.GpuEfficiency(conv_mixed=1.0).tensor_gemm * 312e12)
    assert machine.gpu_device(a100, "tf32", fast).conv_gemm.flops_per_s == \
        machine.gpu_device(a100, "tf32").conv_gemm.flops_per_s


def test_only_dense_3x3_stride_1_convolutions_get_winograds_saving_and_groups_are_gemms_of_their_own():
    from gpurig.perf.step import LayerCost, backward_of, layer_seconds

    # FP32 convolutions on the CUDA cores; every product's memory traffic hidden under its arithmetic
    v100 = machine.gpu_device(catalog.gpu("V100"), "fp32", dataclasses.replace(machine.GPU_EFFICIENCY, unhidden=0.0))
    shape = (64 * 56 * 56, 256, 256 * 9)

    def forward_s(gemm, winograd=False):
        layer = LayerCost("c", 0, (gemm,), tuple(backward_of(gemm)), kind="conv", winograd=winograd)
        return layer_seconds(layer, v100)[0]

    dense_3x3, other = forward_s(shape, winograd=True), forward_s(shape)   # the second: a 1×1, strided or dilated
    assert other == pytest.approx(v100.conv_gemm.seconds(*shape) if v100.conv_gemm else v100.gemm.seconds(*shape))
    assert other / dense_3x3 == pytest.approx(machine.GPU_EFFICIENCY.conv_cuda, rel=1e-3)
    # ResNeXt's 3×3 in 32 groups of 4 channels: 32 GEMMs of 4 output channels, each in whole tiles, not one of 128
    grouped, packed = forward_s((64 * 56 * 56, 4, 4 * 9, 32)), forward_s((64 * 56 * 56, 128, 4 * 9))
    assert grouped > 2 * packed


def test_grouped_convolutions_in_tf32_run_on_the_cuda_cores_in_cudnns_fp32_tiles():
    from gpurig.perf.step import LayerCost

    grouped = LayerCost("g", 0, ((64 * 56 * 56, 4, 4 * 9, 32),), kind="conv")
    dense = LayerCost("d", 0, ((64 * 56 * 56, 128, 128),), kind="conv")
    a100_tf32, a100_amp = machine.gpu_device(catalog.gpu("A100"), "tf32"), machine.gpu_device(catalog.gpu("A100"), "fp16")
    assert a100_tf32.gemm_for(grouped) is a100_tf32.grouped_gemm
    assert a100_tf32.grouped_gemm.flops_per_s == pytest.approx(19.5e12 * machine.GPU_EFFICIENCY.cuda_gemm)
    assert a100_tf32.gemm_for(dense) is a100_tf32.conv_gemm                 # dense ones stay on the tensor cores
    assert a100_amp.grouped_gemm is None and a100_amp.gemm_for(grouped) is a100_amp.conv_gemm
    # on the CUDA cores a 16-channel output (SSD's box head) fills a 128x32 tile, not a 64x128 one
    v100 = machine.gpu_device(catalog.gpu("V100"), "fp32")
    assert v100.conv_gemm.computed_flops(128 * 800, 16, 576) == 2 * 128 * 800 * 32 * 576   # 800 tiles: 10 waves of 80 SMs


def test_an_unknown_memory_format_is_one_line_with_the_choices():
    code, _, err = run_cli(["predict", "--model", "resnet50", "--cluster", "1 x A100", "--memory-format", "nhwc"])
    assert code == 2
    assert "unknown memory format 'nhwc'; choose one of: contiguous, channels-last" in err


def test_channels_last_spares_16_bit_convolutions_their_transposes_and_nothing_else():
    def speed(model, precision, memory_format, tokens=None):
        return predict(PredictRequest(model=model, cluster="1 x A100", batch=64, tokens=tokens, precision=precision,
                                      memory_format=memory_format))

    nchw, nhwc = speed("resnet50", "fp16", "contiguous"), speed("resnet50", "fp16", "channels-last")
    assert nhwc["samples_per_s"] > 1.1 * nchw["samples_per_s"] and nhwc["memory_format"] == "channels-last"
    assert speed("resnet50", "tf32", "channels-last")["samples_per_s"] == \
        speed("resnet50", "tf32", "contiguous")["samples_per_s"]
    assert "tf32 is priced the same" in speed("resnet50", "tf32", "channels-last")["precision_note"]
    with pytest.raises(UsageError, match="bert-base has none"):   # no convolution to lay out: not taken, then ignored
        speed("bert-base", "fp16", "channels-last", 128)


def test_bf16_batch_norm_on_nchw_tensors_runs_pytorchs_own_slower_kernels_and_fp16_runs_cudnns():
    from gpurig.models import model_spec
    from gpurig.perf.step import layer_costs, layer_seconds

    def speed(model, precision, memory_format, tokens=None):
        # the A100's bf16 and fp16 peaks are the same (312 TFLOP/s): only the kernels can tell them apart
        return predict(PredictRequest(model=model, cluster="1 x A100", batch=64, tokens=tokens, precision=precision,
                                      memory_format=memory_format))["samples_per_s"]

    assert 1.05 * speed("resnet50", "bf16", "contiguous") < speed("resnet50", "fp16", "contiguous")
    # channels-last, fp16's batch norm runs cuDNN's NHWC kernels (4.33 against bf16's 7.21 ms on an H100)
    assert speed("resnet50", "bf16", "channels-last") < speed("resnet50", "fp16", "channels-last")
    assert speed("bert-base", "bf16", "contiguous", 128) >= speed("bert-base", "fp16", "contiguous", 128)
    said = {(model, precision): predict(PredictRequest(model=model, cluster="1 x A100", batch=8, precision=precision,
                                                       tokens=128 if model == "bert-base" else None))["precision_note"]
            for model in ("resnet50", "bert-base") for precision in ("bf16", "fp16")}
    assert [key for key, note in said.items() if "PyTorch's own kernels" in note] == [("resnet50", "bf16")]

    # layer by layer, on the GPU alone (no host floor): a batch norm's traffic takes longer the fewer its channels
    # against the GPU's SMs (a block per channel), and only its
    from gpurig.perf.step import nchw_batch_norm_scale
    norms = [layer for layer in layer_costs(model_spec("resnet50", batch=64)) if layer.batch_norm]
    assert len(norms) == 53
    conv = next(layer for layer in layer_costs(model_spec("resnet50", batch=64)) if layer.kind == "conv")
    a100 = catalog.gpu("A100")

    def seconds(layer, memory_format):
        device = dataclasses.replace(machine.gpu_device(a100, "bf16", memory_format=memory_format),
                                     layer_overhead_s=0.0, conv_transposes=0.0)
        return sum(layer_seconds(layer, device))

    ratios = {layer.params // 2: seconds(layer, "contiguous") / seconds(layer, "channels-last") for layer in norms}
    assert sorted(ratios) == [64, 128, 256, 512, 1024, 2048]
    for channels, ratio in ratios.items():   # but its weights' casts
        assert ratio == pytest.approx(nchw_batch_norm_scale(channels, a100.compute_units), rel=1e-3)
    assert ratios[64] == max(ratios.values()) > 2.5 * ratios[2048] and ratios[2048] > 1.3
    assert seconds(conv, "contiguous") == seconds(conv, "channels-last")


def test_batch_norm_is_bound_by_the_sms_and_elementwise_work_by_the_memory():
    """An H200 is an H100's 132 SMs with 1.43x its bandwidth: measured, the same nets' batch norm took 1.03-1.12x as
    long on the H100 and their elementwise kernels 1.2-1.4x (docs/gpu/h100-2026-11-27c/kernels/). So batch norm is
    priced at the SMs' rate (SMs × the clock the FP32 peak implies), elementwise work at the memory's; an A100's
    108 SMs at 1.41 GHz make its batch norm slower than its bandwidth alone would."""
    from gpurig.models import model_spec
    from gpurig.perf.step import layer_costs, layer_seconds

    layers = layer_costs(model_spec("resnet50", batch=64))

    def seconds(gpu, which, memory_format="channels-last"):
        device = dataclasses.replace(machine.gpu_device(catalog.gpu(gpu), "bf16", memory_format=memory_format),
                                     layer_overhead_s=0.0)
        return sum(sum(layer_seconds(layer, device)) for layer in layers if which(layer))

    norm = lambda layer: layer.batch_norm
    relu = lambda layer: layer.kind == "activation"
    assert seconds("H100", norm) == pytest.approx(seconds("H200", norm), rel=0.02)
    assert seconds("H100", relu) > 1.3 * seconds("H200", relu)
    h100 = machine.gpu_device(catalog.gpu("H100"), "bf16")
    a100 = machine.gpu_device(catalog.gpu("A100 SXM4 80GB"), "bf16")
    from gpurig.perf.step import BATCH_NORM_BYTES_PER_SM_CYCLE
    assert BATCH_NORM_BYTES_PER_SM_CYCLE * h100.sm_cycles_per_s < h100.memory_bytes_per_s
    assert a100.sm_cycles_per_s / h100.sm_cycles_per_s == pytest.approx(108 * 1.41 / (132 * 1.98), rel=0.01)
    # a GPU whose SMs the catalog does not give is priced by its memory alone
    assert machine.gpu_device(catalog.gpu("H200 NVL"), "bf16").sm_cycles_per_s == 0


def test_depthwise_convolutions_run_pytorchs_direct_kernels_at_the_same_speed_in_any_precision():
    """PyTorch runs a depthwise convolution (one channel a group) with its own direct kernels on the CUDA cores,
    in FP32 and bf16 alike: MobileNetV2's took 16.35 and 16.21 ms on an H100 at 128 a batch, and the same on an
    H200. Priced as SM work, not as 32-wide GEMM tiles of one channel each (which made MobileNetV2 in FP32 +78 %
    slow), and without the NCHW transposes of cuDNN's 16-bit kernels."""
    from gpurig.perf.step import LayerCost, depthwise_seconds, layer_seconds

    # MobileNetV2's 17 depthwise 3×3 convolutions at 224×224: (channels, input side, stride)
    shapes = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 1), (192, 28, 2),
              (384, 14, 1), (384, 14, 1), (384, 14, 1), (384, 14, 1), (576, 14, 1), (576, 14, 1), (576, 14, 2),
              (960, 7, 1), (960, 7, 1), (960, 7, 1)]
    batch = 128
    layers = [LayerCost(f"dw{i}", 9 * c, ((batch * (side // stride) ** 2, 1, 9, c),), kind="conv",
                        input_values=batch * c * side ** 2, output_values=batch * c * (side // stride) ** 2)
              for i, (c, side, stride) in enumerate(shapes)]

    def seconds(gpu, precision):
        device = dataclasses.replace(machine.gpu_device(catalog.gpu(gpu), precision), layer_overhead_s=0.0)
        assert all(depthwise_seconds(layer, device.sm_cycles_per_s) for layer in layers)
        return sum(sum(layer_seconds(layer, device)) for layer in layers)

    h100 = seconds("H100", "fp32")
    assert h100 == pytest.approx(seconds("H100", "bf16"), rel=0.01) == pytest.approx(seconds("H200", "fp32"),
                                                                                       rel=0.01)
    assert h100 == pytest.approx(16.35e-3, rel=0.1)
    # backward (the input's gradient and the weights') about 4.5x forward, as measured
    forward, backward = map(sum, zip(*(depthwise_seconds(layer, 1.0) for layer in layers)))
    assert backward / forward == pytest.approx(4.5)
    # a ResNeXt's groups (4 channels each) are not depthwise: cuDNN's grouped kernels, priced as GEMMs
    from gpurig.models import model_spec
    from gpurig.perf.step import layer_costs
    assert not any(depthwise_seconds(layer, 1.0) for layer in layer_costs(model_spec("resnext101", batch=8)))


def test_only_transcendentals_and_random_numbers_can_be_bound_by_the_vector_units():
    from gpurig.models import model_spec

    relu_net = model_spec("resnet50", batch=2)
    assert sum(layer.forward_bytes for layer in relu_net.layers) > 0
    assert sum(layer.forward_vector_bytes for layer in relu_net.layers) == 0       # ReLU, batch norm, adds
    bert = model_spec("bert-base", batch=2, tokens=128)
    vector = sum(layer.forward_vector_bytes for layer in bert.layers)
    assert 0 < vector < sum(layer.forward_bytes for layer in bert.layers)          # GELU and dropout, not the adds
    # autocast runs layer norm (and softmax, the losses) in float32: their traffic does not halve
    assert sum(layer.forward_float32_bytes for layer in bert.layers if layer.kind == "norm") == \
        sum(layer.forward_bytes for layer in bert.layers if layer.kind == "norm")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_precision_is_priced_on_a_gpu_that_has_it(precision):
    h100 = samples_per_s("bert-base", "H100", precision, 32, 384)
    assert h100 > 0
    if precision != "fp32":  # every faster precision is faster than PyTorch's default there
        assert h100 > samples_per_s("bert-base", "H100", "fp32", 32, 384)


def test_mixed_precision_moves_half_the_activation_bytes_and_casts_the_weights():
    gpu = catalog.gpu("A100")
    amp, full = machine.gpu_device(gpu, "bf16"), machine.gpu_device(gpu, "tf32")
    assert (amp.element_bytes, full.element_bytes) == (2, 4)
    assert amp.cast_bytes_per_param == 6 and full.cast_bytes_per_param == 0


def test_the_catalogs_tensor_peaks_follow_the_whitepapers_rules():
    rows = list(csv.DictReader(open(Path(catalog.__file__).parent / "data" / "gpus.csv")))
    checked = 0
    for row in rows:
        gpu = catalog.gpu(row["name"])
        if gpu.vendor == "NVIDIA" and gpu.architecture in ("Ampere", "Ada Lovelace", "Hopper") and gpu.tensor_tflops:
            assert gpu.bf16_tflops == gpu.tensor_tflops
            assert gpu.tf32_tflops == pytest.approx(gpu.tensor_tflops / 2, rel=0.01)
            assert (gpu.fp8_tflops is None) == (gpu.architecture == "Ampere")
            assert "TF32" in gpu.source
            checked += 1
        if gpu.architecture in ("Volta", "Turing", "Pascal"):
            assert gpu.tf32_tflops is None and gpu.bf16_tflops is None and gpu.fp8_tflops is None
    assert checked >= 20
    assert precision_on(catalog.gpu("MI300X"), "fp8").linear_tflops == pytest.approx(2614.9)


def test_predict_shows_its_numbers_whole_in_80_columns():
    done = gpurig_cli("predict", "--model", "bert-base", "--cluster", "2 nodes x 8 A100, 100 Gbit/s InfiniBand",
                      "--tokens", "384", "--batch", "32", "--precision", "bf16", env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in done.stdout
    assert any("samples/s" in line for line in lines)
    # many nodes behind a slow link: the scaling tables' bottleneck read "communicati…" (session 51's sweep)
    done = gpurig_cli("predict", "--model", "mnist-mlp", "--cluster", "16 nodes x 8 H100, 1 GbE", "--batch", "8",
                      env={"COLUMNS": "80"})
    assert done.returncode == 0 and "…" not in done.stdout and " comm │" in done.stdout, done.stdout[-2000:]
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


def test_the_published_benchmark_predicts_what_gpurig_predict_does():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import published_validation as validation
    finally:
        sys.path.remove(str(BENCHMARKS))
    cases = validation.load_cases()
    assert len(cases) > 700
    assert {c.model for c in cases} == {"bert-base", "ssd300", "transformer-xl-base", "transformer-xl-large",
                                        "resnext101", "se-resnext101"}
    assert not any("ResNet-50 v1.5" in c.source or "BERT-large" in c.source for c in cases)
    # Lambda publishes Transformer-XL in tokens/s; gpurig counts sequences of the published length
    lambda_4090 = next(c for c in cases if c.model == "transformer-xl-base" and c.gpu == "RTX 4090" and c.gpus == 1)
    assert lambda_4090.tokens == 192 and lambda_4090.optimizer == "lamb" and lambda_4090.published < 1000
    for case in [cases[0], next(c for c in cases if c.model == "ssd300" and c.gpus == 1),
                 next(c for c in cases if c.gpus == 8), lambda_4090,
                 next(c for c in cases if c.model == "resnext101" and c.precision == "fp16" and c.gpus == 1)]:
        fast = validation.predicted(case, machine.GPU_EFFICIENCY)
        assert fast == pytest.approx(predict(case.request)["samples_per_s"], rel=1e-9)


def test_nvidias_convnets_run_channels_last_in_amp_only_as_their_config_says():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import published_validation as validation
    finally:
        sys.path.remove(str(BENCHMARKS))
    layouts = {(c.model, c.precision, c.memory_format) for c in validation.load_cases()
               if c.model in ("resnext101", "se-resnext101")}
    assert {(precision, layout) for _, precision, layout in layouts} == {
        ("fp16", "channels-last"), ("tf32", "contiguous"), ("fp32", "contiguous")}


@pytest.mark.parametrize("argv", [["plan", "--gpu", "4x2080ti", "--use-case", "research"], ["plan", "--list-gpus"],
                                  ["doctor"]])
def test_the_hardware_verbs_show_their_numbers_whole_in_80_columns(argv):
    done = gpurig_cli(*argv, env={"COLUMNS": "80"})
    assert done.returncode in (0, 1), done.stderr           # plan and doctor exit 1 when a rule finds a problem
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    assert "…" not in done.stdout


@pytest.mark.parametrize("cluster,message", [
    ("0 nodes x 4 A100", "count: 0 nodes is outside 1–100000 nodes"),
    ("1 node x 1000000 A100", "gpus: 1000000 GPUs is outside"),
    ("2 nodes x 0 A100", "a node needs at least 1 GPU"),
    ("2 nodes x 4 A100, 0 Gbit/s Ethernet", "0.0 Gbit/s is outside"),
])
def test_an_impossible_cluster_description_is_one_line(cluster, message):
    code, out, err = run_cli(["predict", "--model", "resnet50", "--cluster", cluster])
    assert code == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1


def test_the_largest_batch_that_fits_is_where_the_traced_step_fills_the_gpu():
    """predict traces a training step at the batch asked for and at twice it, and extrapolates the largest batch
    that fits; priced there, the step fits, and a tenth more does not."""
    def memory(batch):
        return predict(PredictRequest(model="bert-base", cluster="1 x RTX 3060", batch=batch, tokens=512,
                                      precision="bf16", optimizer="adam"))["memory"]

    largest = memory(8)["largest_batch"]
    assert 8 < largest and memory(largest)["fits"] and not memory(round(1.1 * largest))["fits"]


BACKWARD_FAILS_ON_META = '''
import torch

class ReadsItsGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * float(grad.abs().max())      # reads a value: the meta device has none

class Reads(torch.nn.Module):
    def forward(self, x):
        return ReadsItsGradient.apply(x)

def factory():
    return torch.nn.Sequential(torch.nn.Linear(4096, 4096), Reads(), torch.nn.Linear(4096, 10))
'''


def test_a_model_whose_backward_cannot_run_on_meta_is_priced_by_its_parts(tmp_path):
    """The step's trace needs backward on meta tensors; a model whose backward reads values is priced by adding
    its parts up (every activation saved, every gradient), not refused."""
    from gpurig.models import step_peak

    path = tmp_path / "reads.py"
    path.write_text(BACKWARD_FAILS_ON_META)
    model = f"{path}:factory"
    assert step_peak(model, 32, sample="4096") is None
    m = predict(PredictRequest(model=model, sample="4096", cluster="1 x RTX 3060", batch=32))["memory"]
    assert m["fits"] and m["parts_gb"]["backward_working"] == 0 and m["parts_gb"]["gradients"] > 0


def test_a_gpus_bench_profile_prices_matrix_multiplies_as_measured_and_convolutions_as_the_catalog(tmp_path):
    """bench times a GPU's GEMMs in FP32 with TF32 off: what ``--precision fp32`` runs matrix multiplies in, not
    the TF32 tensor-core convolutions PyTorch runs by default. A lent H100's stored profile: its measured GEMM
    rate prices the matrix multiplies, the catalog's models the convolutions (the GPU found by the name bench
    recorded, also when the profile is the whole cluster), and bench's per-layer timings, which hold each
    layer's launch and synchronisation, are left out. Against the same H100's measured FP32 steps (ResNet-50,
    BERT-base, GPT-2, VGG-16, AlexNet, each at its largest batch; the MNIST pair is launch-bound) the median
    error is under 10 %; over all nine rows it was 41 % with every product at the FP32 GEMM rate and the layer
    ratios on."""
    import json
    import statistics

    run = json.loads((Path(__file__).resolve().parents[1] / "docs/gpu/h100-2026-11-26/gpu_validation-profile.json")
                     .read_text())
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(run["profile"]))
    h100 = machine.gpu_device(catalog.gpu(run["gpu"]))
    device = machine.profile_device(run["profile"], 1, h100)
    assert 45e12 < device.gemm.flops_per_s < 55e12                               # measured: FP32, TF32 off
    assert device.conv_gemm == h100.conv_gemm and device.layer_ratios == ()
    assert device.memory_bytes_per_s == run["profile"]["compute"]["1"]["memory_bytes_per_s"]

    largest = {}   # each model at its largest batch (all nine rows: docs/predict.md, median 5.0 %)
    for row in run["rows"]:
        if "measured_ms" in row and not row["model"].startswith("mnist") and row["precision"] == "fp32":
            largest[row["model"]] = max(largest.get(row["model"], row), row, key=lambda r: r["batch"])
    errors = [abs(predict(PredictRequest(model=row["model"], cluster=str(path), batch=row["batch"]))["step"]["step_ms"]
                  / row["measured_ms"] - 1) for row in largest.values()]
    assert len(errors) == 5 and statistics.median(errors) < 0.1, errors


@pytest.mark.parametrize("run", ["h100-2026-11-26/gpu_validation-profile.json", "h200-2026-11-27/second/gpu_validation.json"])
def test_the_catalogs_fp32_gemms_on_a_wide_issue_sm_run_at_the_rate_bench_measured_there(run):
    """On an SM whose schedulers each drive 32 FP32 lanes (Hopper here) a GEMM on the CUDA cores reaches about 0.75
    of the FP32 peak, not the whole of it as on Volta: the catalog's FP32 products on the H100 and the H200 (each
    priced by its tiles, from its datasheet) take what bench measured on the same GPU for the large shapes of its grid
    (within 3 % at the median, 15 % at worst; its small ones are launch-bound), and the A100 and V100, whose schedulers drive 16, keep
    ``cuda_gemm``'s rate."""
    import json
    import statistics

    data = json.loads((Path(__file__).resolve().parents[1] / "docs/gpu" / run).read_text())
    gpu = catalog.gpu(data["gpu"])
    gemm = machine.gpu_device(gpu).gemm
    large = [r for r in data["profile"]["compute"]["1"]["gemm"] if r["m"] * r["n"] * r["k"] >= 2**31 and r["n"] >= 256]
    ratios = [gemm.seconds(r["m"], r["n"], r["k"]) / r["seconds"] for r in large]
    assert len(ratios) >= 5 and all(0.85 < x < 1.1 for x in ratios) and 0.97 < statistics.median(ratios) < 1.03, ratios
    full = dataclasses.replace(machine.GPU_EFFICIENCY, wide_issue_gemm=1.0)
    assert machine.gpu_device(gpu, efficiency=full).gemm.flops_per_s > 1.3 * gemm.flops_per_s
    for narrow in ("A100 SXM4 80 GB", "V100 SXM2 16 GB"):
        assert machine.gpu_device(catalog.gpu(narrow), efficiency=full).gemm == machine.gpu_device(catalog.gpu(narrow)).gemm


def test_the_host_cost_of_an_operator_is_what_bench_times_a_layer_over_the_operators_it_dispatches():
    """OPS_PER_MEASURED_LAYER is the number of operators, views left out, that bench's per-layer fixed cost
    (measure.compute.layer_overhead_seconds: 20 Linear(4, 4), forward and backward of their sum) dispatches a
    layer, counted by the same trace that counts a model's."""
    import torch

    from gpurig.models.peak import trace_step
    from gpurig.perf.step import OPS_PER_MEASURED_LAYER

    with torch.device("meta"):
        stack = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(20)])
    traced = trace_step(stack, torch.empty(1, 4, device="meta"), loss_of=lambda out: out.sum())
    assert (traced["forward_ops"] + traced["backward_ops"]) / 20 == OPS_PER_MEASURED_LAYER


def test_a_gpu_step_of_many_small_operators_takes_at_least_its_hosts_launches():
    """Autocast's casts and a transformer's small operators are launched one by one by the host: in mixed
    precision BERT-base at a small batch is the host's on any GPU (an H100 ran it at 8 in bf16 in 22.9 ms, where
    its kernels alone were priced 16.9 ms), so a faster GPU does not make it faster; a large batch is the GPU's."""
    from gpurig.perf.step import OPS_PER_MEASURED_LAYER
    from gpurig.predict.configuration import step_operators

    def step_ms(gpu, batch):
        return predict(PredictRequest(model="bert-base", cluster=f"1 x {gpu}", batch=batch, tokens=128,
                                      precision="bf16"))["step"]

    forward_ops, backward_ops = step_operators(PredictRequest(model="bert-base", tokens=128, precision="bf16"))
    host_ms = 1e3 * (forward_ops + backward_ops) * machine.GpuEfficiency().layer_overhead_s / OPS_PER_MEASURED_LAYER
    h100, b200 = step_ms("H100 SXM", 8), step_ms("B200", 8)
    assert h100["forward_ms"] + h100["backward_ms"] == pytest.approx(host_ms, rel=1e-3)
    assert b200["forward_ms"] + b200["backward_ms"] == pytest.approx(host_ms, rel=1e-3)
    large = step_ms("H100 SXM", 256)
    assert large["forward_ms"] + large["backward_ms"] > 3 * host_ms   # the kernels' time, not the host's


def test_a_step_bound_by_its_hosts_launches_is_advised_what_launches_fewer():
    def result(batch):
        return predict(PredictRequest(model="bert-base", cluster="1 x H100 SXM", batch=batch, tokens=128,
                                      precision="bf16"))

    small, large = result(8), result(256)
    assert small["step"]["host_ms"] == pytest.approx(small["step"]["forward_ms"] + small["step"]["backward_ms"])
    assert "torch.compile or CUDA graphs" in [item["what"] for item in small["advice"]]
    assert large["step"]["host_ms"] == small["step"]["host_ms"]     # the same operators at any batch
    assert "torch.compile or CUDA graphs" not in [item["what"] for item in large["advice"]]


def test_a_board_short_of_power_computes_below_its_peaks_and_a_full_power_one_at_them():
    """The catalog's peaks are at the boost clock; a 150 W A10 (2.1 W per SM) cannot hold it under a training
    load, an H100 SXM (5.3 W per SM) can. The power term scales compute only, never memory, and a board below
    every fitted one is priced as the least of them, not by the power law followed past its data."""
    def rates(name, efficiency=machine.GPU_EFFICIENCY):
        device = machine.gpu_device(catalog.gpu(name), "fp16", efficiency)
        return device.gemm.flops_per_s, device.memory_bytes_per_s

    no_power = dataclasses.replace(machine.GPU_EFFICIENCY, power_exponent=0.0)
    (a10, a10_memory), (a10_full, a10_full_memory) = rates("A10"), rates("A10", no_power)
    assert 0.5 < a10 / a10_full < 0.8 and a10_memory == a10_full_memory
    assert rates("H100 SXM5 80 GB") == rates("H100 SXM5 80 GB", no_power)
    l4 = machine.GPU_EFFICIENCY.power_scale(catalog.gpu("L4"))    # 72 W for 58 SMs: below the A10's 2.08 W per SM
    assert l4 == pytest.approx(machine.GPU_EFFICIENCY.power_scale(catalog.gpu("A10")), rel=0.01)


def test_an_optimizer_run_one_tensor_at_a_time_pays_the_hosts_launches_and_a_fused_one_a_single_pass():
    """How torch.optim runs Adam decides its step on a GPU: fused, one pass over weights, gradients and states;
    foreach (PyTorch 2's default), a pass per operator; a loop over the tensors (foreach=False, PyTorch before
    2.0, hand-written optimizers such as NVIDIA's BertAdam), the host's launches for every tensor."""
    from gpurig.models import model_spec
    from gpurig.perf.optimizer import FOR_LOOP_HOST_SHARE, FUSED_PASSES, UNFUSED_PASSES

    def step(impl, optimizer="adam"):
        return predict(PredictRequest(model="bert-base", cluster="1 x A100 SXM4 80GB", batch=8, tokens=128,
                                      precision="bf16", optimizer=optimizer, optimizer_impl=impl))

    fused, foreach, loop = step("fused"), step("foreach"), step("for-loop")
    spec = model_spec("bert-base", batch=8, tokens=128)
    params = spec.trainable_parameters
    tensors = sum(len(layer.trainable_shapes) for layer in spec.layers)
    bandwidth = machine.gpu_device(catalog.gpu("A100 SXM4 80GB"), "bf16").memory_bytes_per_s
    assert fused["step"]["optimizer_ms"] == pytest.approx(1e3 * params * 4 * FUSED_PASSES["adam"] / bandwidth)
    assert foreach["step"]["optimizer_ms"] == pytest.approx(1e3 * params * 4 * UNFUSED_PASSES["adam"] / bandwidth)
    host_ms = 1e3 * tensors * FOR_LOOP_HOST_SHARE["adam"] * machine.GpuEfficiency().layer_overhead_s
    assert loop["step"]["optimizer_ms"] == pytest.approx(max(host_ms, foreach["step"]["optimizer_ms"]))
    assert loop["step"]["optimizer_ms"] > foreach["step"]["optimizer_ms"] > fused["step"]["optimizer_ms"]
    assert "--optimizer-impl fused" in [item["what"] for item in loop["advice"]]
    assert "--optimizer-impl fused" not in [item["what"] for item in fused["advice"]]
    # the working copy foreach Adam makes of every parameter at once is one tensor's in a loop, none fused (at a
    # batch this small the optimizer's step, not backward, is the peak)
    def working_gb(impl):
        return predict(PredictRequest(model="bert-base", cluster="1 x A100 SXM4 80GB", batch=1, tokens=16,
                                      optimizer="adam", optimizer_impl=impl))["memory"]["parts_gb"]["optimizer_working"]

    assert working_gb("fused") == 0 < working_gb("for-loop") < working_gb("foreach") == round(params * 4 / 2**30, 3)
    # AdamW: Adam's states and passes, and one more pass to decay the weights; by default as PyTorch 2 runs it
    adamw = step(None, "adamw")
    assert (adamw["optimizer"], adamw["optimizer_impl"]) == ("adamw", "foreach")
    assert adamw["step"]["optimizer_ms"] == pytest.approx(foreach["step"]["optimizer_ms"] * 20 / 18)
    assert adamw["memory"]["parts_gb"]["optimizer"] == foreach["memory"]["parts_gb"]["optimizer"]


def test_a_measured_profile_refuses_an_optimizer_implementation_for_an_optimizer_bench_timed(tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text('{"schema": "gpurig-profile/1", "device": "cpu", "compute": {"1": {"optimizers": '
                       '[{"optimizer": "momentum", "values": 262144, "seconds_per_value": 1e-9}]}}}')
    code, _, err = run_cli(["predict", "--model", "mnist-mlp", "--cluster", profile, "--optimizer-impl", "fused"])
    assert code == 2 and "--optimizer-impl fused: the profile prices momentum as bench timed it" in err
    assert len(err.strip().splitlines()) == 1


def test_an_unknown_optimizer_implementation_is_one_line_with_the_choices():
    code, out, err = run_cli(["predict", "--model", "bert-base", "--cluster", "1 x A100", "--optimizer-impl", "apex"])
    assert code == 2 and out == ""
    assert err.strip() == ("gpurig: error: unknown optimizer implementation 'apex'; "
                           "choose one of: fused, foreach, for-loop")


def test_a_step_whose_peak_is_the_optimizers_is_advised_a_fused_optimizer_when_it_does_not_fit():
    """BERT-large with Adam at a tiny batch on a 6 GB RTX 2060: the optimizer's step is the peak, and foreach
    Adam's working copy of every parameter (1.25 GiB) is what does not fit; a fused Adam makes none."""
    result = predict(PredictRequest(model="bert-large", cluster="1 x RTX 2060", batch=1, tokens=16, optimizer="adam"))
    assert not result["memory"]["fits"] and result["memory"]["parts_gb"]["optimizer_working"] > 1
    [fused] = [item for item in result["advice"] if item["what"] == "--optimizer-impl fused"]
    assert fused["fits"]
    again = predict(PredictRequest(model="bert-large", cluster="1 x RTX 2060", batch=1, tokens=16, optimizer="adam",
                                   optimizer_impl="fused"))
    assert again["memory"]["fits"] and f"{again['memory']['total_gb']:.1f} GiB" in fused["why"]


@pytest.mark.parametrize("model, usual", [("bert-large", "adamw"), ("gpt2", "adamw"), ("transformer-xl-base", "lamb"),
                                          ("resnet50", "momentum"), ("gpurig.models:cnn", "momentum")])
def test_without_optimizer_a_model_is_priced_with_the_one_it_is_usually_trained_with(model, usual):
    """No --optimizer: BERT and GPT-2 with AdamW (two states a parameter), CNNs and the user's own model with SGD
    and momentum (one); the same numbers as naming it, in predict and in choose."""
    args = ["--model", model, "--batch", "8", "--json"] + (["--sample", "784"] if ":" in model else [])
    code, out, _ = run_cli(["predict", *args, "--cluster", "1 x A100 SXM4 80GB"])
    named_code, named, _ = run_cli(["predict", *args, "--cluster", "1 x A100 SXM4 80GB", "--optimizer", usual])
    assert code == named_code == 0
    result, named = json.loads(out), json.loads(named)
    assert result["optimizer"] == usual and result["step"] == named["step"] and result["memory"] == named["memory"]
    states = {"momentum": 1, "adamw": 2, "lamb": 2}[usual]
    assert result["memory"]["parts_gb"]["optimizer"] == pytest.approx(
        states * 4 * result["trainable_parameters"] / 2**30, abs=1e-3)   # printed to the MB
    if ":" not in model:
        chosen = json.loads(run_cli(["choose", "--model", model, "--batch", "8", "--candidates", "A100 SXM4 80GB",
                                     "--gpus", "1", "--json"])[1])
        assert chosen["optimizer"] == usual


def test_a_profile_of_another_gpu_does_not_calibrate_the_clusters(tmp_path):
    """The H100's bench profile (docs/gpu) calibrates an H100 cluster, and is refused, in one line, for RTX 3090s:
    its measurements would have priced the 3090s 32 % faster than the catalog does."""
    stored = json.loads((BENCHMARKS.parent / "docs/gpu/h100-2026-11-26/gpu_validation-profile.json").read_text())["profile"]
    profile = tmp_path / "h100.json"
    profile.write_text(json.dumps(stored))
    code, out, err = run_cli(["predict", "--model", "resnet50", "--cluster", "4 x RTX 3090", "--profile", profile])
    assert code == 2 and out == "" and err.strip() == (
        f"gpurig: error: --profile {profile}: measured on NVIDIA H100 80GB HBM3, not the cluster's GeForce RTX 3090: "
        "a profile calibrates the GPU it measured (leave --profile out to price the catalog's)")
    code, out, _ = run_cli(["predict", "--model", "resnet50", "--cluster", "4 x H100 SXM5 80 GB", "--profile", profile,
                            "--json"])
    assert code == 0 and json.loads(out)["calibration"] == "catalog + profile"


def test_a_gpu_profile_as_the_cluster_says_whether_the_step_fits_its_gpu(tmp_path):
    """The H100's profile as --cluster: GPT-2 at 64 × 1024 needs more than its 80 GB, said as for a catalog GPU."""
    stored = json.loads((BENCHMARKS.parent / "docs/gpu/h100-2026-11-26/gpu_validation-profile.json").read_text())["profile"]
    profile = tmp_path / "h100.json"
    profile.write_text(json.dumps(stored))
    result = predict(PredictRequest(model="gpt2", cluster=str(profile)))
    assert result["memory"]["gpu_gb"] == 80 and result["memory"]["fits"] is False
    assert result["memory"]["largest_batch"] < 64 and result["hardware"].startswith("NVIDIA H100 80GB HBM3")
