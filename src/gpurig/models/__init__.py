"""Every model gpurig knows by name — the reference networks ``gpurig train`` trains and the presets
``gpurig predict`` prices — and the one way to describe any model.

One registry, :data:`PRESETS`: the source's MNIST networks (:mod:`~gpurig.models.reference`:
``mlp``, ``cnn``, ``wide-cnn``, which ``gpurig train`` trains), the vision models
(:mod:`~gpurig.models.vision`) and the transformers (:mod:`~gpurig.models.text`).
Any model, preset or ``module:factory`` (:mod:`~gpurig.models.factory`), is
described layer by layer on the meta device by :mod:`~gpurig.models.describe`.

Each :class:`Preset` is a plain torch module factory with its default input and
the published numbers it is checked against (tests/test_model_spec.py,
docs/predict.md). Names are found loosely — case, dashes and spaces do not
matter, so ``resnet50``, ``resnet-50`` and ``ResNet-50`` are one model — and an
unknown name is refused in one line with the closest ones.

>>> preset("ResNet-50").name, preset("gpt2-124m").name, preset("mlp").name
('resnet50', 'gpt2', 'mnist-mlp')
>>> model_spec("resnet50").forward_flops_per_sample / 1e9
8.178...
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from gpurig.errors import UsageError
from gpurig.models import text, transformer_xl, vision
from gpurig.models.describe import ModelSpec, describe, example_input, on_meta
from gpurig.models.factory import find_function, load_factory, parse_sample, sample_batch
from gpurig.models.peak import step_peaks
from gpurig.models.reference import cnn, mlp, wide_cnn
from gpurig.spec.catalog import Lookup
from gpurig.spec.fields import SpecError

IMAGE = (3, 224, 224)
TORCHVISION = "torchvision's model table (weights meta num_params, _ops in GMACs)"
TRANSFORMER_FLOPS = ("2·N·T + 4·L·d·T² per sequence, N = parameters without the embedding tables "
                     "(PaLM appendix B, nanoGPT estimate_mfu)")
TRANSFORMER_XL = ("NVIDIA DeepLearningExamples' PyTorch Transformer-XL on WikiText-103, full softmax as Lambda runs it; "
                  "parameters: n_all_param in Lambda's logs")


@dataclass(frozen=True)
class Preset:
    """A built-in model: its factory, default input, and published parameters and forward GFLOPs per sample.

    ``sample`` is one sample's input shape; for token models (``tokens`` set)
    it is the default sequence length, which may be changed up to
    ``max_tokens``. ``published_gflops`` counts 2 FLOPs per multiply-add.
    """

    name: str
    factory: Callable[[], nn.Module]
    sample: tuple[int, ...]
    describes: str
    published_parameters: int | None
    published_gflops: float | None
    source: str
    aliases: str = ""
    tokens: bool = False
    max_tokens: int | None = None
    min_batch: int = 1     # batch norm over 1×1 maps needs two samples to train (SSD300's last block)
    optimizer: str = "momentum"  # what its source trains it with: predict's default --optimizer (OPTIMIZER_SOURCES)

    def build(self) -> nn.Module:
        """The model on the meta device: shapes only, no memory.

        >>> preset("vgg16").build().features[0].weight.device
        device(type='meta')
        """
        with torch.device("meta"):
            return self.factory()

    def example(self, tokens: int | None = None) -> torch.Tensor:
        """One sample as a meta tensor with a batch dimension of 1: an image, a flat MNIST digit, or token ids.

        >>> preset("bert-base").example(tokens=64).shape, preset("alexnet").example().dtype
        (torch.Size([1, 64]), torch.float32)
        """
        if tokens is None:
            return torch.empty((1, *self.sample), device="meta", dtype=torch.int64 if self.tokens else torch.float32)
        if not self.tokens:
            raise UsageError(f"{self.name} takes {self.describes}, not tokens: leave out the sequence length")
        if not 1 <= tokens <= self.max_tokens:
            raise UsageError(f"{self.name} takes 1 to {self.max_tokens} tokens, got {tokens}")
        return torch.empty((1, tokens), device="meta", dtype=torch.int64)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("mnist-mlp", mlp, (784,), "one 28×28 MNIST digit, flattened to 784 values", 2_395_210,
           2 * (784 * 1200 + 1200 * 1200 + 1200 * 10) / 1e9,
           "the source's 784-1200-1200-10 network; FLOPs by hand", aliases="mlp;mnist"),
    Preset("mnist-cnn", cnn, (784,), "one 28×28 MNIST digit, flattened to 784 values", None, None,
           "gpurig's reference CNN (gpurig.models.cnn); no published count", aliases="cnn;lenet"),
    Preset("mnist-wide-cnn", wide_cnn, (784,), "one 28×28 MNIST digit, flattened to 784 values", None, None,
           "gpurig's reference CNN with a 4096-unit dense layer (gpurig.models.wide_cnn)", aliases="wide-cnn"),
    Preset("alexnet", vision.alexnet, IMAGE, "one 3×224×224 image", 61_100_840, 2 * 0.714, TORCHVISION),
    Preset("vgg16", vision.vgg16, IMAGE, "one 3×224×224 image", 138_357_544, 2 * 15.47, TORCHVISION,
           aliases="vgg;vgg-d"),
    Preset("resnet50", vision.resnet50, IMAGE, "one 3×224×224 image", 25_557_032, 2 * 4.089, TORCHVISION),
    Preset("resnet152", vision.resnet152, IMAGE, "one 3×224×224 image", 60_192_808, 2 * 11.514, TORCHVISION),
    Preset("resnext101", vision.resnext101, IMAGE, "one 3×224×224 image", 44_177_704, None,
           "parameters: timm's model table (resnext101_32x4d: 44.18 M); NVIDIA DeepLearningExamples' "
           "ResNeXt101-32x4d", aliases="resnext101-32x4d;resnext"),
    Preset("se-resnext101", vision.se_resnext101, IMAGE, "one 3×224×224 image", 48_955_416, None,
           "parameters: timm's model table (seresnext101_32x4d: 48.96 M); NVIDIA DeepLearningExamples' "
           "SE-ResNeXt101-32x4d", aliases="se-resnext101-32x4d;seresnext101"),
    Preset("ssd300", vision.ssd300, (3, 300, 300), "one 3×300×300 image", None, None,
           "NVIDIA DeepLearningExamples' PyTorch SSD300 v1.1 (ResNet-50 backbone, 81 COCO labels); no published "
           "count", aliases="ssd;ssd300-resnet50", min_batch=2),
    Preset("bert-base", text.bert_base, (128,), "128 token ids", 109_482_240, 22.53,
           "parameters with the pooler: Hugging Face bert-base-uncased; FLOPs: " + TRANSFORMER_FLOPS,
           aliases="bert-base-uncased;bert", tokens=True, max_tokens=text.BERT_POSITIONS, optimizer="adamw"),
    Preset("bert-large", text.bert_large, (128,), "128 token ids", 335_141_888, 79.27,
           "parameters with the pooler: Hugging Face bert-large-uncased; FLOPs: " + TRANSFORMER_FLOPS,
           aliases="bert-large-uncased", tokens=True, max_tokens=text.BERT_POSITIONS, optimizer="adamw"),
    Preset("gpt2", text.gpt2, (1024,), "1024 token ids", 124_439_808, 291.90,
           "parameters with tied embeddings: Hugging Face gpt2; FLOPs: " + TRANSFORMER_FLOPS,
           aliases="gpt2-124m;gpt-2 small;gpt2-small", tokens=True, max_tokens=text.GPT2_CONTEXT, optimizer="adamw"),
    Preset("transformer-xl-base", transformer_xl.transformer_xl_base, (192,), "192 token ids (and a memory as long)",
           191_948_759, None, TRANSFORMER_XL, aliases="transformer-xl;txl-base", tokens=True, max_tokens=4096,
           optimizer="lamb"),
    Preset("transformer-xl-large", transformer_xl.transformer_xl_large, (384,), "384 token ids (and a memory as long)",
           519_963_095, None, TRANSFORMER_XL, aliases="txl-large", tokens=True, max_tokens=4096, optimizer="adam"),
)}

# Where each preset's default optimizer comes from (Preset.optimizer): how people train that network.
OPTIMIZER_SOURCES = {
    "momentum": "SGD with momentum: the source's MNIST networks, torchvision's and NVIDIA DeepLearningExamples' "
                "image-classification and SSD recipes; also any module:factory model",
    "adamw": "BERT and GPT-2: Hugging Face Trainer's default (AdamW), nanoGPT's, NVIDIA's BERT fine-tuning (BertAdam: "
             "Adam with decoupled weight decay)",
    "lamb": "Transformer-XL base: NVIDIA DeepLearningExamples' JIT LAMB",
    "adam": "Transformer-XL large: NVIDIA DeepLearningExamples' Adam",
}

_LOOKUP = Lookup(list(PRESETS.values()), "model")


def preset(name: str) -> Preset:
    """The built-in model called ``name``, loosely; one line with the closest names otherwise.

    >>> preset("resnet101")
    Traceback (most recent call last):
    ...
    gpurig.spec.fields.SpecError: unknown model 'resnet101'; closest: resnext101, se-resnext101, resnet50 (or give module:factory)
    """
    try:
        return _LOOKUP.find(name)
    except SpecError:
        hint = _LOOKUP.closest_hint(name) or f"; built-in: {', '.join(PRESETS)}"
        raise SpecError(f"unknown model {name!r}{hint} (or give module:factory)") from None


def sequence_length(model: str, tokens: int | None) -> int | None:
    """The tokens a sample of ``model`` has as predict prices it: ``tokens`` when given, else a token preset's own
    length; None for a model of images or features (and a ``module:factory`` model not given ``--tokens``).

    >>> sequence_length("bert-base", None), sequence_length("bert-base", 256), sequence_length("resnet50", None)
    (128, 256, None)
    """
    if tokens is not None or ":" in model:
        return tokens
    found = preset(model)
    return found.sample[0] if found.tokens else None


def default_optimizer(model: str) -> str:
    """The optimizer ``model`` is usually trained with (:data:`OPTIMIZER_SOURCES`): a preset's, and SGD with
    momentum for a ``module:factory`` model or a name gpurig does not know (refused later, where it is described).

    >>> default_optimizer("BERT-large"), default_optimizer("resnet50"), default_optimizer("my_models:net")
    ('adamw', 'momentum', 'momentum')
    """
    if ":" in model:
        return "momentum"
    try:
        return _LOOKUP.find(model).optimizer
    except SpecError:
        return "momentum"


def model_spec(model: str, batch: int = 1, *, tokens: int | None = None, sample: str | None = None,
               mixed: bool = False) -> ModelSpec:
    """Describe a preset by name, or any ``module:factory`` with its per-sample input (``3x224x224``, ``128:int64``).
    ``mixed``: also what a mixed-precision step saves (:func:`gpurig.models.describe.describe`'s ``mixed_precision``).

    >>> spec = model_spec("gpurig.models:cnn", batch=64, sample="784")
    >>> spec.name, spec.parameters, spec.batch
    ('gpurig.models:cnn', 317066, 64)
    >>> model_spec("bert-base", tokens=512).sample
    (512,)
    """
    if ":" in model:
        if sample is None:
            find_function(model)   # a factory that is not there is said first: that is the mistake to fix
            raise UsageError(f"{model}: give the input of one sample, such as 3x224x224 or 128:int64 for token ids")
        return describe(load_factory(model), sample_batch(sample), batch, name=model, mixed_precision=mixed)
    found = preset(model)
    if batch < found.min_batch:
        raise UsageError(f"{found.name} trains with a batch of at least {found.min_batch} per GPU (batch norm over "
                         f"1×1 feature maps), got {batch}")
    if sample is not None:
        raise UsageError(f"{found.name} takes {found.describes}; an input shape is only for module:factory models")
    return _preset_spec(found.name, batch, tokens, mixed)


@functools.lru_cache(maxsize=256)
def _preset_spec(name: str, batch: int, tokens: int | None, mixed: bool = False) -> ModelSpec:
    """A preset described once per (batch, tokens): a :class:`ModelSpec` is frozen, and ``predict`` asks for the
    same one many times (its scaling curves, its advice, ``gpurig choose``'s every candidate).

    >>> _preset_spec("mnist-mlp", 64, None) is _preset_spec("mnist-mlp", 64, None)
    True
    """
    found = PRESETS[name]
    return describe(found.build(), found.example(tokens), batch, name=found.name, mixed_precision=mixed)


@functools.lru_cache(maxsize=256)
def step_peak(model: str, batch: int, *, tokens: int | None = None, sample: str | None = None,
              mixed: bool = False) -> dict | None:
    """The peak memory of one training step of a preset or ``module:factory`` model at ``batch``, traced on the
    meta device in FP32 or, ``mixed``, as CUDA's autocast runs it (:func:`gpurig.models.peak.step_peaks`);
    None when the meta device cannot run the model's backward.

    >>> peak = step_peak("mnist-mlp", 64)
    >>> peak["peak"] > peak["gradients"] > 0 and peak["per_sample"] > 0
    True
    """
    module, x = _module_and_batch(model, batch, tokens, sample)
    try:
        return step_peaks(on_meta(module), x, torch.float16 if mixed else None)
    except Exception:  # noqa: BLE001 (a model's own backward: the footprint then adds up its parts)
        return None


@functools.lru_cache(maxsize=256)
def step_operators(model: str, *, tokens: int | None = None, sample: str | None = None,
                   mixed: bool = False) -> tuple[int, int] | None:
    """(forward, backward) operators one training step of a preset or ``module:factory`` model dispatches, views
    left out, in FP32 or, ``mixed``, with autocast's casts (:func:`gpurig.models.peak.trace_step`): what a GPU's
    host launches one by one. Traced once, at a batch of 2: the count does not grow with the batch. None when the
    meta device cannot run the model's backward.

    >>> step_operators("mnist-mlp"), step_operators("mnist-mlp", mixed=True)
    ((8, 13), (16, 20))
    """
    from gpurig.models.peak import CudnnRNN, trace_step

    module, x = _module_and_batch(model, 2, tokens, sample)
    try:
        with CudnnRNN():  # an LSTM is one cuDNN call a GPU's host launches, not the meta device's unrolled steps
            traced = trace_step(on_meta(module), x, torch.float16 if mixed else None)
    except Exception:  # noqa: BLE001 (a model's own backward)
        return None
    return traced["forward_ops"], traced["backward_ops"]


def _module_and_batch(model: str, batch: int, tokens: int | None, sample: str | None) -> tuple[nn.Module, torch.Tensor]:
    """A preset's or ``module:factory``'s module, and a meta batch of ``batch`` of its input."""
    if ":" in model:
        return load_factory(model), sample_batch(sample, batch)
    found = preset(model)
    return found.build(), example_input(found.example(tokens), batch)


# The presets ``gpurig train`` trains (on MNIST), by the short names its --model takes.
TRAINABLE = {"mlp": "mnist-mlp", "cnn": "mnist-cnn", "wide-cnn": "mnist-wide-cnn"}


def build(name: str) -> nn.Module:
    """A model ``gpurig train`` trains, by its short name (``mlp``, ``cnn`` or ``wide-cnn``), with real weights.

    >>> type(build("mlp")).__name__
    'Sequential'
    """
    if name not in TRAINABLE:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(TRAINABLE)}")
    return PRESETS[TRAINABLE[name]].factory()


__all__ = ["Preset", "PRESETS", "TRAINABLE", "preset", "model_spec", "build", "load_factory", "parse_sample",
           "mlp", "cnn", "wide_cnn"]
