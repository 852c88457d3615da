"""Will it fit: what one GPU holds for the predicted step, and what to change when it does not fit."""

from __future__ import annotations

import math
from dataclasses import replace

from gpurig.models import model_spec, step_peak
from gpurig.perf.footprint import (OPTIMIZER_STATES, largest_fitting_batch, library_workspaces, step_memory,
                                   usable_bytes)
from gpurig.perf.precision import MIXED
from gpurig.predict.hardware import Hardware
from gpurig.predict.request import PredictRequest, optimizer_impl


def memory(spec, request: PredictRequest, hardware: Hardware, ranks: int) -> dict:
    """What one GPU holds for the step (:mod:`gpurig.perf.footprint`), whether it fits, the largest batch that does.

    >>> from gpurig.predict import predict
    >>> m = predict(PredictRequest(model="bert-large", cluster="1 x RTX 2080 Ti", batch=32, tokens=512))["memory"]
    >>> m["fits"], m["largest_batch"] < 32
    (False, True)
    """
    mixed = request.precision in MIXED
    traced = step_peak(request.model, spec.batch, tokens=request.tokens, sample=request.sample, mixed=mixed)
    if traced is None and mixed and not spec.mixed_saved_bytes:  # summed instead: with the mixed-precision pass
        spec = model_spec(request.model, batch=spec.batch, tokens=request.tokens, sample=request.sample, mixed=True)
    # hybrid: the layers left whole are data-parallel, their gradients averaged in buckets (the split ones' are not)
    data_ranks = ranks if request.parallel in ("data", "hybrid") else 1
    workspaces = library_workspaces(hardware.gpu)
    implementation = optimizer_impl(request)
    parts = step_memory(spec, request.optimizer, mixed, data_ranks, shard=request.shard, traced=traced,
                        workspaces=workspaces, implementation=implementation)
    saved = _not_held_when_split(spec, request, ranks, mixed, parts)
    total = sum(parts.values())
    gpu_gb = hardware.gpu.memory_gb if hardware.gpu is not None else hardware.device_memory_gb
    out = {"parts_gb": {k: round(v / 2**30, 3) for k, v in parts.items()}, "total_gb": round(total / 2**30, 2),
           "gpu_gb": gpu_gb}
    if gpu_gb:
        def largest_at(at_spec, at_traced) -> int:
            # what the split layers leave out is the same at any batch: as much more room for the rest
            return largest_fitting_batch(at_spec, request.optimizer, mixed, data_ranks, gpu_gb + saved / 2**30,
                                         shard=request.shard, traced=at_traced, workspaces=workspaces,
                                         implementation=implementation)

        largest = largest_at(spec, traced)
        # the peak's growth traced at a batch far from the answer (a small one's peak holds more that does not grow)
        # is traced again near it, so the answer does not depend on the batch asked about: at the power of two
        # nearest the answer, which many GPUs share (choose prices dozens; each trace takes seconds)
        near_batch = 2 ** round(math.log2(largest)) if largest else 0
        if traced is not None and largest and not spec.batch / 2 <= near_batch <= 2 * spec.batch:
            near = step_peak(request.model, near_batch, tokens=request.tokens, sample=request.sample, mixed=mixed)
            if near is not None:
                largest = largest_at(replace(spec, batch=near_batch), near)
        out.update(usable_gb=round(usable_bytes(gpu_gb) / 2**30, 2), fits=total <= usable_bytes(gpu_gb),
                   largest_batch=largest)
    return out


def _not_held_when_split(spec, request: PredictRequest, ranks: int, mixed: bool, parts: dict) -> int:
    """Model or hybrid parallelism: each GPU holds 1/``ranks`` of the split layers' weights, gradients, optimizer
    state and AMP copies, and (hybrid) none of their gradients in the data-parallel buckets. Takes that out of
    ``parts`` (in place); returns the bytes taken out.

    >>> from gpurig.models import model_spec
    >>> spec = model_spec("alexnet", batch=32)
    >>> parts = {"weights": 4 * spec.parameters, "gradients": 4 * spec.parameters, "optimizer": 4 * spec.parameters}
    >>> saved = _not_held_when_split(spec, PredictRequest(model="alexnet", parallel="model"), 4, False, parts)
    >>> round(parts["weights"] / (4 * spec.parameters), 2)   # the split pair of dense layers holds 89 % of AlexNet
    0.33
    """
    if request.parallel == "data" or ranks < 2:
        return 0
    from gpurig.perf.footprint import DTYPE_BYTES
    from gpurig.predict.configuration import split_plan

    plan, _, _ = split_plan(request, spec)
    split = sum(spec.layers[i].parameters for i in plan)
    gone = split - split // ranks
    per_parameter = {"weights": DTYPE_BYTES, "gradients": DTYPE_BYTES,
                     "optimizer": DTYPE_BYTES * OPTIMIZER_STATES[request.optimizer], "amp_copies": 2 if mixed else 0}
    saved = 0
    for part, size in per_parameter.items():
        if part in parts:
            cut = min(parts[part], gone * size)
            parts[part] -= cut
            saved += cut
    if parts.get("buckets"):
        cut = min(parts["buckets"], split * DTYPE_BYTES)
        parts["buckets"] -= cut
        saved += cut
    return saved


def fit_advice(spec, request: PredictRequest, hardware: Hardware, ranks: int, needed: dict) -> list[dict]:
    """When the step does not fit one GPU's memory: the changes that would make it fit, first; each item says
    whether it alone ``fits``.

    >>> from gpurig.predict import predict
    >>> advice = predict(PredictRequest(model="bert-large", cluster="4 x RTX 4070", batch=8, tokens=512,
    ...                                 optimizer="adam"))["advice"]
    >>> [(item["what"].split(" (")[0], item["fits"]) for item in advice if "fits" in item]
    [('per-GPU batch 7', True), ('--precision bf16', True), ('--shard optimizer', True), ('--shard gradients', True)]
    """
    if needed.get("fits", True):
        return []
    why = f"{needed['total_gb']:.1f} GiB per GPU needed, {needed['usable_gb']:.1f} GiB usable: it does not fit"
    items = []
    if needed["largest_batch"]:
        items.append({"what": f"per-GPU batch {needed['largest_batch']:,}", "why": why, "samples_per_s_gain": None,
                      "fits": True})
    if request.precision not in MIXED:
        sixteen = "bf16" if hardware.gpu is not None and hardware.gpu.bf16_tflops else "fp16"
        mixed = memory(spec, replace(request, precision=sixteen), hardware, ranks)
        items.append({"what": f"--precision {sixteen} (mixed precision)", "why": f"16-bit activations: "
                      f"{mixed['total_gb']:.1f} GiB, largest batch {mixed['largest_batch']:,}",
                      "samples_per_s_gain": None, "fits": mixed["fits"]})
    if hardware.gpu is not None and optimizer_impl(request) != "fused" and needed["parts_gb"].get("optimizer_working"):
        # the peak is the optimizer's step, and part of it the working copy a fused kernel does not make
        fused = memory(spec, replace(request, optimizer_impl="fused"), hardware, ranks)
        items.append({"what": "--optimizer-impl fused", "why": f"the step's peak is the optimizer's: its "
                      f"{needed['parts_gb']['optimizer_working']:.1f} GiB working copy is none in a fused kernel; "
                      f"{fused['total_gb']:.1f} GiB, largest batch {fused['largest_batch']:,}",
                      "samples_per_s_gain": None, "fits": fused["fits"]})
    if ranks > 1 and request.parallel == "data" and request.shard != "gradients":
        for shard, what in (("optimizer", "optimizer state"), ("gradients", "optimizer state and gradients")):
            if shard == request.shard or (shard == "optimizer" and not OPTIMIZER_STATES[request.optimizer]):
                continue
            sharded = memory(spec, replace(request, shard=shard), hardware, ranks)
            items.append({"what": f"--shard {shard} (ZeRO: {what} split over the {ranks} GPUs)",
                          "why": f"{sharded['total_gb']:.1f} GiB per GPU, largest batch {sharded['largest_batch']:,}; "
                                 "the same bytes on the wire (a reduce-scatter and an allgather instead of the "
                                 "allreduce)", "samples_per_s_gain": None, "fits": sharded["fits"]})
    if not items:
        items.append({"what": "model parallelism or a GPU with more memory", "why": why, "samples_per_s_gain": None})
    return items
