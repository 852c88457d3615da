"""``gpurig predict``: how fast a model will train on N GPUs and M nodes, and why — before running it.

Three inputs, each the one description the rest of gpurig shares:

- the model, as a :class:`~gpurig.models.describe.ModelSpec` (a preset or any
  ``module:factory``, described on the meta device);
- the hardware: a cluster spec (``gpurig doctor --write-spec``, or a one-line
  catalog description) for catalog GPUs and networks, and/or a machine profile
  (``gpurig bench``) for what this machine measured;
- how it runs: per-GPU batch, data / model / hybrid parallelism, compression.

The answer comes from :mod:`gpurig.perf`: the step split into compute (per
layer), communication not hidden under backward, codec work and data loading;
speed-up and scaling efficiency for 1..N GPUs; the bottleneck; advice.

>>> result = predict(PredictRequest(model="mnist-mlp", cluster="2 nodes x 1 RTX 2080 Ti, 1 Gbit/s Ethernet"))
>>> result["bottleneck"]
'communication'
"""

from __future__ import annotations

from gpurig.errors import UsageError
from gpurig.perf.precision import precision_on
from gpurig.perf.step import StepPrediction, layer_costs
from gpurig.predict.advice import advice
from gpurig.predict.configuration import step_at
from gpurig.predict.hardware import Hardware, load_hardware
from gpurig.predict.memory import fit_advice, memory
from gpurig.predict.request import (DEFAULT_BATCH, PARALLEL, PARALLEL_WHY, PredictRequest, check, optimizer_impl,
                                    uses_profile)


def _stored_note(spec, request: PredictRequest) -> str:
    """What a model whose weights are stored in 16 bits is priced as: ``--precision`` says how it trains (FP32
    master weights and states, 16-bit compute for bf16/fp16); training the 16-bit weights themselves is not priced.

    >>> from gpurig.models import model_spec
    >>> _stored_note(model_spec("mnist-mlp"), PredictRequest(model="mnist-mlp"))
    ''
    """
    stored = {name for name in spec.dtype.split(",") if name in ("bfloat16", "float16")}
    if not stored:
        return ""
    return (f"the model's weights are stored in {' and '.join(sorted(stored))}: priced as --precision "
            f"{request.precision} trains (FP32 weights and optimizer states{', 16-bit compute' if request.precision in ('bf16', 'fp16', 'fp8') else ''}); "
            "training the 16-bit weights themselves is not priced")


def _precision_note(gpu, request: PredictRequest, batch_norm: bool = False, convolutions: bool = True) -> str:
    """What the precision, and the memory format with it, mean on ``gpu`` where that is not what was asked;
    ``batch_norm``: the model has batch norms (bf16 on NCHW tensors runs them on PyTorch's slower kernels);
    ``convolutions``: it has convolutions (fp32's note on a TF32 GPU is about them).

    >>> from gpurig.spec import catalog
    >>> _precision_note(catalog.gpu("A100"), PredictRequest(model="resnet50", precision="tf32", memory_format="channels-last"))
    'channels-last changes only 16-bit tensor-core convolutions (--precision fp16 or bf16): tf32 is priced the same'
    >>> _precision_note(catalog.gpu("A100"), PredictRequest(model="resnet50", precision="fp16", memory_format="channels-last"))
    ''
    >>> _precision_note(catalog.gpu("A100"), PredictRequest(model="resnet50", precision="bf16"), batch_norm=True)[:61]
    "bf16 batch norm on NCHW tensors runs PyTorch's own kernels, a"
    >>> _precision_note(catalog.gpu("A100"), PredictRequest(model="bert-base"), convolutions=False)
    "matrix multiplies in FP32 (PyTorch's default; --precision tf32 runs them on the tensor cores)"
    """
    from gpurig.perf.precision import MIXED, pytorch_nchw_batch_norm

    if gpu is None:
        return ""
    p = precision_on(gpu, request.precision)
    notes = [p.note] if p.note else []
    if request.precision == "fp32" and p.conv_tensor_cores and not convolutions:   # the TF32 part is the convolutions'
        notes = ["matrix multiplies in FP32 (PyTorch's default; --precision tf32 runs them on the tensor cores)"]
    if request.memory_format != "contiguous" and not (request.precision in MIXED and p.conv_tensor_cores):
        notes.append(f"{request.memory_format} changes only 16-bit tensor-core convolutions (--precision fp16 or "
                     f"bf16): {request.precision} is priced the same")
    if batch_norm and pytorch_nchw_batch_norm(request.precision, request.memory_format):
        notes.append("bf16 batch norm on NCHW tensors runs PyTorch's own kernels, a block per channel: 1.4-5x "
                     "their channels-last time (cuDNN's take fp16, not bf16)")
    return "; ".join(notes)


def predict(request: PredictRequest) -> dict:
    """Everything ``gpurig predict`` prints: the step split at the largest size, the scaling curve, advice."""
    from gpurig.models import model_spec, sequence_length

    check(request)
    hardware = load_hardware(request)
    if request.gpus and request.gpus > hardware.max_ranks and not uses_profile(request):
        raise UsageError(f"--gpus {request.gpus}: the cluster has {hardware.max_ranks} GPU"
                         f"{'s' * (hardware.max_ranks != 1)}; describe more (e.g. '4 nodes x 8 ...') or ask for fewer")
    top = request.gpus or hardware.max_ranks
    if request.compression != "none" and (top == 1 or request.parallel == "model"):  # taken, then ignored
        where = "on 1 GPU" if top == 1 else "with --parallel model"
        raise UsageError(f"--compression {request.compression}: gradients are compressed when GPUs average them, "
                         f"and {where} none are")
    if top == 1 and request.shard != "none":
        raise UsageError(f"--shard {request.shard}: the state is split over the GPUs that average gradients, and on "
                         "1 GPU there is nothing to split it over")
    if top == 1 and request.algorithm != "best":
        raise UsageError(f"--algorithm {request.algorithm}: an allreduce's algorithm, and on 1 GPU there is none")
    if top == 1 and request.parallel != "data":
        raise UsageError(f"--parallel {request.parallel} splits layers over GPUs, and on 1 GPU there is nothing to "
                         f"split them over")
    if request.network_efficiency is not None and (uses_profile(request) or hardware.topology_for(top).nodes == 1):
        why = "the profile measured its links" if uses_profile(request) else f"{top} GPU(s) on one machine use none"
        raise UsageError(f"--network-efficiency {request.network_efficiency:g} scales a catalog network's rate, and "
                         f"{why}")
    batch = request.batch or DEFAULT_BATCH.get(request.model, 64)
    spec = model_spec(request.model, batch=batch, tokens=request.tokens, sample=request.sample)
    if not spec.trainable_parameters:   # torch's backward() would refuse it, and DDP the module
        raise UsageError(f"--model {request.model} has no weights to train (no parameter that requires grad)")
    if request.memory_format == "channels-last" and not any(layer.module == "Conv2d" for layer in spec.layers):
        has = sorted({layer.module for layer in spec.layers if layer.kind == "conv"})
        raise UsageError(f"--memory-format channels-last lays out 2-D convolutions' activations, and {request.model} "
                         f"has none{' (its ' + ', '.join(has) + ' would need another layout)' if has else ''}: "
                         "leave the flag out")
    layers = layer_costs(spec)

    counts = sorted({1, *[2**i for i in range(1, 20) if 2**i < top], top})
    single = step_at(spec, layers, request, hardware, 1).step_s
    curve = []
    for n in counts:
        step = step_at(spec, layers, request, hardware, n)
        curve.append(_point(n, n * batch, step, n * single / step.step_s, hardware))
    final = step_at(spec, layers, request, hardware, top)
    result = {
        "model": spec.name, "parameters": spec.parameters, "trainable_parameters": spec.trainable_parameters,
        "batch_per_gpu": batch, "tokens": sequence_length(request.model, request.tokens), "gpus": top,
        "unit": hardware.unit,
        "nodes": hardware.topology_for(top).nodes, "hardware": hardware.name, "calibration": hardware.source,
        "gpu": " + ".join(gpu.name for gpu, _ in hardware.gpu_models) if len(hardware.gpu_models) > 1
        else hardware.gpu.name if hardware.gpu is not None else None, "hardware_note": hardware.note,
        "parallel": request.parallel, "compression": request.compression, "precision": request.precision,
        "shard": request.shard, "software": request.software, "memory_format": request.memory_format,
        "optimizer": request.optimizer,
        "optimizer_impl": optimizer_impl(request) if hardware.gpu is not None else None,   # a profile: as bench ran it
        "precision_note": "; ".join(filter(None, (_precision_note(hardware.gpu, request,
                                                                  any(layer.batch_norm for layer in layers),
                                                                  any(layer.kind == "conv" for layer in layers)),
                                                  _stored_note(spec, request)))),
        "samples_per_s": top * batch / final.step_s,
        "step": split_of(final), "bottleneck": final.bottleneck(),
        "buckets": final.buckets, "layers": final.layers,
        "scaling": curve, "scaling_label": WEAK_LABEL.format(batch=batch),
        "strong_scaling": (strong := strong_scaling(request, hardware, batch, counts, single)),
        "strong_scaling_label": STRONG_LABEL.format(batch=batch) + "".join(
            f"; on {r['gpus']} GPUs each takes {r['batch_per_gpu']} ({r['global_batch']} in all: {batch} does not "
            f"divide)" for r in strong if r["global_batch"] != batch) + (
            f"; it stops at {strong[-1]['gpus']} GPUs: {batch} samples give {counts[len(strong)]} GPUs less than "
            f"one each" if len(strong) < len(counts) else ""),
        "memory": memory(spec, request, hardware, top),
    }
    result["utilization"] = expected_utilization(spec, request, hardware, top, final.step_s)
    fitting = fit_advice(spec, request, hardware, top, result["memory"])
    faster = advice(spec, layers, request, hardware, top, final, result["memory"].get("largest_batch"))
    for item in fitting:   # a change that both fits and speeds up is one item, with its gain
        same = [other for other in faster if other["what"].split(" (")[0] == item["what"].split(" (")[0]
                and (other["samples_per_s_gain"] or 0) > 1]
        if same:
            item["samples_per_s_gain"] = same[0]["samples_per_s_gain"]
            faster.remove(same[0])
    result["advice"] = fitting + faster
    return result


def expected_utilization(spec, request: PredictRequest, hardware: Hardware, gpus: int, step_s: float) -> dict:
    """The achieved TFLOP/s per GPU and MFU the predicted step implies (data parallelism: each GPU runs the
    model on its batch), against the GPU's catalog peak in the request's precision (convolutions' and matrix
    multiplies' peaks blended by their FLOPs: :func:`~gpurig.perf.utilization.blended_peak`) or the profile's
    GEMM rate.

    >>> request = PredictRequest(model="mnist-mlp", cluster="2 GTX 980, PCIe 3.0 x8")
    >>> from gpurig.models import model_spec
    >>> u = expected_utilization(model_spec("mnist-mlp", 64), request, load_hardware(request), 2, 0.01)
    >>> u["peak_tflops"], round(u["tflops_per_gpu"], 3), round(u["mfu"], 4)
    (4.981, 0.08, 0.016)
    """
    from gpurig.perf.precision import precision_on
    from gpurig.perf.utilization import achieved_flops_per_s, blended_peak, flops_by_kind, mfu, training_flops

    if request.parallel != "data":
        return {"mfu": None, "note": "MFU is predicted for --parallel data only"}
    flops = training_flops(spec.forward_flops, spec.backward_flops)
    if hardware.gpu is not None:
        def peak_of(gpu) -> float:
            rates = precision_on(gpu, request.precision)
            return blended_peak(flops_by_kind(spec), {"conv": rates.conv_tflops * 1e12}, rates.linear_tflops * 1e12)

        # several GPU models: the mean of the GPUs' peaks, each model counted as often as the cluster has it
        models = hardware.gpu_models or ((hardware.gpu, 1),)
        peak = sum(peak_of(gpu) * n for gpu, n in models) / sum(n for _, n in models)
        source = "catalog"
    else:
        peak, source = hardware.device_for(min(gpus, hardware.ranks_per_node)).gemm.flops_per_s, "profile"
    return {"tflops_per_gpu": achieved_flops_per_s(flops, step_s) / 1e12, "peak_tflops": round(peak / 1e12, 3),
            "peak_source": source, "mfu": mfu(flops, step_s, peak, 1), "flops_per_step_per_gpu": flops}


WEAK_LABEL = "weak scaling: {batch} samples per GPU, the global batch grows with the GPUs"
STRONG_LABEL = "strong scaling: a global batch of {batch} split over the GPUs (as the posts compare)"


def _point(n: int, global_batch: int, step: StepPrediction, speedup: float, hardware: Hardware) -> dict:
    return {"gpus": n, "nodes": hardware.topology_for(n).nodes, "global_batch": global_batch,
            "batch_per_gpu": global_batch // n, "step_ms": 1000 * step.step_s, "speedup": speedup,
            "efficiency": speedup / n, "bottleneck": step.bottleneck()}


def strong_scaling(request: PredictRequest, hardware: Hardware, batch: int, counts: list[int],
                   single_s: float) -> list[dict]:
    """Speed-up at a fixed global batch (``batch``, what one GPU runs) split over N GPUs: samples per second
    against one GPU's. GPU counts that would get less than one sample each are left out; where ``batch`` does not
    divide, each GPU takes ``batch // N`` and the speed-up is counted in samples.

    >>> rows = strong_scaling(PredictRequest(model="mnist-mlp", cluster="4 GTX 980, PCIe 3.0 x4"),
    ...                       load_hardware(PredictRequest(model="mnist-mlp", cluster="4 GTX 980, PCIe 3.0 x4")),
    ...                       128, [1, 2, 4], 1.0)
    >>> [(r["gpus"], r["batch_per_gpu"], r["global_batch"]) for r in rows]
    [(1, 128, 128), (2, 64, 128), (4, 32, 128)]
    """
    from gpurig.models import model_spec

    rows = []
    for n in counts:
        per_gpu = batch // n
        if per_gpu < 1:
            break
        spec = model_spec(request.model, batch=per_gpu, tokens=request.tokens, sample=request.sample)
        step = step_at(spec, layer_costs(spec), request, hardware, n)
        if n == 1:
            single_s = step.step_s
        rows.append(_point(n, per_gpu * n, step, (per_gpu * n / step.step_s) / (batch / single_s), hardware))
    return rows


def split_of(step: StepPrediction) -> dict:
    """A predicted step in ``gpurig train``'s terms, milliseconds."""
    return {"step_ms": 1000 * step.step_s, "compute_ms": 1000 * step.compute_s, "forward_ms": 1000 * step.forward_s,
            "backward_ms": 1000 * step.backward_s, "optimizer_ms": 1000 * step.optimizer_s,
            "comm_ms": 1000 * step.comm_s, "wait_ms": 1000 * step.wait_s, "comm_total_ms": 1000 * step.comm_total_s,
            "codec_ms": 1000 * step.codec_s, "data_ms": 1000 * step.data_s, "host_ms": 1000 * step.host_s}


def predicted_split(model: str, profile_path: str, ranks: int, per_rank_batch: int, compression: str,
                    parallel: str, engine: str, shard: str = "none", optimizer: str = "momentum") -> dict:
    """What ``gpurig train`` prints next to its measured split: the predicted step for the same configuration.

    >>> predicted_split("mlp", "runs/train/profile.json", 2, 64, "int8", "data", "mpi")["step_ms"]   # doctest: +SKIP
    36.2
    """
    request = PredictRequest(model=f"mnist-{model}", cluster=profile_path, batch=per_rank_batch, gpus=ranks,
                             compression=compression, parallel=parallel, engine=engine, shard=shard,
                             optimizer=optimizer)
    return predict(request)["step"]


__all__ = ["PredictRequest", "predict", "predicted_split", "split_of", "Hardware", "load_hardware", "PARALLEL",
           "PARALLEL_WHY", "DEFAULT_BATCH"]
