"""Is a training step bound by the GPU or by the CPU launching its kernels? (run on a GPU machine)

    python benchmarks/gpu_kernels.py --out /tmp/gpu_kernels.json

For each case (model, batch, precision, as gpu_validation.py sets them up), five
steps under ``torch.profiler``: the kernels launched per step, the GPU's busy
time per step (the sum of its kernels' durations) and the step's wall time.
Busy time well below the wall time means the step waits on the CPU (Python,
dispatch, autocast's casts): the per-operation cost predict charges as
``per_layer_s``; close to it means the GPU's arithmetic and memory set the pace.
``--by-class`` adds each case's busy time by kind of kernel (matrix products,
convolutions, normalization, softmax, elementwise, ...: :func:`kernel_class`),
to hold against predict's split (its GEMMs against its streaming work).
"""

import argparse
import collections
import json
import re
import time

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_validation import training_step
from gpurig.timing import device_sync

CASES = [("bert-base", 8, "fp32"), ("bert-base", 32, "tf32"), ("bert-base", 32, "bf16"), ("bert-base", 64, "bf16"),
         ("resnet50", 64, "bf16"), ("gpt2", 4, "bf16"), ("alexnet", 128, "fp32"), ("mnist-mlp", 64, "fp32")]
# --by-class: GPU-bound steps where predict and a GPU disagree (docs/predict.md, "An H200"): BERT-base and GPT-2 at
# the same tokens a step in FP32 and TF32, ResNet-50 in FP32 (TF32 convolutions) and bf16 on both layouts
CLASS_CASES = [("bert-base", 64, "fp32"), ("bert-base", 64, "tf32"), ("gpt2", 8, "fp32"), ("gpt2", 8, "tf32"),
               ("resnet50", 64, "fp32"), ("resnet50", 64, "bf16"), ("resnet50", 64, "bf16", True)]
# --by-class --held-out: the held-out conv nets predict misses most (docs/predict.md, "An H200"): depthwise
# convolutions in FP32 and bf16, batch norm on NCHW and channels-last; (model, batch, precision, channels-last, sample)
HELD_OUT_CLASS_CASES = [("torchvision.models:mobilenet_v2", 128, "fp32", False, "3x224x224"),
                        ("torchvision.models:mobilenet_v2", 128, "bf16", False, "3x224x224"),
                        ("torchvision.models:efficientnet_b0", 64, "fp32", False, "3x224x224"),
                        ("torchvision.models:resnet18", 128, "bf16", False, "3x224x224"),
                        ("torchvision.models:resnet18", 128, "bf16", True, "3x224x224"),
                        ("torchvision.models:densenet121", 64, "bf16", False, "3x224x224")]
# first match wins: normalization before convolutions (cuDNN's batch norm is "cudnn::bn_..."), convolutions and fused
# attention before matrix products (cuDNN's implicit-GEMM kernels carry "gemm" in their names, PyTorch's
# memory-efficient attention "cutlass")
KERNEL_CLASSES = (("normalization", r"norm|welford|bn_fw|bn_bw"),
                  ("convolution", r"conv|cudnn|implicit|winograd|fprop|dgrad|wgrad|scudnn"),
                  ("attention", r"flash|fmha|attention|sdpa"),
                  ("matmul", r"gemm|cutlass|xmma|nvjet|cublas|wgmma|splitk"),
                  ("softmax", r"softmax"),
                  ("optimizer", r"multi_tensor|foreach|fused_sgd|fused_adam"),
                  ("reduction", r"reduce"),
                  ("layout", r"transpose|nchw|nhwc|permute|copy"),
                  ("elementwise", r"elementwise|vectorized|unrolled|pointwise|triton"))


def parse_case(text: str) -> tuple:
    """A ``--case``: MODEL:BATCH:PRECISION, ``:nhwc`` for channels-last (torchvision's models at 224×224).

    >>> parse_case("resnet50:64:fp16:nhwc"), parse_case("torchvision.models:mobilenet_v2:128:bf16")[:4]
    (('resnet50', 64, 'fp16', True, None), ('torchvision.models:mobilenet_v2', 128, 'bf16', False))
    """
    parts = text.split(":")
    channels_last = parts[-1] == "nhwc"
    *model, batch, precision = parts[:-1] if channels_last else parts
    name = ":".join(model)
    return name, int(batch), precision, channels_last, "3x224x224" if name.startswith("torchvision") else None


def kernel_class(name: str) -> str:
    """The kind of a CUDA kernel, by its name: the first of :data:`KERNEL_CLASSES` whose pattern it matches.

    >>> kernel_class("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32"), kernel_class("cudnn::bn_fw_tr_1C11")
    ('matmul', 'normalization')
    >>> kernel_class("void at::native::vectorized_elementwise_kernel<4, ...>"), kernel_class("memset")
    ('elementwise', 'other')
    >>> kernel_class("fmha_cutlassB_f32_aligned_64x64_k64_dropout_sm80(PyTorchMemEffAttention::AttentionBackwardKernel")
    'attention'

    """
    lowered = name.lower()
    return next((kind for kind, pattern in KERNEL_CLASSES if re.search(pattern, lowered)), "other")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--by-class", action="store_true", help="the cases where predict and a GPU disagree, each's GPU "
                   "time by kind of kernel, its five longest kernels named")
    p.add_argument("--case", action="append", default=[], metavar="MODEL:BATCH:PRECISION[:nhwc]",
                   help="with --by-class: this case instead of the built-in ones (repeatable), e.g. resnet50:64:fp16:nhwc")
    p.add_argument("--held-out", action="store_true", help="with --by-class: torchvision's conv nets predict was "
                   "never tuned on (held_out_models.py), instead of the presets")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    table = (HELD_OUT_CLASS_CASES if args.held_out else CLASS_CASES) if args.by_class else CASES
    if args.case:
        table = [parse_case(text) for text in args.case]
    for name, batch, precision, *rest in table:
        channels_last, sample = (bool(rest[0]) if rest else False), (rest[1] if len(rest) > 1 else None)
        step = training_step(name, batch, precision, channels_last, device, sample)
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
        row = {"model": name, "batch": batch, "precision": precision, "channels_last": channels_last,
               "wall_ms": 1e3 * wall, "gpu_busy_ms": 1e3 * busy, "kernels_per_step": len(kernels) / args.steps,
               "launches_per_step": launches / args.steps}
        if args.by_class:
            by_class, by_name = collections.Counter(), collections.Counter()
            for e in kernels:
                by_class[kernel_class(e.name)] += e.device_time / 1e3 / args.steps
                by_name[e.name[:120]] += e.device_time / 1e3 / args.steps
            row["class_ms"] = dict(by_class.most_common())
            row["longest_ms"] = dict(by_name.most_common(5))
            row["kernel_ms"] = dict(by_name.most_common())  # every kernel, to split a class (depthwise in convolution)
        rows.append(row)
        layout = " NHWC" if channels_last else ""
        print(f"{name.split(':')[-1]:10s} {batch:4d} {precision:5s}{layout} wall {row['wall_ms']:7.2f} ms  "
              f"GPU busy {row['gpu_busy_ms']:7.2f} ms ({row['gpu_busy_ms'] / row['wall_ms']:.0%})  "
              f"{row['kernels_per_step']:.0f} kernels/step", flush=True)
        if args.by_class:
            print("    " + ", ".join(f"{kind} {ms:.2f}" for kind, ms in row["class_ms"].items()), flush=True)
            for kernel, ms in row["longest_ms"].items():
                print(f"      {ms:7.2f} ms  {kernel}", flush=True)
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "rows": rows}, f,
                      indent=2)


if __name__ == "__main__":
    main()
