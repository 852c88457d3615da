"""Model descriptions: presets match their published parameters and FLOPs, layers and GEMMs are right, no memory is used."""

import functools
import json
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from gpurig.errors import UsageError
from gpurig.models.describe import KINDS, ModelSpec, describe, on_meta
from gpurig.models.ops import Gemm
from gpurig.models import PRESETS, model_spec, preset
from gpurig.models.factory import load_factory, parse_sample
from gpurig.perf.step import layer_costs
from gpurig.models.text import GPT2

MLP_FORWARD = 2 * (784 * 1200 + 1200 * 1200 + 1200 * 10)


@functools.cache
def spec_of(name: str, batch: int = 1, tokens: int | None = None) -> ModelSpec:
    return model_spec(name, max(batch, PRESETS[name].min_batch), tokens=tokens)


def test_a_batch_too_small_to_train_is_refused_in_one_line():
    with pytest.raises(UsageError, match=r"^ssd300 trains with a batch of at least 2 per GPU \(batch norm"):
        model_spec("ssd300", batch=1)


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameters_are_the_published_counts(name):
    spec = spec_of(name)
    # gpurig's own nets, counted by hand; SSD300's count is not published (NVIDIA gives none)
    unpublished = {"mnist-cnn": 317_066, "mnist-wide-cnn": 4_291_466, "ssd300": 22_894_902}
    assert spec.parameters == (PRESETS[name].published_parameters or unpublished[name])
    assert spec.parameters == sum(p.numel() for p in preset(name).build().parameters())   # each tensor once
    assert spec.parameter_bytes == 4 * spec.parameters and spec.dtype == "float32"


# torchvision's table gives multiply-adds to 3-4 significant digits (its "GFLOPS" column counts a
# multiply-add as one); gpurig counts 2 FLOPs per multiply-add, so the published value is doubled.
@pytest.mark.parametrize("name,gmacs", [("alexnet", 0.714), ("vgg16", 15.47), ("resnet50", 4.089),
                                        ("resnet152", 11.514)])
def test_cnn_flops_match_torchvision_within_rounding(name, gmacs):
    assert spec_of(name).forward_flops_per_sample == pytest.approx(2 * gmacs * 1e9, rel=1e-3)
    assert PRESETS[name].published_gflops == pytest.approx(2 * gmacs)


def transformer_reference(parameters: int, embedding_parameters: int, layers: int, width: int, tokens: int) -> float:
    """Forward FLOPs of one sequence, 2·N·T + 4·L·d·T² with N = parameters outside the embedding tables.

    PaLM (Chowdhery et al. 2022, appendix B) and nanoGPT's ``estimate_mfu`` count
    6·N + 12·L·H·Q·T FLOPs per token for forward + backward; the forward pass is a third.
    """
    return 2 * (parameters - embedding_parameters) * tokens + 4 * layers * width * tokens ** 2


@pytest.mark.parametrize("name,embeddings,layers,width,tokens", [
    # word + position + segment tables (and BERT's embedding LayerNorm, which multiplies nothing)
    ("bert-base", 30522 * 768 + 512 * 768 + 2 * 768 + 2 * 768, 12, 768, 128),
    ("bert-large", 30522 * 1024 + 512 * 1024 + 2 * 1024 + 2 * 1024, 24, 1024, 128),
    # nanoGPT leaves out only the position table: the tied token table is the output layer's weights
    ("gpt2", 1024 * 768, 12, 768, 1024),
])
def test_transformer_flops_match_the_published_formula_within_one_percent(name, embeddings, layers, width, tokens):
    reference = transformer_reference(PRESETS[name].published_parameters, embeddings, layers, width, tokens)
    assert PRESETS[name].published_gflops == pytest.approx(reference / 1e9, abs=0.005)
    # The formula charges biases and LayerNorm weights as multiply-adds, and BERT's pooler at every
    # token; gpurig runs the pooler on the [CLS] token only.
    assert spec_of(name).forward_flops_per_sample == pytest.approx(reference, rel=0.01)


def test_attention_is_counted_at_full_length_and_scales_with_tokens_squared():
    short, long = spec_of("bert-base", tokens=64), spec_of("bert-base", tokens=128)
    attention = [layer for layer in long.layers if layer.kind == "attention-matmul"]
    assert len(attention) == 12
    assert sum(layer.forward_flops for layer in attention) == 4 * 12 * 768 * 128 ** 2
    short_attention = sum(layer.forward_flops for layer in short.layers if layer.kind == "attention-matmul")
    assert short_attention * 4 == sum(layer.forward_flops for layer in attention)


def test_mnist_mlp_exact_numbers():
    spec = spec_of("mnist-mlp", batch=128)
    assert spec.parameters == 2_395_210
    assert spec.forward_flops_per_sample == MLP_FORWARD == 4_785_600
    # The first layer's input is data: only its weight gradient is computed.
    assert spec.backward_flops == 128 * 2 * (784 * 1200 + 2 * (1200 * 1200 + 1200 * 10))
    linears = [layer for layer in spec.layers if layer.kind == "linear"]
    assert [layer.name for layer in linears] == ["1", "3", "5"]
    assert [layer.gemms for layer in linears] == [(Gemm(128, 1200, 784),), (Gemm(128, 1200, 1200),),
                                                  (Gemm(128, 10, 1200),)]
    assert linears[0].parameter_shapes == (("1.weight", (1200, 784)), ("1.bias", (1200,)))
    assert (linears[0].input_elements, linears[0].output_elements) == (128 * 784, 128 * 1200)
    relu = spec.layer("2")
    assert relu.kind == "activation" and relu.forward_bytes == 2 * 128 * 1200 * 4 and relu.forward_flops == 0


def test_gemm_shape_of_a_linear_layer_on_tokens():
    spec = describe(nn.Sequential(nn.Linear(768, 3072)), torch.zeros(1, 128, 768), batch=8)
    assert spec.layer("0").gemms == (Gemm(m=8 * 128, n=3072, k=768),)
    assert spec.forward_flops == 2 * 8 * 128 * 3072 * 768


def test_gemm_shape_of_convolutions_as_implicit_gemm():
    spec = describe(nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.Conv2d(64, 64, 3, padding=1, groups=4)),
                    (3, 224, 224), batch=4)
    # M = batch·H_out·W_out, N = out_channels / groups, K = in_channels / groups · kh · kw; and the kernel and stride
    assert spec.layer("0").gemms == (Gemm(m=4 * 112 * 112, n=64, k=3 * 7 * 7, kernel=(7, 7), stride=(2, 2)),)
    assert spec.layer("1").gemms == (Gemm(m=4 * 112 * 112, n=16, k=16 * 3 * 3, count=4, kernel=(3, 3), stride=(1, 1)),)
    assert spec.layer("1").output_elements == 4 * 64 * 112 * 112


def test_only_dense_3x3_stride_1_convolutions_may_run_winograd():
    model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1, groups=4),
                          nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 3, stride=2, padding=1),
                          nn.Conv2d(8, 8, 3, padding=2, dilation=2))
    spec = describe(model, (8, 16, 16), batch=2)
    assert spec.layer("4").gemms[0].kernel == (5, 5)      # a dilated 3×3 spans 5×5
    assert [layer.winograd for layer in layer_costs(spec)] == [True, False, False, False, False]
    assert ModelSpec.from_json(spec.to_json()) == spec


def test_attention_layer_runs_two_batched_gemms():
    core = spec_of("bert-base", batch=2).layer("layers.0.attention.core")
    assert core.kind == "attention-matmul" and core.parameters == 0
    assert core.gemms == (Gemm(128, 128, 64, count=2 * 12), Gemm(128, 64, 128, count=2 * 12))
    assert core.input_elements == 3 * 2 * 128 * 768 and core.output_elements == 2 * 128 * 768
    assert core.forward_bytes == 4 * 4 * 2 * 128 * 768   # Q, K, V read and the output written, fused


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_layer_adds_up(name):
    spec = spec_of(name)
    assert {layer.kind for layer in spec.layers} <= set(KINDS)
    for layer in spec.layers:
        assert layer.forward_flops == sum(g.flops for g in layer.gemms), layer.name
        assert layer.parameters == sum(torch.Size(shape).numel() for _, shape in layer.parameter_shapes)
        assert layer.calls >= 1, layer.name
    names = [n for layer in spec.layers for n, _ in layer.parameter_shapes]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name,tokens", [("alexnet", None), ("resnet50", None), ("bert-base", 32), ("gpt2", 64)])
def test_totals_agree_with_flop_counter_mode_forward_and_backward(name, tokens):
    """FlopCounterMode, counting a real backward pass on the meta device, confirms the backward convention."""
    spec = spec_of(name, 2, tokens)
    model, x = preset(name).build(), torch.empty((2, *spec.sample), dtype=getattr(torch, spec.input_dtype),
                                                 device="meta")
    with torch.device("meta"), FlopCounterMode(display=False) as counter:
        out = model(x)
        forward = counter.get_total_flops()
        sum(o.sum() for o in (out if isinstance(out, tuple) else (out,))).backward()
    assert spec.forward_flops == forward
    assert spec.backward_flops == counter.get_total_flops() - forward


def test_kinds_of_layers():
    resnet = {layer.kind for layer in spec_of("resnet50").layers}
    bert = {layer.kind for layer in spec_of("bert-base").layers}
    assert resnet == {"conv", "norm", "linear", "pool", "activation", "other"}
    assert bert == {"embedding", "norm", "linear", "attention-matmul", "activation", "other"}
    assert spec_of("resnet50").layer("maxpool").kind == "pool" and spec_of("resnet50").layer("relu").kind == "activation"
    assert spec_of("resnet50").layer("layer1.0").module == "Bottleneck"   # the residual add, its own work


def test_layers_are_in_forward_order_not_registration_order():
    class Backwards(nn.Module):
        def __init__(self):
            super().__init__()
            self.last, self.first = nn.Linear(16, 2), nn.Linear(4, 16)

        def forward(self, x):
            return self.last(torch.relu(self.first(x)))

    spec = describe(Backwards(), (4,))
    assert [layer.name for layer in spec.layers] == ["first", "(model)", "last"]
    assert spec.layer("(model)").kind == "other"      # torch.relu called in the container's own forward


def test_tied_weights_are_owned_by_the_first_layer_that_uses_them():
    spec = spec_of("gpt2")
    assert spec.layers[0].name == "embeddings.word" and spec.layers[0].parameters == 50257 * 768
    head = spec.layer("lm_head")
    assert head.parameters == 0 and head.gemms == (Gemm(1024, 50257, 768),)


def test_describe_leaves_a_real_model_untouched():
    model = GPT2(width=32, layers=2, heads=2, vocab=50, context=16).eval()
    before = model.lm_head.weight.clone()
    spec = describe(model, torch.zeros(1, 16, dtype=torch.long), batch=4)
    assert spec.parameters == sum(p.numel() for p in model.parameters())
    assert model.lm_head.weight.device.type == "cpu" and torch.equal(model.lm_head.weight, before)
    assert model.lm_head.weight is model.embeddings.word.weight and not model.training


def test_describing_bert_large_allocates_no_real_memory():
    """1.34 GB of fp32 weights and a batch of 32 activations: RSS must not notice."""
    code = ("import resource; from gpurig.models import model_spec; model_spec('bert-base', 2)\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "spec = model_spec('bert-large', 32)\n"
            "print(spec.parameter_bytes, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    weight_bytes, peak_growth_kib = map(int, done.stdout.split())
    assert weight_bytes > 1.3e9
    assert peak_growth_kib < 20 * 1024


def test_json_round_trip_and_refusal():
    spec = spec_of("gpt2", batch=2)
    text = spec.to_json()
    assert ModelSpec.from_json(text) == spec
    data = json.loads(text)
    assert data["totals"]["parameters"] == 124_439_808 and data["layers"][1]["gemms"] == []
    with pytest.raises(UsageError, match="not a gpurig model description") as refused:
        ModelSpec.from_json(json.dumps({**data, "layers": [{"name": "x"}]}), "cache.json")
    assert "\n" not in str(refused.value)
    with pytest.raises(UsageError, match="schema"):
        ModelSpec.from_json("{}")


@pytest.mark.parametrize("query,name", [
    ("resnet50", "resnet50"), ("resnet-50", "resnet50"), ("ResNet-50", "resnet50"), ("ResNet 152", "resnet152"),
    ("bert-base", "bert-base"), ("BERT base", "bert-base"), ("bert-large-uncased", "bert-large"),
    ("gpt2", "gpt2"), ("GPT-2", "gpt2"), ("gpt2-124m", "gpt2"), ("GPT-2 124M", "gpt2"), ("VGG-16", "vgg16"),
    ("AlexNet", "alexnet"), ("mnist-mlp", "mnist-mlp"), ("mlp", "mnist-mlp"), ("cnn", "mnist-cnn")])
def test_loose_preset_lookup(query, name):
    assert preset(query).name == name


def test_every_preset_name_and_alias_finds_its_own_preset():
    for p in PRESETS.values():
        for alias in [p.name, *filter(None, p.aliases.split(";"))]:
            assert preset(alias) is p


@pytest.mark.parametrize("query,closest", [("resnet101", "resnext101, se-resnext101, resnet50"), ("vgg19", "vgg16"),
                                           ("gpt3", "gpt2"), ("bert-huge", "bert-")])
def test_unknown_preset_names_the_closest_in_one_line(query, closest):
    with pytest.raises(UsageError, match=f"unknown model '{query}'; closest: {closest}") as refused:
        preset(query)
    assert "\n" not in str(refused.value)


def test_token_lengths_and_inputs_are_checked():
    assert model_spec("gpt2", tokens=128).sample == (128,)
    for call, message in [(lambda: model_spec("bert-base", tokens=513), "1 to 512 tokens"),
                          (lambda: model_spec("resnet50", tokens=128), "not tokens"),
                          (lambda: model_spec("resnet50", sample="3x32x32"), "only for module:factory"),
                          (lambda: model_spec("gpurig.models:mlp"), "give the input of one sample"),
                          # a factory that is not there is the mistake to say first, before the missing input
                          (lambda: model_spec("gpurig.models:nope"), "has no attribute 'nope'"),
                          (lambda: model_spec("no_such_module_x:build"), "cannot import 'no_such_module_x'"),
                          (lambda: describe(nn.Linear(2, 2), (2,), batch=0), "batch must be"),
                          (lambda: describe(nn.Linear(2, 2), (2, -1)), "positive whole numbers")]:
        with pytest.raises(UsageError, match=message) as refused:
            call()
        assert "\n" not in str(refused.value)


def test_a_factory_model_on_the_meta_device_and_from_a_file(tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text("import torch\n"
                                          "def wide():\n    return torch.nn.Linear(1000, 1000)\n")
    monkeypatch.chdir(tmp_path)
    assert load_factory("mymodels:wide").weight.device.type == "meta"   # built without memory
    spec = model_spec("mymodels.py:wide", batch=4, sample="1000")
    assert spec.parameters == 1_001_000 and spec.layer("(model)").gemms == (Gemm(4, 1000, 1000),)


def test_a_factory_that_places_its_model_on_a_gpu_is_described_where_there_is_none(tmp_path, monkeypatch):
    """Planning happens where no GPU is: ``.cuda()``, ``device="cuda"``, ``.to("cuda:1")`` and loaded weights all
    land on the meta device, shapes intact."""
    (tmp_path / "placed.py").write_text(
        "import torch\nfrom torch import nn\n"
        "def cuda():\n    return nn.Sequential(nn.Linear(8, 16).cuda(), nn.Linear(16, 4, device='cuda'))\n"
        "def moved():\n    return nn.Linear(8, 4).to('cuda:1', torch.float32)\n"
        "def loaded():\n    m = nn.Linear(8, 4, device='cpu')\n"
        "    m.load_state_dict({'weight': torch.zeros(4, 8), 'bias': torch.zeros(4)})\n    return m\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "placed", raising=False)
    for name, parameters in (("cuda", 8 * 16 + 16 + 16 * 4 + 4), ("moved", 36), ("loaded", 36)):
        model = load_factory(f"placed:{name}")
        assert all(p.device.type == "meta" for p in model.parameters()), name
        assert model_spec(f"placed:{name}", batch=4, sample="8").parameters == parameters


def test_a_forward_that_places_tensors_on_a_gpu_is_described_where_there_is_none(tmp_path, monkeypatch):
    """The factory's placements were redirected, its forward's were not ("Torch not compiled with CUDA enabled: is
    that the input it takes?"). ``.to(other)`` keeps taking the other tensor's dtype."""
    (tmp_path / "onthegpu.py").write_text(
        "import torch\nfrom torch import nn\n"
        "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.l = nn.Linear(8, 8)\n"
        "    def forward(self, x):\n        x = self.l(x.cuda()) + torch.ones(8, device='cuda')\n"
        "        return x.to(torch.zeros(1, dtype=torch.float64)).float()\n"
        "def build():\n    return Net()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "onthegpu", raising=False)
    spec = model_spec("onthegpu:build", batch=4, sample="8")
    assert spec.parameters == 72 and spec.layer("l").gemms == (Gemm(4, 8, 8),)


@pytest.mark.parametrize("source,target,message", [
    ("", "mymodels", "expected module:factory"),
    ("", "mymodels:", "expected module:factory"),
    ("", "no_such_module_xyz:build", "cannot import 'no_such_module_xyz': ModuleNotFoundError"),
    ("import nonexistent_dependency_xyz\n", "mymodels:build", "cannot import 'mymodels': ModuleNotFoundError"),
    ("raise RuntimeError('broken\\nat import')\n", "mymodels:build", "cannot import 'mymodels': RuntimeError: broken$"),
    ("def build():\n    pass\n", "mymodels:biuld", "has no attribute 'biuld' \\(closest: build\\)"),
    ("build = 3\n", "mymodels:build", "is a int, not a function"),
    ("def build():\n    return 'a model'\n", "mymodels:build", "returned a str, not a torch.nn.Module"),
    ("def build():\n    raise ValueError('depth must be 50\\nor 101')\n", "mymodels:build",
     "the factory raised ValueError: depth must be 50$"),
    ("", "missing.py:build", "no file missing.py"),
    ("import sys\ndef build():\n    sys.exit(3)\n", "mymodels:build", "the factory called sys.exit\\(3\\)$"),
    # a training script that parses its command line on import: gpurig ended silently, exit 0
    ("import sys\nsys.exit(0)\n", "mymodels:build", "importing 'mymodels' called sys.exit\\(0\\) \\(a script"),
])
def test_factory_failures_are_one_line(tmp_path, monkeypatch, source, target, message):
    (tmp_path / "mymodels.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)
    with pytest.raises(UsageError, match=message) as refused:
        load_factory(target)
    assert "\n" not in str(refused.value)


def test_a_forward_pass_that_reads_values_is_refused_in_one_line():
    class ReadsValues(nn.Module):
        def forward(self, x):
            return x * x.sum().item()

    with pytest.raises(UsageError, match="forward pass fails on the meta device") as refused:
        describe(ReadsValues(), (4,))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("text,message", [("3x224x", "expected sizes"), ("0x3", "expected sizes"),
                                          ("128:int8", "unknown type 'int8'")])
def test_bad_input_shapes_are_one_line(text, message):
    with pytest.raises(UsageError, match=message):
        parse_sample(text)


def test_attention_called_with_keywords_and_a_mask():
    class Attention(nn.Module):
        def forward(self, x):
            mask = torch.ones(x.shape[-2], x.shape[-2], dtype=torch.bool)
            return nn.functional.scaled_dot_product_attention(query=x, key=x, value=x, attn_mask=mask)

    layer = describe(Attention(), (2, 16, 8), batch=3).layer("(model)")
    assert layer.gemms == (Gemm(16, 16, 8, count=6), Gemm(16, 8, 16, count=6))
    assert layer.forward_bytes == 4 * 4 * 3 * 2 * 16 * 8 + 16 * 16   # Q, K, V, output and the boolean mask


def test_transformer_xl_relative_shift_moves_each_row_by_its_distance_to_the_last():
    from gpurig.models.transformer_xl import _shift

    rows, cols = 3, 6
    scores = torch.arange(rows * cols, dtype=torch.float32).view(rows, cols, 1, 1)
    shifted = _shift(scores)
    for i in range(rows):
        lag = rows - 1 - i
        assert torch.equal(shifted[i, : cols - lag, 0, 0], scores[i, lag:, 0, 0])


def test_saved_activations_are_what_autograd_keeps_on_a_real_run():
    from gpurig.models.trace import SavedActivations

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.LayerNorm(16), nn.Linear(16, 4))
    x = torch.randn(32, 8)
    with SavedActivations(model) as on_cpu:
        out = model(x)            # counted at the end of forward, before backward frees them
    out.sum().backward()
    spec = describe(model, (8,), batch=32)
    assert spec.saved_bytes == on_cpu.total_bytes > 0 and spec.largest_saved_bytes == on_cpu.largest_bytes


def test_fused_attention_keeps_activations_linear_in_tokens_not_quadratic():
    short, long = (model_spec("bert-base", batch=4, tokens=t).saved_bytes for t in (128, 512))
    assert long / short == pytest.approx(4, rel=0.02)


def test_the_saved_activations_count_the_same_every_time_a_model_is_described():
    # keyed by storage address alone, a tensor autograd had let go of could share its address with a later one:
    # bert-base's count moved by a tensor from one description to the next
    from gpurig import models

    counts = set()
    for _ in range(4):
        models._preset_spec.cache_clear()
        counts.add(models.model_spec("bert-base", 8, tokens=128).saved_bytes)
    assert len(counts) == 1


class _Residual(nn.Module):
    """Token embeddings, then three products of one input (as Q, K, V) and a GELU MLP on a residual stream: only
    operators on which autocast's CPU and CUDA lists agree (products in 16 bits, the rest in their inputs' type)."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(100, width)
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.fc, self.proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, ids):
        x = self.embed(ids)
        x = x + self.q(x) * self.k(x) + self.v(x)       # a 16-bit branch added to the FP32 stream: FP32
        return x + self.proj(F.gelu(self.fc(x)))


def test_the_mixed_precision_trace_saves_what_torch_autocast_saves():
    """The meta trace under MetaAutocast against a real CPU forward under torch.autocast: the same bytes saved,
    once each input's 16-bit copy per product (autocast caches weights' casts only) and the FP32 residual stream;
    the weights' casts are the step's 16-bit weight copies, counted apart."""
    from gpurig.models.autocast import MetaAutocast
    from gpurig.models.trace import SavedActivations

    torch.manual_seed(0)
    model, ids = _Residual(), torch.randint(0, 100, (8, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16), SavedActivations(model) as real:
        out = model(ids)
    weight_casts = sum(p.numel() * 2 for p in model.parameters() if p.dim() == 2 and p.shape[0] != 100)
    with torch.device("meta"):
        meta_model, amp = on_meta(model), MetaAutocast(torch.bfloat16)
        with SavedActivations(meta_model, amp.weight_casts) as traced, amp:
            meta_out = meta_model(ids.to("meta"))
    assert meta_out.dtype == out.dtype == torch.float32
    assert traced.total_bytes + weight_casts == real.total_bytes
    spec = describe(model, ids[:1], batch=8, mixed_precision=True)
    assert spec.mixed_saved_bytes == traced.total_bytes
    assert 0.5 < spec.mixed_saved_bytes / spec.saved_bytes < 0.75      # neither half nor all of the FP32 bytes


def test_each_operators_backward_moves_what_its_kernels_move():
    # the input needs a gradient (as after an earlier layer), so every operator here runs its full backward
    model = nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), nn.LayerNorm(6), nn.Softmax(dim=-1))
    layers = {layer.module: layer for layer in describe(model, torch.zeros(1, 8, 6, 6, requires_grad=True),
                                                         batch=4).layers}
    tensor = 4 * 8 * 6 * 6 * 4       # one activation, bytes
    norm, relu, layer_norm, softmax = (layers[m] for m in ("BatchNorm2d", "ReLU", "LayerNorm", "Softmax"))
    # batch norm: its statistics read the input, the transform reads it again and writes the output; backward
    # reduces the gradient and the input per channel, then reads both again to write the input's gradient
    assert 3 * tensor <= norm.forward_bytes < 3 * tensor + 1024
    assert norm.backward_bytes == pytest.approx(5 / 3 * norm.forward_bytes, rel=0.01)   # (and its step count)
    # a pointwise function and softmax: backward reads the gradient and one saved tensor, writes one
    assert relu.forward_bytes == 2 * tensor and relu.backward_bytes == 3 * tensor
    assert softmax.forward_bytes == 2 * tensor and softmax.backward_bytes == 3 * tensor
    # layer norm: the input's gradient (3 passes), then the weight's and bias's reductions (2)
    assert layer_norm.backward_bytes == pytest.approx(2.5 * layer_norm.forward_bytes, abs=1)


def test_every_preset_names_an_optimizer_predict_prices_and_says_where_it_comes_from():
    from gpurig.models import OPTIMIZER_SOURCES, PRESETS
    from gpurig.perf.optimizer import FUSED_PASSES

    assert {p.optimizer for p in PRESETS.values()} == set(OPTIMIZER_SOURCES) <= set(FUSED_PASSES)


def test_an_rnn_is_launched_as_cudnn_runs_it_not_unrolled(tmp_path, monkeypatch):
    """On the meta device ``nn.LSTM`` unrolls into a dozen operators a time step; on CUDA it is one cuDNN call a
    module (two in backward). Counted unrolled, a 2-layer LSTM over 64 tokens was 105 ms of host launches on an
    H100 (predict called it host-bound); counted as cuDNN, its launches no longer grow with the sequence."""
    from gpurig.models import step_operators

    (tmp_path / "rnns.py").write_text(
        "from torch import nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, kind):\n"
        "        super().__init__()\n"
        "        self.emb, self.rnn = nn.Embedding(1000, 32), kind(32, 64, num_layers=2, batch_first=True)\n"
        "        self.out = nn.Linear(64, 1000)\n"
        "    def forward(self, x):\n"
        "        return self.out(self.rnn(self.emb(x))[0])\n"
        "def lstm():\n    return Net(nn.LSTM)\n"
        "def gru():\n    return Net(nn.GRU)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "rnns", raising=False)
    for name in ("rnns:lstm", "rnns:gru"):
        short, long = step_operators(name, sample="8:int64"), step_operators(name, sample="256:int64")
        assert short == long and sum(long) < 40, (name, short, long)


def test_a_factory_runs_once_and_its_prints_stay_out_of_json(tmp_path, monkeypatch):
    """predict called the factory 12-14 times (a slow or printing factory paid each time), and the model's prints
    went to stdout, in front of --json's output."""
    from conftest import run_cli

    (tmp_path / "chatty.py").write_text("import torch\nprint('loading')\nCALLS = []\n"
                                        "def build():\n    CALLS.append(1)\n    print('building')\n"
                                        "    return torch.nn.Linear(64, 8)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "chatty", raising=False)
    for verb in ("predict", "choose"):
        code, out, err = run_cli([verb, "--model", "chatty:build", "--sample", "64", "--json",
                                  *(["--cluster", "2 nodes x 8 A100, 100 Gbit/s InfiniBand"] if verb == "predict" else [])])
        assert code == 0 and json.loads(out) and ("building" in err) == (verb == "predict"), err[-500:]
    assert sys.modules["chatty"].CALLS == [1]


def test_the_largest_batch_does_not_depend_on_the_batch_asked_about():
    """At a small batch the traced peak is backward's end (every gradient held), which does not grow with the
    batch: its slope said an MLP's largest batch on an A100 was 1.9 M, at 3.4x what fits (574 K)."""
    from gpurig.predict import predict
    from gpurig.predict.request import PredictRequest

    def memory(batch):
        return predict(PredictRequest(model="gpurig.models:mlp", sample="784", cluster="1 x A100", batch=batch))["memory"]

    small, large = memory(8)["largest_batch"], memory(4096)["largest_batch"]
    assert abs(small - large) <= 0.02 * large
    at_largest = memory(small)
    assert at_largest["fits"] and at_largest["total_gb"] > 0.95 * memory(8)["usable_gb"]


def test_a_convnets_largest_batch_is_the_same_asked_at_8_or_at_128():
    """A QA sweep found ResNet-50 on an RTX 3090 given 282 asked at batch 8 and 273 from 64 up: the peak's growth
    traced at 8 to 16 was 3 % under its growth near the answer. The largest batch is traced again there."""
    from gpurig.predict import predict
    from gpurig.predict.request import PredictRequest

    def largest(batch):
        return predict(PredictRequest(model="resnet50", cluster="1 x RTX 3090", batch=batch))["memory"]["largest_batch"]

    assert largest(8) == largest(128)


def test_buffers_take_memory_beside_the_weights(tmp_path, monkeypatch):
    """A model's buffers (a causal mask, a rotary table, BatchNorm's statistics) were left out: a 16 GB table
    "fit" in 0.0 GiB."""
    from gpurig.predict import predict
    from gpurig.predict.request import PredictRequest

    (tmp_path / "tables.py").write_text(
        "import torch\nfrom torch import nn\n"
        "class Net(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
        "        self.l = nn.Linear(256, 256)\n        self.register_buffer('table', torch.zeros(n))\n"
        "    def forward(self, x):\n        return self.l(x)\n"
        "def small():\n    return Net(1)\ndef big():\n    return Net(2**30)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "tables", raising=False)

    def parts(name):
        return predict(PredictRequest(model=f"tables:{name}", sample="256", cluster="1 x A100", batch=8))["memory"]

    assert model_spec("tables:big", batch=8, sample="256").buffer_bytes == 4 * 2**30
    small, big = parts("small"), parts("big")
    assert big["parts_gb"]["buffers"] == 4.0 and big["total_gb"] - small["total_gb"] == pytest.approx(4.0, abs=0.01)


def test_weights_stored_in_16_bits_are_said_to_be_priced_as_the_precision_trains(tmp_path, monkeypatch):
    """A model built in bf16 was priced as FP32 without a word (half its weights' bytes, none of their speed)."""
    from gpurig.predict import predict
    from gpurig.predict.request import PredictRequest

    (tmp_path / "halves.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(64, 64).to(torch.bfloat16)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "halves", raising=False)
    note = predict(PredictRequest(model="halves:build", sample="64:bfloat16", cluster="1 x A100"))["precision_note"]
    assert "weights are stored in bfloat16: priced as --precision fp32 trains" in note


def test_a_module_in_the_current_directory_comes_first_even_where_gpurig_imported_the_same_name(tmp_path, monkeypatch):
    """A user's json.py: `json:build` found the standard library's json, which gpurig had already imported."""
    (tmp_path / "json.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(8, 3)\n")
    monkeypatch.chdir(tmp_path)
    assert model_spec("json:build", batch=2, sample="8").parameters == 27
    assert json.dumps({}) == "{}"   # the standard library's json is untouched
