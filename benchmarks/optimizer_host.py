"""The host's share of an optimizer step that runs one tensor at a time, against a layer's forward and backward.

An optimizer implemented as a loop over its parameters (``torch.optim``'s ``foreach=False``, the default before
PyTorch 2.0, and hand-written ones) dispatches a few elementwise operators per tensor. On a GPU each is a
kernel the host launches; a model of hundreds of tensors pays for them at every step, however fast its GPU.
``gpurig predict`` prices that host time per tensor as a share of the fixed cost of one layer's forward and
backward (``layer_overhead_s``, which bench measures and the catalog assumes). This script measures the shares on
this machine's CPU, on tensors of 16 values (so the arithmetic is nothing and the dispatch everything), in the
same process and the same way as ``gpurig bench`` measures the layer's cost::

    .venv/bin/python benchmarks/optimizer_host.py            # about 20 s

It prints each optimizer's host time per tensor and its share; :data:`gpurig.perf.optimizer.FOR_LOOP_HOST_SHARE`
holds the shares it gave (docs/predict.md, "The optimizer as PyTorch runs it").
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from gpurig.measure.compute import layer_overhead_seconds


def lamb_step(params, states, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
    """One LAMB step (You et al., 2019), a tensor at a time: Adam's moments, the update with weight decay, and
    the layer's trust ratio ``‖w‖ / ‖update‖`` scaling it, kept on the device (no host synchronisation)."""
    with torch.no_grad():
        for p, (m, v) in zip(params, states):
            m.lerp_(p.grad, 1 - betas[0])
            v.mul_(betas[1]).addcmul_(p.grad, p.grad, value=1 - betas[1])
            update = m / (v.sqrt() + eps)
            update.add_(p, alpha=weight_decay)
            norm = update.norm()
            ratio = torch.where(norm > 0, p.norm() / norm, torch.ones((), device=p.device))
            p.sub_(update.mul_(ratio * lr))


def timed(fn, repeats: int) -> float:
    """The median seconds of ``fn`` over ``repeats`` calls, after three to warm up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=400, help="parameter tensors a step updates (default 400)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each timing every optimizer (default 5)")
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device("cpu")

    def one_rank(fns):   # gpurig bench's timer on one rank: each function's median of 30 calls
        return [timed(fn, 30) for fn in fns]

    params = [torch.nn.Parameter(torch.randn(16)) for _ in range(args.tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    steps = {
        "sgd": torch.optim.SGD(params, lr=1e-3, foreach=False).step,
        "momentum": torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=False).step,
        "adam": torch.optim.Adam(params, lr=1e-3, foreach=False).step,
        "adamw": torch.optim.AdamW(params, lr=1e-3, foreach=False).step,
    }
    states = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    steps["lamb"] = lambda: lamb_step(params, states)
    layer, per_tensor = [], {name: [] for name in steps}
    for _ in range(args.rounds):
        layer.append(layer_overhead_seconds(device, one_rank))
        for name, step in steps.items():
            per_tensor[name].append(timed(step, 20) / args.tensors)
    layer_s = statistics.median(layer)
    result = {"layer_overhead_s": layer_s, "tensors": args.tensors,
              "per_tensor_s": {name: statistics.median(v) for name, v in per_tensor.items()}}
    result["share"] = {name: round(s / layer_s, 3) for name, s in result["per_tensor_s"].items()}
    print(f"a layer's forward and backward: {layer_s * 1e6:.1f} µs (torch {torch.__version__}, one thread)")
    print(f"{'optimizer, a tensor at a time':32} {'µs per tensor':>14} {'share':>7}")
    for name, seconds in result["per_tensor_s"].items():
        print(f"{name:32} {seconds * 1e6:14.1f} {result['share'][name]:7.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
