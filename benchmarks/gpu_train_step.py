"""Where a small model's training step goes on a GPU: the model alone, then what `gpurig train` adds around it.

    python benchmarks/gpu_train_step.py --out /tmp/gpu_train_step.json      # on a GPU machine (CPU: a check)

`gpurig train` on one GPU measured the MNIST CNN's step at about twice what its
prediction said (docs/predict.md, "Inside gpurig train"), the MLP's within 1-25 %.
For each model, at 128 a step, steps timed back to back (one synchronisation at
the end of each block of steps, medians of blocks), side by side:

- ``plain``: zero_grad, forward, cross-entropy, backward, SGD with momentum, as a
  PyTorch user writes it (no read of the loss: the host runs ahead);
- ``plain, loss read``: the same with ``loss.item()`` each step;
- ``train_step``: gpurig's step (:func:`gpurig.train.step.train_step`: the loss and
  accuracy read each step) on the bare model;
- ``train_step, DataParallel``: the same through a one-rank DataParallel, as
  `gpurig train -n 1` runs it (hooks, bucket copy, the NaN/Inf guard).

and, for the last, the host operators that took the most time per step (torch.profiler).
"""

import argparse
import copy
import json

import torch
import torch.nn.functional as F

import gpurig
from gpurig import models
from gpurig.parallel.mixed_precision import MixedPrecision
from gpurig.timing import device_sync, timed
from gpurig.train.step import train_step


def plain_step(model, optimizer, x, y, read_loss):
    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if read_loss:
            loss.item()
    return step


def gpurig_step(model, dp, optimizer, x, y):
    mixed = MixedPrecision("fp32")

    def step():
        optimizer.zero_grad(set_to_none=True)
        train_step(model, dp, optimizer, x, y, 1, mixed)
    return step


def block_ms(step, sync, steps, blocks):
    """Median over ``blocks`` of the milliseconds a step takes in a block of ``steps`` back-to-back steps."""
    return 1e3 * timed(lambda: [step() for _ in range(steps)], repeats=blocks, sync=sync, typical=True) / steps


def host_operators(step, sync, steps, top):
    """The ``top`` host operators by self time per step under torch.profiler, and the kernels launched per step."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    table = prof.key_averages()
    rows = sorted((e for e in table if e.self_cpu_time_total > 0), key=lambda e: -e.self_cpu_time_total)[:top]
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return ([{"name": e.key, "calls_per_step": e.count / steps, "self_us_per_step": e.self_cpu_time_total / steps}
             for e in rows], kernels / steps)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--blocks", type=int, default=15)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = device_sync(device)
    comm = gpurig.init()
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "batch": args.batch,
              "models": {}}
    for name in ("mlp", "cnn"):
        torch.manual_seed(0)
        base = models.build(name).to(device)
        x = torch.randn(args.batch, 784, device=device)
        y = torch.randint(0, 10, (args.batch,), device=device)

        def sgd(model):
            return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        bare = [copy.deepcopy(base) for _ in range(3)]
        dp = gpurig.DataParallel(copy.deepcopy(base), comm)
        steps = {"plain": plain_step(bare[0], sgd(bare[0]), x, y, False),
                 "plain, loss read": plain_step(bare[1], sgd(bare[1]), x, y, True),
                 "train_step": gpurig_step(bare[2], None, sgd(bare[2]), x, y),
                 "train_step, DataParallel": gpurig_step(dp, dp, sgd(dp), x, y)}
        times = {variant: block_ms(step, sync, args.steps, args.blocks) for variant, step in steps.items()}
        operators, kernels = host_operators(steps["train_step, DataParallel"], sync, args.steps, top=15)
        result["models"][name] = {"step_ms": times, "kernels_per_step": kernels, "host_operators": operators}
        print(f"{name}, {args.batch} a step on {result['device']}: {kernels:.0f} kernels a step")
        for variant, ms in times.items():
            print(f"  {variant:26s} {ms:7.3f} ms")
        for row in operators:
            print(f"    {row['name'][:44]:44s} {row['calls_per_step']:6.1f} calls {row['self_us_per_step']:8.1f} µs")
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
