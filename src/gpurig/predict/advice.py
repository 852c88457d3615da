"""What would make a predicted step faster, each item itself predicted: the batch, compression, the parallelism,
a faster network or PCIe, faster kernels (TF32, mixed precision, channels-last, a fused optimizer)."""

from __future__ import annotations

from dataclasses import replace

from gpurig.errors import UsageError
from gpurig.perf.collectives import Topology
from gpurig.perf.step import StepPrediction, layer_costs
from gpurig.predict.configuration import step_at
from gpurig.predict.hardware import Hardware, load_hardware
from gpurig.predict.memory import memory
from gpurig.predict.request import PARALLEL, PARALLEL_WHY, PredictRequest, optimizer_impl

# forward and backward at least this close to the host's launches: the step is the host's
HOST_BOUND = 0.98
# a kernel choice (precision, memory format) is advised when predicted at least this much faster
CHOICE_WORTH = 1.02


def advice(spec, layers, request: PredictRequest, hardware: Hardware, ranks: int, step: StepPrediction,
           largest_batch: int | None = None) -> list[dict]:
    """What would make this faster, each item predicted: batch size, compression, a faster network or PCIe.
    ``largest_batch``: the largest per-GPU batch that fits (:func:`gpurig.predict.memory.memory`), when known:
    a larger batch is advised only up to it."""
    from gpurig.parallel.sharding import tile_advice
    from gpurig.models import model_spec

    items = []
    base_rate = ranks * spec.batch / step.step_s

    def gain(other_step: StepPrediction, other_batch: int | None = None) -> float:
        return ranks * (other_batch or spec.batch) / other_step.step_s / base_rate

    rule = tile_advice(spec.batch)
    better = max(64, -(-spec.batch // 64) * 64)
    if rule and (better <= largest_batch if largest_batch is not None else
                 memory(model_spec(request.model, batch=better, tokens=request.tokens, sample=request.sample),
                        request, hardware, ranks).get("fits", True)):
        other = model_spec(request.model, batch=better, tokens=request.tokens, sample=request.sample)
        predicted = step_at(other, layer_costs(other), request, hardware, ranks)
        items.append({"what": f"per-GPU batch {better}",
                      "why": f"{rule}; the global batch becomes {better * ranks} (from {spec.batch * ranks}): "
                             "the optimisation changes with it (learning rate, epochs to converge)",
                      "samples_per_s_gain": gain(predicted, better)})
    if ranks > 1 and step.comm_s > 0:   # any communication left unhidden (listed only where predicted faster)
        waits = f"{1000 * step.comm_s:.1f} ms of each step wait for gradients"
        for method in ("fp16", "int8", "powersgd"):
            if method == request.compression:
                continue
            predicted = step_at(spec, layers, replace(request, compression=method), hardware, ranks)
            items.append({"what": f"--compression {method}",
                          "why": f"the network is the bottleneck: {waits}" if step.bottleneck() == "communication"
                          else waits, "samples_per_s_gain": gain(predicted)})
        topology = hardware.topology_for(ranks)
        faster = replace(hardware, topology_for=lambda n, _h=hardware: _faster_network(_h.topology_for(n), 10))
        predicted = step_at(spec, layers, request, faster, ranks)
        tier = "network" if topology.nodes > 1 else "link between GPUs"
        items.append({"what": f"a 10x faster {tier}", "why": "what the link, not the GPU, costs",
                      "samples_per_s_gain": gain(predicted)})
    if ranks > 1:
        for mode in PARALLEL:
            if mode == request.parallel:
                continue
            try:
                predicted = step_at(spec, layers, replace(request, parallel=mode), hardware, ranks)
            except UsageError:
                break  # nothing to split
            items.append({"what": f"--parallel {mode}", "why": PARALLEL_WHY[mode],
                          "samples_per_s_gain": gain(predicted)})
    if step.host_s and step.host_s >= HOST_BOUND * (step.forward_s + step.backward_s):
        # the GPU waits for the host's launches: a larger batch costs the host nothing more until its kernels
        # catch up, and fusing operators (torch.compile, CUDA graphs) launches fewer of them
        twice = 2 * spec.batch
        if not rule and (largest_batch is None or twice <= largest_batch):  # (else the tile rule's batch is advised)
            other = model_spec(request.model, batch=twice, tokens=request.tokens, sample=request.sample)
            predicted = step_at(other, layer_costs(other), request, hardware, ranks)
            items.append({"what": f"per-GPU batch {twice}", "why": f"the host's launches ({1000 * step.host_s:.1f} "
                          "ms a step) outlast the GPU's kernels: twice the samples cost it no more launches; the "
                          "optimisation changes with the batch", "samples_per_s_gain": gain(predicted, twice)})
        items.append({"what": "torch.compile or CUDA graphs", "why": f"the host launches the step's operators one "
                      f"by one ({1000 * step.host_s:.1f} ms), longer than the GPU computes them: fused or "
                      "replayed, it launches far fewer", "samples_per_s_gain": None})
    for what, changed, why in kernel_choices(spec, request, hardware):
        try:
            other = load_hardware(changed)
            if not memory(spec, changed, other, ranks).get("fits", True):
                continue
            predicted = step_at(spec, layers, changed, other, ranks)
        except UsageError:  # a measured profile prices only what it ran
            continue
        if gain(predicted) > CHOICE_WORTH:
            items.append({"what": what, "why": why, "samples_per_s_gain": gain(predicted)})
    implementation = optimizer_impl(request)
    if hardware.gpu is not None and implementation != "fused":
        predicted = step_at(spec, layers, replace(request, optimizer_impl="fused"), hardware, ranks)
        if gain(predicted) > CHOICE_WORTH:
            items.append({"what": "--optimizer-impl fused", "why": f"torch.optim's fused=True: one kernel for the "
                          f"whole update, where {implementation} takes {1000 * step.optimizer_s:.1f} ms a step "
                          f"(docs/predict.md)", "samples_per_s_gain": gain(predicted)})
    if hardware.host_to_device_bytes_per_s and step.data_s > 0.05 * step.step_s:
        items.append({"what": "pinned memory and asynchronous loading", "why": f"{1000 * step.data_s:.1f} ms of "
                      "each step move the batch to the GPU", "samples_per_s_gain": None})
    return items


def kernel_choices(spec, request: PredictRequest, hardware: Hardware) -> list[tuple[str, PredictRequest, str]]:
    """The one-line changes to a training script that run a GPU's step on faster kernels, as (flag, the request
    with it, why): TF32 matrix multiplies where the GPU has TF32 and the step runs FP32 (PyTorch's default);
    automatic mixed precision in the GPU's 16-bit type; channels-last activations for a convolutional net in mixed
    precision, whose NCHW tensors cuDNN transposes around each convolution; fp16 for a net with batch norms in bf16 on
    NCHW tensors (cuDNN's batch norm takes fp16, not bf16). None on a CPU.

    >>> from gpurig.models import model_spec
    >>> from gpurig.predict.hardware import load_hardware
    >>> def flags(model, gpu, precision="fp32"):
    ...     request = PredictRequest(model=model, cluster=f"1 x {gpu}", precision=precision)
    ...     return [what for what, _, _ in kernel_choices(model_spec(model, 64), request, load_hardware(request))]
    >>> flags("bert-base", "A100"), flags("bert-base", "V100")
    (['--precision tf32', '--precision bf16'], ['--precision fp16'])
    >>> flags("resnet50", "H100", "bf16"), flags("resnet50", "H100", "fp16"), flags("bert-base", "H100", "bf16")
    (['--memory-format channels-last', '--precision fp16'], ['--memory-format channels-last'], [])
    """
    from gpurig.perf.precision import MIXED, pytorch_nchw_batch_norm

    gpu = hardware.gpu
    if gpu is None:
        return []
    choices = []
    if request.precision == "fp32" and gpu.tf32_tflops and any(layer.kind == "linear" for layer in spec.layers):
        choices.append(("--precision tf32", replace(request, precision="tf32"),
                        "matrix multiplies on the TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32 = "
                        "True); PyTorch runs them in FP32 by default, convolutions already in TF32"))
    if request.precision in ("fp32", "tf32"):
        sixteen = "bf16" if gpu.bf16_tflops else "fp16" if gpu.tensor_tflops else None
        how = "torch.autocast(dtype=torch.bfloat16)" if sixteen == "bf16" else \
            "torch.autocast(dtype=torch.float16) and a GradScaler"
        if sixteen:
            choices.append((f"--precision {sixteen}", replace(request, precision=sixteen),
                            f"automatic mixed precision ({how}): products on the 16-bit tensor cores, half the "
                            "activations' bytes"))
    nchw = request.precision in MIXED and request.memory_format == "contiguous"
    slow_norms = pytorch_nchw_batch_norm(request.precision, request.memory_format) \
        and any(layer.batch_norm for layer in spec.layers)
    if nchw and any(layer.kind == "conv" for layer in spec.layers):
        choices.append(("--memory-format channels-last", replace(request, memory_format="channels-last"),
                        "model.to(memory_format=torch.channels_last) and the same for each batch: cuDNN's 16-bit "
                        "convolutions run NHWC, and NCHW tensors are transposed around each of them"
                        + ("; bf16 batch norm runs PyTorch's fast NHWC kernels" if slow_norms else "")))
    if slow_norms and gpu.tensor_tflops:
        choices.append(("--precision fp16", replace(request, precision="fp16"),
                        "torch.autocast(dtype=torch.float16) and a GradScaler: on NCHW tensors cuDNN's batch norm "
                        "takes fp16, not bf16 (PyTorch's own NCHW kernels are slower)"))
    return choices


def _faster_network(topology: Topology, factor: float) -> Topology:
    from gpurig.perf.collectives import Link

    def faster(link):
        return Link(link.latency_s, link.bytes_per_s * factor)

    if topology.nodes > 1:
        return replace(topology, network=faster(topology.network))
    return replace(topology, local=faster(topology.local))
