"""Is a training step bound by the GPU or by the CPU launching its kernels? (run on a GPU machine)

    python benchmarks/gpu_kernels.py --out /tmp/gpu_kernels.json

For each case (model, batch, precision, as gpu_validation.py sets them up), five
steps under ``torch.profiler``: the kernels launched per step, the GPU's busy
time per step (the sum of its kernels' durations) and the step's wall time.
Busy time well below the wall time means the step waits on the CPU (Python,
dispatch, autocast's casts): the per-operation cost predict charges as
``per_layer_s``; close to it means the GPU's arithmetic and memory set the pace.
"""

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_validation import training_step
from gpurig.timing import device_sync

CASES = [("bert-base", 8, "fp32"), ("bert-base", 32, "tf32"), ("bert-base", 32, "bf16"), ("bert-base", 64, "bf16"),
         ("resnet50", 64, "bf16"), ("gpt2", 4, "bf16"), ("alexnet", 128, "fp32"), ("mnist-mlp", 64, "fp32")]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for name, batch, precision in CASES:
        step = training_step(name, batch, precision, False, device)
        sync = device_sync(device)
        for _ in range(3):
            step()
        sync()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            sync()
            wall = (time.perf_counter() - start) / args.steps
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.device_time for e in kernels) / 1e6 / args.steps  # device_time is in µs
        launches = sum(1 for e in prof.events() if e.name in ("cudaLaunchKernel", "cuLaunchKernel",
                                                               "cudaLaunchKernelExC", "cuLaunchKernelEx"))
        row = {"model": name, "batch": batch, "precision": precision, "wall_ms": 1e3 * wall,
               "gpu_busy_ms": 1e3 * busy, "kernels_per_step": len(kernels) / args.steps,
               "launches_per_step": launches / args.steps}
        rows.append(row)
        print(f"{name:10s} {batch:4d} {precision:5s} wall {row['wall_ms']:7.2f} ms  GPU busy {row['gpu_busy_ms']:7.2f} ms"
              f" ({row['gpu_busy_ms'] / row['wall_ms']:.0%})  {row['kernels_per_step']:.0f} kernels/step", flush=True)
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "rows": rows}, f,
                      indent=2)


if __name__ == "__main__":
    main()
