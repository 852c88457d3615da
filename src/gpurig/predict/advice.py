"""What would make a predicted step faster, each item itself predicted: the batch, compression, the parallelism,
a faster network or PCIe."""

from __future__ import annotations

from dataclasses import replace

from gpurig.errors import UsageError
from gpurig.perf.collectives import Topology
from gpurig.perf.step import StepPrediction, layer_costs
from gpurig.predict.configuration import step_at
from gpurig.predict.hardware import Hardware
from gpurig.predict.memory import memory
from gpurig.predict.request import PARALLEL, PARALLEL_WHY, PredictRequest

# forward and backward at least this close to the host's launches: the step is the host's
HOST_BOUND = 0.98


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
    if ranks > 1 and step.bottleneck() == "communication":
        for method in ("fp16", "int8", "powersgd"):
            if method == request.compression:
                continue
            predicted = step_at(spec, layers, replace(request, compression=method), hardware, ranks)
            items.append({"what": f"--compression {method}", "why": "the network is the bottleneck: "
                          f"{1000 * step.comm_s:.1f} ms of each step wait for gradients",
                          "samples_per_s_gain": gain(predicted)})
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
    if hardware.host_to_device_bytes_per_s and step.data_s > 0.05 * step.step_s:
        items.append({"what": "pinned memory and asynchronous loading", "why": f"{1000 * step.data_s:.1f} ms of "
                      "each step move the batch to the GPU", "samples_per_s_gain": None})
    return items


def _faster_network(topology: Topology, factor: float) -> Topology:
    from gpurig.perf.collectives import Link

    def faster(link):
        return Link(link.latency_s, link.bytes_per_s * factor)

    if topology.nodes > 1:
        return replace(topology, network=faster(topology.network))
    return replace(topology, local=faster(topology.local))
