"""gpurig predict from catalog parts against published GPU training throughputs: the fit and its cross-validation.

    .venv/bin/python benchmarks/published_validation.py              # fit, cross-validate, print (~1 h, 2 loaded cores)
    .venv/bin/python benchmarks/published_validation.py --rows       # and every row, predicted vs published
    .venv/bin/python benchmarks/published_validation.py --json /tmp/published.json
    .venv/bin/python benchmarks/published_validation.py --no-power   # without the power term (watts per SM)

The data is benchmarks/data/published_gpu_training.csv (its README says where
each row comes from). ResNet-50 v1.5 and BERT-large are not in it: they are
held out of every source, to check the result, and nothing here reads them.
A row is used when gpurig has its model as a preset, its GPU in the catalog,
its batch published (NVIDIA's PyTorch ResNeXt READMEs: from the ``configs.yml``
their benchmark reads, benchmarks/data/README.md) and PyTorch ran it (TensorFlow's
XLA fuses the memory-bound work PyTorch runs kernel by kernel); each is predicted
as a new user would ask (``gpurig predict --model M --cluster "1 x GPU" --batch B
--precision P --software S --memory-format F``, the release and the layout the
row ran: :func:`software_of`, :func:`memory_format_of`), through predict's own
step arithmetic.

The model's free constants (:class:`gpurig.perf.machine.GpuEfficiency`: the
efficiencies, and a tensor-core factor per GPU architecture other than Ampere's)
are fitted to the single-GPU rows by least absolute log error of predicted over
published throughput. Cross-validation refits every one of them without one GPU
(leave-one-GPU-out) or one model (leave-one-model-out), starting from the
all-rows fit with the factors of architectures the fold lacks reset to 1, and
predicts the rows left out; the errors it prints are those, not the in-sample ones. Multi-GPU rows are predicted
with the fitted constants and compared as scaling efficiency (throughput on N
GPUs over N times the same source's one-GPU throughput).

Precision: ``amp-fp16`` is ``--precision fp16``, ``amp-bf16`` is ``bf16``,
``tf32`` is ``tf32``. Lambda's and NVIDIA's "fp32" ran in NGC containers, which
keep TF32 on for FP32 work on GPUs that have it (PyTorch before 1.12 by default,
later containers through ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1``): it is
predicted as ``tf32`` on Ampere and later and as ``fp32`` before.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gpurig.models import PRESETS
from gpurig.perf import machine
from gpurig.perf.machine import GpuEfficiency
from gpurig.perf.precision import MIXED
from gpurig.perf.step import layer_costs
from gpurig.predict import PredictRequest, load_hardware
from gpurig.predict.configuration import step_at
from gpurig.spec import catalog

DATA = Path(__file__).resolve().parent / "data" / "published_gpu_training.csv"
# Published GPU names and the catalog's (rows of GPUs the catalog lacks, such as laptop parts, are skipped).
# "V100 16GB" is Lambda Cloud's V100 (its 1x/2x/4x/8x instances); Lambda's own table builder gives it 300 W per
# GPU (lambdal/deeplearning-benchmark pytorch/scripts/compile_results_pytorch.py, 'LambdaCloud_V100_16GB_v1' and
# the 2x/4x/8x entries, "watt per gpu"; the same table gives the A100 PCIe 250 and 300 W, SXM4 400 W): the
# 300 W V100 is the SXM2 module (the PCIe card is 250 W), so these rows are V100 SXM2 16 GB (NVLink between
# the GPUs of a multi-GPU instance), where they were priced as the PCIe card until 2026-11-27.
GPUS = {
    "V100 16GB": "V100 SXM2 16 GB", "V100 32GB": "V100 SXM2 32 GB", "V100 SXM2 16GB": "V100 SXM2 16 GB",
    "V100 SXM2 32GB": "V100 SXM2 32 GB", "A100 SXM4 80GB": "A100 SXM4 80 GB", "A100 80GB": "A100 SXM4 80 GB",
    "A100 SXM4 40GB": "A100 SXM4 40 GB", "A100 PCIe 40GB": "A100 PCIe 40 GB", "A100 PCIe 80GB": "A100 PCIe 80 GB",
    "H100 SXM5 80GB": "H100 SXM5 80 GB", "H100 PCIe 80GB": "H100 PCIe", "H200 SXM 141GB": "H200 SXM",
    "B200 192GB": "B200", "RTX 2080 Ti": "RTX 2080 Ti", "RTX 3070": "RTX 3070", "RTX 3080": "RTX 3080",
    "RTX 3090": "RTX 3090", "RTX 4090": "RTX 4090", "RTX A6000": "RTX A6000", "RTX 6000 Ada": "RTX 6000 Ada",
    "A40": "A40", "A10": "A10", "GTX 1080 Ti": "GTX 1080 Ti", "Titan RTX": "Titan RTX",
    "RTX A4000": "RTX A4000", "RTX A4500": "RTX A4500", "RTX A5000": "RTX A5000", "RTX A5500": "RTX A5500",
    "Quadro RTX 5000": "Quadro RTX 5000", "Quadro RTX 6000": "Quadro RTX 6000", "Quadro RTX 8000": "Quadro RTX 8000",
}
# Published model names (a prefix) and the preset that is the same network, with the optimizer its source trains
# it with (NVIDIA DeepLearningExamples: BERT fine-tuning with Adam, the convolutional nets with SGD and momentum).
MODELS = {
    "BERT-base SQuAD": ("bert-base", "adam"),
    "SSD300 (ResNet-50 backbone": ("ssd300", "momentum"),
    "ResNeXt101-32x4d": ("resnext101", "momentum"),
    "SE-ResNeXt101-32x4d": ("se-resnext101", "momentum"),
    # Lambda's runs of NVIDIA's code: full softmax, memory as long as the segment, JIT LAMB (base) and Adam (large);
    # NVIDIA's own rows use an adaptive softmax and state no sequence length, so they are left out.
    "Transformer-XL base": ("transformer-xl-base", "lamb"),
    "Transformer-XL large": ("transformer-xl-large", "adam"),
}

# The presets whose source steps with an optimizer of its own (gpurig.perf.optimizer), whatever its PyTorch: NVIDIA's
# BERT fine-tuning outside --fp16 loops over the tensors in Python (its ``BertAdam``; under --fp16 it is apex's
# FusedAdam), and Transformer-XL base calls a TorchScript kernel per tensor (``JITLamb``), which fuses the update's
# arithmetic: its passes are a fused kernel's. The others use torch.optim, as the container's PyTorch runs it.
OWN_OPTIMIZER = {"bert-base": "for-loop", "transformer-xl-base": "fused"}

PRECISIONS = {"amp-fp16": "fp16", "amp-bf16": "bf16", "tf32": "tf32"}
# The fitted constants (the per-layer host cost is measured: these batches are too large to show it).
FIELDS = tuple(f.name for f in dataclasses.fields(GpuEfficiency)
               if f.name not in ("layer_overhead_s", "architecture", "software", "cuda_architecture",  # Kepler's: no rows
                                 "wide_issue_gemm",  # measured
                                 "power_exponent", "watts_per_unit"))  # fitted after the rest (WITH_POWER)
# The power term (:meth:`GpuEfficiency.power_scale`), fitted after every other constant with those fixed
POWER = ("power_exponent", "watts_per_unit")
POWER_START = {"power_exponent": 0.5, "watts_per_unit": 3.0}  # where its fit starts when the model has none yet
# fit (and cross-validate) the power term after the rest (``--no-power``: not at all)
WITH_POWER = True
# Where the fit starts: the datasheet-minded guesses, with the two effects that have no neutral value switched on.
# It is also each constant's prior: a fold whose rows cannot move a constant (no convolution in mixed precision on
# NCHW tensors for ``transposes``, say) predicts with this value, not the all-rows fit's (:func:`fold_start`);
# ``transposes`` 1 is its definition's one extra pass, ``conv_cuda`` 2.25 Winograd's whole saving on a 3×3
# (F(2×2, 3×3): 16 multiplies for 36) at the GEMMs' efficiency.
START = GpuEfficiency(tensor_gemm=0.8, cuda_gemm=0.9, conv=1.0, conv_mixed=1.0, conv_cuda=2.25, memory=0.8,
                      unhidden=0.3, flops_per_value=40.0, transposes=1.0, architecture=(), software=())
# Physical ranges: no kernel beats its peak (a tensor-core convolution may beat the GEMMs' fitted efficiency, not
# the peak: :func:`_physical`), except that Winograd's 3×3 convolutions on CUDA cores skip up to 2.25x of the direct
# FLOPs the model counts. An older software release is no faster than current PyTorch.
BOUNDS = {"tensor_gemm": (0.05, 1.0), "cuda_gemm": (0.05, 1.0), "conv": (0.2, 5.0), "conv_mixed": (0.2, 5.0),
          "conv_cuda": (0.2, 2.25),
          "memory": (0.05, 1.0),
          "unhidden": (0.0, 1.0),
          "flops_per_value": (0.0, 500.0),
          "cache": (1.0, 4.0),
          "transposes": (0.0, 4.0),
          "power_exponent": (0.0, 3.0),
          "watts_per_unit": (1.0, 10.0),
          "architecture:": (0.3, 3.0),
          "software:": (0.3, 1.0)}
ARCHITECTURE = "architecture:"
SOFTWARE = "software:"
TOLERANCE = 1e-5    # of the summed |log error| (about 0.0003 over 250 rows): a smaller gain ends the search
FOLD_STEPS = (1.15, 1.05, 1.015)   # a fold's search from the all-rows fit: its finer steps
WARM_STEPS = (1.4,) + FOLD_STEPS    # the all-rows fit's, from the shipped constants
REFERENCE_ARCHITECTURE = "Ampere"


@dataclass
class Case:
    """One published row, as gpurig predict is asked about it."""

    model: str
    gpu: str
    gpus: int
    precision: str
    batch: int
    tokens: int | None
    published: float
    optimizer: str
    source: str
    software: str = "current"
    memory_format: str = "contiguous"
    optimizer_impl: str = "fused"

    @property
    def request(self) -> PredictRequest:
        return PredictRequest(model=self.model, cluster=f"1 node x {self.gpus} {self.gpu}", batch=self.batch,
                              tokens=self.tokens, precision=self.precision, optimizer=self.optimizer,
                              optimizer_impl=self.optimizer_impl, gpus=self.gpus, software=self.software,
                              memory_format=self.memory_format)


def precision_of(published: str, gpu: str) -> str | None:
    """The ``--precision`` a published precision word means on ``gpu`` (module docstring).

    >>> precision_of("fp32", "A100 SXM4 80 GB"), precision_of("fp32", "V100 SXM2 16 GB"), precision_of("amp-fp16", "A10")
    ('tf32', 'fp32', 'fp16')
    """
    if published == "fp32":
        return "tf32" if catalog.gpu(gpu).tf32_tflops else "fp32"
    return PRECISIONS.get(published)


def software_of(table: str, gpu: str) -> str:
    """The ``--software`` a published row ran on, from its ``table`` (benchmarks/data/README.md): Lambda's v0 table
    is NGC 20.01 (PyTorch 1.4, apex AMP) before Ampere and NGC 20.10 (PyTorch 1.7) from Ampere on; its v1 (NGC
    22.09) and v2 (NGC 24.xx) tables and NVIDIA's own READMEs (NGC 20.06-22.11 ...) are priced as current.

    >>> software_of("Lambda v0 table (NGC pytorch:20.01-py3 pre-Ampere / 20.10-py3 Ampere); ...", "V100 SXM2 32 GB")
    'pytorch-1.4'
    >>> software_of("Lambda v0 table (NGC pytorch:20.01-py3 pre-Ampere / 20.10-py3 Ampere); ...", "RTX 3090")
    'pytorch-1.7'
    """
    if not table.startswith("Lambda v0"):
        return "current"
    return "pytorch-1.7" if catalog.gpu(gpu).tf32_tflops else "pytorch-1.4"


def memory_format_of(row: dict) -> str:
    """The ``--memory-format`` a published row ran with: NVIDIA's own PyTorch SSD runs channels-last (its
    ``main.py`` defaults to ``--data-layout channels_last`` since November 2021, before the 22.10 container its
    table ran), its ConvNets (ResNeXt, SE-ResNeXt) only in AMP (``configs.yml`` sets ``memory_format: nhwc`` for
    AMP alone; TF32 and FP32 run PyTorch's default). Lambda's runs state no layout: PyTorch's default, contiguous
    (its first table predates SSD's switch; its SSD300 rows in mixed precision run 0.6x NVIDIA's own on the same
    A100 80 GB).

    >>> nvidia = {"source_repo": "NVIDIA/DeepLearningExamples", "model": "ResNeXt101-32x4d", "precision": "tf32"}
    >>> memory_format_of(nvidia), memory_format_of({**nvidia, "precision": "amp-fp16"})
    ('contiguous', 'channels-last')
    >>> memory_format_of({**nvidia, "model": "SSD300 (ResNet-50 backbone)"}), memory_format_of({"source_repo": "lambdal/x"})
    ('channels-last', 'contiguous')
    >>> memory_format_of({**nvidia, "model": "BERT-base", "precision": "amp-fp16"})
    'contiguous'

    """
    if row["source_repo"] != "NVIDIA/DeepLearningExamples" or not any(net in row["model"] for net in ("SSD", "ResNeXt")):
        return "contiguous"   # a layout is the convolutions' (BERT, Transformer-XL have none: predict refuses it)
    if "ResNeXt" in row["model"] and not row["precision"].startswith("amp"):
        return "contiguous"
    return "channels-last"


def optimizer_impl_of(table: str, model: str, precision: str) -> str:
    """How a published row's optimizer ran (:mod:`gpurig.perf.optimizer`): apex's FusedAdam for BERT in mixed
    precision, its source's own optimizer (:data:`OWN_OPTIMIZER`), else torch.optim's default in the row's container:
    foreach from PyTorch 2.0 (Lambda's v2 table, NGC 24.xx), one tensor at a time before it (every other table).

    >>> optimizer_impl_of("Lambda v2 raw table (NGC pytorch:24.xx); ...", "ssd300", "fp16")
    'foreach'
    >>> optimizer_impl_of("Lambda v2 raw table (NGC pytorch:24.xx); ...", "bert-base", "tf32")
    'for-loop'
    >>> optimizer_impl_of("Lambda v1 table (NGC pytorch:22.09-py3/22.10-py3); ...", "bert-base", "fp16")
    'fused'
    """
    if model == "bert-base" and precision in MIXED:
        return "fused"
    if model in OWN_OPTIMIZER:
        return OWN_OPTIMIZER[model]
    return "foreach" if table.startswith("Lambda v2") else "for-loop"


def load_cases(path: Path = DATA) -> list[Case]:
    """The rows gpurig can predict: a preset model, a catalog GPU, a published batch, one node."""
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            model = next((m for prefix, m in MODELS.items() if row["model"].startswith(prefix)), None)
            gpu = GPUS.get(row["gpu"])
            if model is None or gpu is None or not row["batch_per_gpu"] or row["nodes"] != "1":
                continue
            if row["framework"] != "PyTorch":  # gpurig predicts PyTorch's eager steps, not XLA's fused ones
                continue
            if "impossible" in row["table"]:
                continue
            if PRESETS[model[0]].tokens and not row["seq_len"]:
                continue
            published = float(row["throughput"])
            if row["unit"] in ("tokens/s", "tok/s"):   # gpurig counts sequences, as the batch does
                published /= int(row["seq_len"])
            precision = precision_of(row["precision"], gpu)
            if precision is None:
                continue
            out.append(Case(model[0], gpu, int(row["gpus"]), precision, int(float(row["batch_per_gpu"])),
                            int(row["seq_len"]) if row["seq_len"] else None, published, model[1],
                            row["table"], software_of(row["table"], gpu), memory_format_of(row),
                            optimizer_impl_of(row["table"], model[0], precision)))
    return out


@lru_cache(maxsize=None)
def _prepared(model: str, batch: int, tokens: int | None):
    from gpurig.models import model_spec

    spec = model_spec(model, batch=batch, tokens=tokens)
    return spec, layer_costs(spec)


def predicted(case: Case, efficiency: GpuEfficiency, gpus: int | None = None) -> float:
    """Samples per second ``gpurig predict`` gives ``case`` on ``gpus`` GPUs (default: the case's) with
    ``efficiency``: the same arithmetic as :func:`gpurig.predict.predict`, with the model described once."""
    return _throughput(case.model, case.gpu, gpus or case.gpus, case.precision, case.batch, case.tokens,
                       case.optimizer, case.software, efficiency, case.memory_format, case.optimizer_impl)


@lru_cache(maxsize=1 << 14)
def _throughput(model: str, gpu: str, n: int, precision: str, batch: int, tokens: int | None, optimizer: str,
                software: str, efficiency: GpuEfficiency, memory_format: str = "contiguous",
                optimizer_impl: str = "fused") -> float:
    # several sources publish the same configuration: each is priced once per set of constants
    request = PredictRequest(model=model, cluster=f"1 node x {n} {gpu}", batch=batch, tokens=tokens,
                             precision=precision, optimizer=optimizer, optimizer_impl=optimizer_impl, gpus=n,
                             software=software, memory_format=memory_format)
    spec, layers = _prepared(model, batch, tokens)
    saved, machine.GPU_EFFICIENCY = machine.GPU_EFFICIENCY, efficiency
    try:
        step = step_at(spec, layers, request, _hardware(request.cluster, request.precision, software,
                                                        memory_format), n)
    finally:
        machine.GPU_EFFICIENCY = saved
    return n * batch / step.step_s


@lru_cache(maxsize=None)
def _hardware(cluster: str, precision: str, software: str = "current", memory_format: str = "contiguous"):
    return load_hardware(PredictRequest(model="bert-base", cluster=cluster, precision=precision, software=software,
                                        memory_format=memory_format))


def log_error(case: Case, efficiency: GpuEfficiency) -> float:
    return math.log(predicted(case, efficiency) / case.published)


def parameters(cases: list[Case]) -> list[str]:
    """The constants a fit to ``cases`` moves: :data:`FIELDS`, and a tensor-core factor per architecture of which
    the cases hold two GPUs or more, other than Ampere (the reference ``tensor_gemm`` itself; it has the most rows).
    One GPU's rows would make its architecture's factor that GPU's, for every card of the generation (Lambda's
    first B200 numbers would price an RTX 5090), and no fold could test it."""
    gpus = defaultdict(set)
    for c in cases:
        gpus[catalog.gpu(c.gpu).architecture].add(c.gpu)
    architectures = sorted(a for a, names in gpus.items() if len(names) >= 2 and a != REFERENCE_ARCHITECTURE)
    return list(FIELDS) + [ARCHITECTURE + a for a in architectures] + [SOFTWARE + "/".join(s) for s in releases(cases)]


def releases(cases: list[Case]) -> list[tuple[str, str]]:
    """The (release, "fp32" | "mixed") software factors ``cases`` can fit: every release but current that runs
    some of them (current PyTorch is the reference, 1)."""
    return sorted({(c.software, "mixed" if c.precision in MIXED else "fp32") for c in cases if c.software != "current"})


def value_of(efficiency: GpuEfficiency, name: str) -> float:
    if name.startswith(ARCHITECTURE):
        return efficiency.architecture_scale(name[len(ARCHITECTURE):])
    if name.startswith(SOFTWARE):
        return dict(efficiency.software).get(tuple(name[len(SOFTWARE):].split("/")), 1.0)
    return getattr(efficiency, name)


def with_value(efficiency: GpuEfficiency, name: str, value: float) -> GpuEfficiency:
    if name.startswith(ARCHITECTURE):
        scales = dict(efficiency.architecture)
        scales[name[len(ARCHITECTURE):]] = value
        return dataclasses.replace(efficiency, architecture=tuple(sorted(scales.items())))
    if name.startswith(SOFTWARE):
        scales = dict(efficiency.software)
        scales[tuple(name[len(SOFTWARE):].split("/"))] = value
        return dataclasses.replace(efficiency, software=tuple(sorted(scales.items())))
    return dataclasses.replace(efficiency, **{name: value})


def fit_power(cases: list[Case], fitted: GpuEfficiency, start: GpuEfficiency | None = None,
              steps: tuple[float, ...] = (1.4, 1.15, 1.05, 1.015)) -> GpuEfficiency:
    """``fitted`` (its power term off) with the power term fitted to ``cases``, every other constant as it is:
    the term then moves only the boards short of power. Its search starts from ``start``'s term (the all-rows
    fit's, in a fold), or :data:`POWER_START`."""
    begin = {name: getattr(start, name) for name in POWER} if start is not None and start.power_exponent \
        else POWER_START
    return fit(cases, dataclasses.replace(fitted, **begin), steps=steps, names=list(POWER))


def fit(cases: list[Case], start: GpuEfficiency | None = None,
        steps: tuple[float, ...] = (2.0, 1.4, 1.15, 1.05, 1.015), names: list[str] | None = None) -> GpuEfficiency:
    """The constants that minimise the summed absolute log error over ``cases`` (coordinate descent, log steps).

    Absolute, not squared: one source's odd row (Lambda's first B200 numbers, say) should not pull every
    GPU. A constant no case depends on (no convolution among the cases, say, or an architecture none of
    their GPUs has) keeps its starting value. A step that gains less than :data:`TOLERANCE` of the summed error
    is no gain: a constant bounded at 0 (``unhidden``) otherwise creeps toward it by 1.5 % a pass, each pass
    re-pricing every constant, for hundreds of passes that change no row.
    """
    best = start or START
    names = names or parameters(cases)
    # a trial moves one constant: only the cases it can change are priced again (the rest keep their errors, and
    # the sum runs over all in the same order, so the fit is the one that prices every case every time)
    depends = {name: [i for i, c in enumerate(cases) if _depends_on(name, c)] for name in names}
    errors = [abs(log_error(c, best)) for c in cases]
    best_loss = sum(errors)
    for step in steps:
        improved = True
        while improved:
            improved = False
            for name in names:
                low, high = BOUNDS.get(name) or BOUNDS[name[:name.index(":") + 1]]
                for factor in (step, 1 / step):
                    value = min(high, max(low, value_of(best, name) * factor))
                    trial = with_value(best, name, value)
                    if not _physical(trial):
                        continue
                    trial_errors = list(errors)
                    for i in depends[name]:
                        trial_errors[i] = abs(log_error(cases[i], trial))
                    trial_loss = sum(trial_errors)
                    if trial_loss < best_loss * (1 - TOLERANCE):
                        best, best_loss, errors, improved = trial, trial_loss, trial_errors, True
    return best


def _depends_on(name: str, case: Case) -> bool:
    """Whether ``case``'s prediction can change with the constant ``name`` (:func:`gpurig.perf.machine.gpu_device`):
    an architecture's factor prices only its GPUs, a release's factor only its rows of that precision kind, the
    convolutions' efficiencies only models with convolutions (``conv`` in FP32/TF32, ``conv_mixed`` in mixed
    precision); every other constant prices every case.

    >>> case = Case("bert-base", "V100 SXM2 16 GB", 1, "fp16", 8, 384, 1.0, "adam", "", "pytorch-1.4")
    >>> [_depends_on(n, case) for n in ("memory", "conv", "architecture:Volta", "architecture:Hopper",
    ...                                 "software:pytorch-1.4/mixed", "software:pytorch-1.4/fp32")]
    [True, False, True, False, True, False]
    """
    if name.startswith(ARCHITECTURE):
        return catalog.gpu(case.gpu).architecture == name[len(ARCHITECTURE):]
    if name.startswith(SOFTWARE):
        return (case.software, "mixed" if case.precision in MIXED else "fp32") == tuple(name[len(SOFTWARE):].split("/"))
    if name in ("conv", "conv_mixed", "conv_cuda", "transposes"):
        convs = [layer for layer in _prepared(case.model, case.batch, case.tokens)[1] if layer.kind == "conv"]
        if not convs or (name == "conv_cuda" and not any(layer.winograd for layer in convs)):
            return False
        if name == "transposes":
            return case.precision in MIXED and case.memory_format == "contiguous"
        return name == "conv_cuda" or (name == "conv_mixed") == (case.precision in MIXED)
    return True


def _physical(e: GpuEfficiency) -> bool:
    """No architecture's tensor cores beyond their peak, in GEMMs or in convolutions."""
    fastest = max([1.0] + [scale for _, scale in e.architecture])
    return e.tensor_gemm * fastest * max(1.0, e.conv, e.conv_mixed) <= 1.0


def cross_validate(cases: list[Case], groups: dict, start: GpuEfficiency, log=None) -> dict[str, dict[int, float]]:
    """Each case's log error with the constants fitted to the cases outside its group, for every way of grouping
    in ``groups`` (name -> ``group(case)``): {name: {id(case): error}}.

    The folds of all groupings share one pool, one process per core; ``log`` (a file) gets a line as each ends
    (they take minutes each on a loaded machine).
    """
    import multiprocessing
    import os

    folds = []
    for name, group in groups.items():
        for key in sorted({group(c) for c in cases}):
            inside = [c for c in cases if group(c) != key]
            folds.append((name, key, inside, [c for c in cases if group(c) == key], fold_start(start, inside)))
    results = defaultdict(dict)
    with multiprocessing.get_context("fork").Pool(os.cpu_count()) as pool:
        for done, (name, key, fold) in enumerate(pool.imap_unordered(_fold, folds), 1):
            for c, e in fold:
                results[name][_key(c)] = e
            if log is not None:
                s = summary([e for _, e in fold])
                print(f"fold {done}/{len(folds)}: {name} {key}: {s['rows']} rows, median {s['median_pct']} %, "
                      f"worst {s['worst_pct']} %", file=log, flush=True)
    return {name: {id(c): by_case[_key(c)] for c in cases} for name, by_case in results.items()}


def _key(c: Case) -> tuple:
    return (c.model, c.gpu, c.gpus, c.precision, c.batch, c.source, c.published)


def fold_start(fitted: GpuEfficiency, inside: list[Case]) -> GpuEfficiency:
    """Where a fold's fit starts: the all-rows fit, with every constant the fold's rows cannot move back at its
    prior: the factor of an architecture the fold has no GPU of and of a release it has no row of at 1, any other
    at :data:`START`'s (nothing of the left-out rows reaches the fold through a constant only they fix).

    >>> e = GpuEfficiency(architecture=(("Hopper", 0.6), ("Volta", 0.9)), transposes=0.5, conv=1.3)
    >>> fold = fold_start(e, [Case("bert-base", "V100 PCIe 16 GB", 1, "fp16", 8, 384, 1.0, "adam", "")])
    >>> fold.architecture, fold.transposes, fold.conv     # no convolution in the fold: both at their prior
    ((('Volta', 0.9),), 1.0, 1.0)
    """
    present = {catalog.gpu(c.gpu).architecture for c in inside}
    kept = set(releases(inside))
    unmoved = {name: getattr(START, name) for name in FIELDS if not any(_depends_on(name, c) for c in inside)}
    return dataclasses.replace(fitted, architecture=tuple((a, v) for a, v in fitted.architecture if a in present),
                               software=tuple((s, v) for s, v in fitted.software if s in kept), **unmoved)


def _fold(fold):
    name, key, inside, outside, start = fold
    fitted = fit(inside, dataclasses.replace(start, power_exponent=0.0), steps=FOLD_STEPS)
    if WITH_POWER:
        fitted = fit_power(inside, fitted, start, steps=FOLD_STEPS)
    return name, key, [(c, log_error(c, fitted)) for c in outside]


def summary(errors: list[float]) -> dict:
    """Median and worst |error| in per cent (errors as log ratios), the share within 10 % and 25 %, and the summed
    |log error| (what the fit minimises)."""
    relative = [abs(math.exp(e) - 1) for e in errors]
    return {"rows": len(errors), "median_pct": round(100 * statistics.median(relative), 1),
            "sum_abs_log": round(sum(abs(e) for e in errors), 3),
            "worst_pct": round(100 * max(relative), 1),
            "within_10_pct": round(100 * sum(r <= 0.10 for r in relative) / len(relative)),
            "within_25_pct": round(100 * sum(r <= 0.25 for r in relative) / len(relative))}


def scaling(cases: list[Case], efficiency: GpuEfficiency) -> list[dict]:
    """Multi-GPU rows as scaling efficiency, published against predicted, where the same source has one GPU."""
    singles = {(c.model, c.gpu, c.precision, c.batch, c.tokens, c.source.split(";")[0]): c
               for c in cases if c.gpus == 1}
    rows = []
    for c in cases:
        one = singles.get((c.model, c.gpu, c.precision, c.batch, c.tokens, c.source.split(";")[0]))
        if c.gpus == 1 or one is None:
            continue
        published = c.published / (c.gpus * one.published)
        model = predicted(c, efficiency) / (c.gpus * predicted(one, efficiency))
        rows.append({"model": c.model, "gpu": c.gpu, "gpus": c.gpus, "precision": c.precision,
                     "published_efficiency": round(published, 3), "predicted_efficiency": round(model, 3),
                     "points": round(100 * (model - published), 1)})
    return rows


def source_spread(cases: list[Case]) -> dict:
    """How far the sources disagree with each other on one GPU, model and precision: the floor under any
    prediction's error. One number per configuration can be no closer to two published values ``hi`` and ``lo``
    than sqrt(hi / lo) − 1 to both (the geometric middle)."""
    groups = defaultdict(list)
    for c in cases:
        if c.gpus == 1:
            groups[(c.gpu, c.model, c.precision)].append(c)
    rows = []
    for (gpu, model, precision), group in sorted(groups.items()):
        if len({c.source.split(";")[0] for c in group}) < 2:
            continue
        high, low = max(group, key=lambda c: c.published), min(group, key=lambda c: c.published)
        rows.append({"gpu": gpu, "model": model, "precision": precision, "spread_pct": round(100 * (high.published
                     / low.published - 1), 1), "floor_pct": round(100 * (math.sqrt(high.published / low.published)
                                                                          - 1), 1),
                     "high": [high.published, high.batch, high.source.split(";")[0]],
                     "low": [low.published, low.batch, low.source.split(";")[0]]})
    spreads = [r["spread_pct"] for r in rows]
    # the same configuration down to the batch, published twice (two systems of one table, or two tables)
    same = defaultdict(list)
    for c in cases:
        if c.gpus == 1:
            same[(c.gpu, c.model, c.precision, c.batch, c.tokens)].append(c.published)
    twice = [math.sqrt(max(v) / min(v)) - 1 for v in same.values() if len(v) > 1]
    return {"configurations": len(rows), "median_spread_pct": statistics.median(spreads) if rows else 0.0,
            "worst_spread_pct": max(spreads, default=0.0),
            "worst_floor_pct": max((r["floor_pct"] for r in rows), default=0.0), "rows": rows,
            "same_batch_configurations": len(twice),
            "same_batch_floor_pct": round(100 * max(twice, default=0.0), 1)}


def memory_check(cases: list[Case]) -> dict:
    """Every published batch ran, so it fit its GPU: how many of them gpurig's memory estimate lets fit, and the
    published batch over the largest batch it predicts (Lambda chose batches near the largest that fits)."""
    from gpurig.predict.memory import memory

    ratios, fits = [], 0
    for c in cases:
        spec, _ = _prepared(c.model, c.batch, c.tokens)
        request = c.request
        m = memory(spec, request, _hardware(request.cluster, request.precision), c.gpus)
        fits += m["fits"]
        ratios.append(c.batch / max(m["largest_batch"], 1))
    return {"rows": len(cases), "fit": fits, "batch_over_largest_median": round(statistics.median(ratios), 2),
            "batch_over_largest_max": round(max(ratios), 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", action="store_true", help="print every single-GPU row")
    p.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    p.add_argument("--cold", action="store_true", help="fit from START, not from the constants perf.machine ships")
    p.add_argument("--no-power", action="store_true",
                   help="leave out the power term (watts per SM), which is otherwise fitted after every other "
                        "constant, with those fixed, in every fold too")
    args = p.parse_args()
    global WITH_POWER
    WITH_POWER = not args.no_power

    from rich.console import Console
    from rich.table import Table

    console = Console()
    cases = load_cases()
    single = [c for c in cases if c.gpus == 1]
    console.print(f"{len(cases)} published rows predictable ({len(single)} on one GPU) of {DATA.name}")
    # the all-rows fit starts from the constants perf.machine ships (the last run's fit; --cold: from START, which
    # took 15 min on two loaded cores), then each fold from it
    shipped = dataclasses.replace(machine.GPU_EFFICIENCY, power_exponent=0.0)
    fitted = fit(single) if args.cold else fit(single, shipped, steps=WARM_STEPS)
    if WITH_POWER:
        fitted = fit_power(single, fitted, machine.GPU_EFFICIENCY)
    console.print("fitted: " + ", ".join(f"{k}={value_of(fitted, k):.4g}"
                                         for k in parameters(single) + (list(POWER) if WITH_POWER else [])))
    in_sample = {id(c): log_error(c, fitted) for c in single}
    # each fold refits every constant without the rows it predicts, starting from the all-rows fit (from START it
    # took hours on two cores); a left-out GPU's architecture factor is reset (fold_start)
    folds = cross_validate(single, {"gpu": lambda c: c.gpu, "model": lambda c: c.model}, fitted, log=sys.stderr)
    by_gpu, by_model = folds["gpu"], folds["model"]
    results = {"fitted": dataclasses.asdict(fitted), "in_sample": summary(list(in_sample.values())),
               "leave_one_gpu_out": summary(list(by_gpu.values())),
               "leave_one_model_out": summary(list(by_model.values()))}

    table = Table(title="predicted vs published samples/s, one GPU: |error|")
    for column in ("errors of", "rows", "median", "worst", "≤10 %", "≤25 %", "Σ|log|"):
        table.add_column(column, justify="left" if column == "errors of" else "right")
    for label, key in (("the fit itself", "in_sample"), ("leave one GPU out", "leave_one_gpu_out"),
                       ("leave one model out", "leave_one_model_out")):
        s = results[key]
        table.add_row(label, str(s["rows"]), f"{s['median_pct']} %", f"{s['worst_pct']} %",
                      f"{s['within_10_pct']} %", f"{s['within_25_pct']} %", f"{s['sum_abs_log']:.2f}")
    console.print(table)

    groups = defaultdict(list)
    for c in single:
        groups[(c.model, c.precision)].append(by_gpu[id(c)])
    per = Table(title="leave one GPU out, by model and precision")
    for column in ("model", "precision", "rows", "median", "worst", "signed median"):
        per.add_column(column, justify="left" if column in ("model", "precision") else "right")
    for (model, precision), errors in sorted(groups.items()):
        s = summary(errors)
        per.add_row(model, precision, str(s["rows"]), f"{s['median_pct']} %", f"{s['worst_pct']} %",
                    f"{100 * (math.exp(statistics.median(errors)) - 1):+.1f} %")
    console.print(per)

    scaled = scaling(cases, fitted)
    if scaled:
        points = [abs(r["points"]) for r in scaled]
        console.print(f"scaling efficiency, {len(scaled)} multi-GPU rows: median {statistics.median(points):.1f} "
                      f"points off, worst {max(points):.1f}")
        results["scaling"] = {"rows": scaled, "median_points": statistics.median(points), "worst_points": max(points)}
    spread = results["sources"] = source_spread(cases)
    console.print(f"the sources themselves: {spread['configurations']} GPU / model / precision triples published by "
                  f"two or more sources differ by a median {spread['median_spread_pct']:.0f} %, at most "
                  f"{spread['worst_spread_pct']:.0f} %: no one prediction of the worst is within "
                  f"{spread['worst_floor_pct']:.0f} % of both; {spread['same_batch_configurations']} configurations "
                  f"published twice at the same batch: no one prediction is within {spread['same_batch_floor_pct']:.0f} "
                  "% of both values of the worst")
    results["memory"] = memory_check(single)
    m = results["memory"]
    console.print(f"memory: {m['fit']} of {m['rows']} published single-GPU batches fit gpurig's estimate; published "
                  f"batch / largest predicted batch: median {m['batch_over_largest_median']}, "
                  f"most {m['batch_over_largest_max']}")
    if args.rows:
        rows = Table(title="every single-GPU row (leave one GPU out)")
        for column in ("model", "GPU", "prec", "batch", "published", "predicted", "error"):
            rows.add_column(column, justify="left" if column in ("model", "GPU", "prec") else "right")
        for c in single:
            e = by_gpu[id(c)]
            rows.add_row(c.model, c.gpu, c.precision, str(c.batch), f"{c.published:.1f}",
                         f"{c.published * math.exp(e):.1f}", f"{100 * (math.exp(e) - 1):+.1f} %")
        console.print(rows)
    if args.json:
        results["rows"] = [{"model": c.model, "gpu": c.gpu, "precision": c.precision, "batch": c.batch,
                            "software": c.software, "published": c.published,
                            "fit_pct": round(100 * (math.exp(in_sample[id(c)]) - 1), 1),
                            "leave_one_gpu_out_pct": round(100 * (math.exp(by_gpu[id(c)]) - 1), 1),
                            "leave_one_model_out_pct": round(100 * (math.exp(by_model[id(c)]) - 1), 1)}
                           for c in single]
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
