"""A training step with some layers split over the ranks (model parallelism), or Krizhevsky's hybrid.

The split layers are pairs, as gpurig and Megatron-LM run them: a *column*
layer (output features split: each rank computes n/P of them) feeding a
*row* layer (input features split: each rank multiplies its k/P, partial
results added). Per step, P ranks, global batch B, a pair of widths d_in →
(hidden) → d_out:

- **model**: every rank runs every layer on the whole batch B (the split ones
  on their slice); forward allreduces the row layer's B × d_out outputs (B × T
  × d_out for a layer applied at each of T positions, a transformer's tokens),
  backward the column layer's B × d_in input gradient (not when that input is
  the data). Nothing else is exchanged: every rank saw the same batch.
- **hybrid**: what comes before the pair runs data-parallel on B / P samples
  per rank; before the column layer the ranks' activations are gathered (B ×
  d_in), after the row layer the outputs reduce-scattered (each rank its rows);
  backward the mirror (allgather of B × d_out gradients, reduce-scatter of B ×
  d_in). The replicated layers' gradients are averaged as in data parallelism,
  as backward produces them.

These exchanges sit on the critical path (the next layer needs them); only the
replicated gradients' allreduce can hide under backward.
"""

from __future__ import annotations

from dataclasses import replace

from gpurig.perf import optimizer as optimizer_cost
from gpurig.perf import overlap
from gpurig.perf.collectives import Topology, allreduce_seconds, ring_seconds
from gpurig.perf.compute import DTYPE_BYTES
from gpurig.perf.step import (OPS_PER_MEASURED_LAYER, Device, LayerCost, StepPrediction, layer_seconds,
                              straggler_seconds)

MODES = ("model", "hybrid")


def split_layer(layer: LayerCost, how: str, ranks: int) -> LayerCost:
    """One rank's share of a split layer: its GEMMs' n (column) or k (row) divided by the ranks.

    >>> l = LayerCost("fc", 1000 * 100, ((64, 1000, 100),), ((1000, 100, 64), (64, 100, 1000)))
    >>> split_layer(l, "column", 4).forward_gemms, split_layer(l, "row", 4).forward_gemms
    (((64, 250, 100),), ((64, 1000, 25),))
    """
    def cut(gemm, role):  # role: which dimension of this product is the split one
        m, n, k, *rest = gemm
        if role == "n":
            return (m, max(1, n // ranks), k, *rest)
        if role == "k":
            return (m, n, max(1, k // ranks), *rest)
        return (max(1, m // ranks), n, k, *rest)

    # forward (m, n, k) -> backward dW (n, k, m), dX (m, k, n): the split dimension moves with it
    # (column: n is split, so dW's m and dX's k; row: k is split, so dW's n and dX's n)
    if how == "column":
        forward = tuple(cut(g, "n") for g in layer.forward_gemms)
        backward = tuple(cut(g, "m" if i % 2 == 0 else "k") for i, g in enumerate(layer.backward_gemms))
    else:
        forward = tuple(cut(g, "k") for g in layer.forward_gemms)
        backward = tuple(cut(g, "n") for g in layer.backward_gemms)
    trainable = None if layer.trainable_sizes is None else tuple(size // ranks for size in layer.trainable_sizes)
    return replace(layer, params=layer.params // ranks, trainable_sizes=trainable, forward_gemms=forward,
                   backward_gemms=backward,
                   forward_bytes=layer.forward_bytes / ranks, backward_bytes=layer.backward_bytes / ranks,
                   forward_vector_bytes=layer.forward_vector_bytes / ranks,
                   backward_vector_bytes=layer.backward_vector_bytes / ranks,
                   forward_float32_bytes=layer.forward_float32_bytes / ranks,
                   backward_float32_bytes=layer.backward_float32_bytes / ranks)


def predict_split_step(whole: list[LayerCost], per_rank: list[LayerCost], plan: dict[int, str],
                       widths: dict[int, tuple[int, int]], device: Device, topology: Topology, mode: str,
                       global_batch: int, input_is_data: set[int], optimizer: str = "momentum",
                       optimizer_impl: str = "fused") -> StepPrediction:
    """Predict one step with the layers in ``plan`` (index → "column"/"row") split over ``topology``'s ranks.

    ``whole`` describes every layer at the global batch, ``per_rank`` at the
    batch one rank gets in data parallelism; ``widths`` gives each split
    layer's (input, output) features; ``input_is_data`` the column layers fed
    by the input itself (no input gradient to exchange); the optimizer runs as ``optimizer_impl``
    (:mod:`gpurig.perf.optimizer`) over the tensors this rank holds.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    ranks = topology.ranks
    link = topology.slowest()
    first_split, last_split = min(plan), max(plan)
    costs, comm, params_here = [], 0.0, 0
    replicated = []  # (index, params) of layers whose gradients are averaged (hybrid)
    for i, (full, mine) in enumerate(zip(whole, per_rank)):
        if i in plan:
            layer = split_layer(full, plan[i], ranks)
            d_in, d_out = widths[i]
            # a layer applied at each of a sample's positions (a transformer's tokens) exchanges them all
            positions = max(1, round(full.output_values / (global_batch * d_out))) if full.output_values else 1
            if plan[i] == "column":
                rows = global_batch * positions * d_in * DTYPE_BYTES
                if mode == "hybrid":
                    comm += ring_seconds(rows, ranks, link, phases=1)                    # gather activations
                    if i not in input_is_data:
                        comm += ring_seconds(rows, ranks, link, phases=1)                # reduce-scatter their grad
                elif i not in input_is_data:
                    comm += allreduce_seconds(rows, topology, "ring")                    # the input's gradient
            else:
                rows = global_batch * positions * d_out * DTYPE_BYTES
                if mode == "hybrid":
                    comm += 2 * ring_seconds(rows, ranks, link, phases=1)                # reduce-scatter, allgather
                else:
                    comm += allreduce_seconds(rows, topology, "ring")                    # add the partial outputs
                replicated.append((i, d_out))                                           # the row bias, whole
        else:
            layer = full if (mode == "model" or first_split <= i <= last_split) else mine
            if mode == "hybrid" and sum(layer.gradients()):
                replicated.append((i, sum(layer.gradients())))
        params_here += sum(layer.gradients())
        costs.append(layer)
    per_layer = [layer_seconds(layer, device) for layer in costs]
    forward = sum(f for f, _ in per_layer)
    backward = sum(b for _, b in per_layer)
    sizes = [size for layer in costs for size in layer.gradients() if size]
    optimizer_s = optimizer_cost.step_seconds(optimizer, optimizer_impl, sizes, device.memory_bytes_per_s,
                                              device.layer_overhead_s, device.layer_overhead_s / OPS_PER_MEASURED_LAYER)
    exposed = total = 0.0
    if replicated and ranks > 1:
        # one bucket of the replicated gradients, ready when backward has passed the earliest of them
        done, ready = 0.0, {}
        for i in reversed(range(len(costs))):
            done += per_layer[i][1]
            ready[i] = done
        values = sum(p for _, p in replicated)
        total = allreduce_seconds(values * DTYPE_BYTES, topology, "ring")
        exposed = overlap.exposed_seconds([backward - max(ready[i] for i, _ in replicated)], [total])
    return StepPrediction(forward_s=forward, backward_s=backward, optimizer_s=optimizer_s,
                          comm_total_s=comm + total, comm_s=comm + exposed, codec_s=0.0, data_s=0.0, buckets=[],
                          layers=[{"name": layer.name, "forward_s": f, "backward_s": b, "params": layer.params}
                                  for layer, (f, b) in zip(costs, per_layer)],
                          wait_s=straggler_seconds(forward + backward + optimizer_s, device.jitter, ranks))
