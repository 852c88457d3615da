"""``gpurig predict`` on the command line: flags in, tables, a plot and JSON out (the model is in predict.py)."""

from __future__ import annotations

import argparse
import json

from gpurig.cli.common import HelpFormatter, WIDE_COLUMNS, check_plot_path, figures, users_prints_aside

EPILOG = """\
examples:
  gpurig predict --model resnet50 --cluster "2 nodes x 4 RTX 2080 Ti, PCIe 3.0 x8, 40 Gbit/s InfiniBand"
  gpurig predict --model mnist-mlp --cluster "2 nodes x 1 GTX 980, 1 Gbit/s Ethernet"   # the source's case
  gpurig predict --model bert-base --cluster cluster.toml --batch 32 --compression int8
  gpurig predict --model mnist-mlp --cluster runs/bench/profile.json      # this machine, as gpurig bench measured it
  gpurig predict --model my_models:build --sample 3x224x224 --cluster "8 A100, 100 Gbit/s InfiniBand"
  gpurig predict --model resnet50 --cluster "4 nodes x 8 V100, 100GbE" --plot speedup.png --json
  gpurig predict --model mnist-mlp --cluster runs/train/profile.json --gpus 2 --timeline predicted.json

--cluster is a cluster spec (TOML, e.g. from gpurig doctor --write-spec), a machine
profile (JSON from gpurig bench) or a one-line description of catalog parts.
Catalog GPUs are taken at stated efficiencies of their datasheet peaks (docs/predict.md);
a profile brings this machine's measured GEMM rates, memory bandwidth, link latency
and bandwidth and codec costs. Each step is split into compute (forward, backward,
optimizer), communication not hidden under backward (comm) and data loading, as
gpurig train reports it.
"""



def add_parser(subparsers) -> None:
    """Register ``gpurig predict``."""
    p = subparsers.add_parser(
        "predict", help="predict how fast a model trains on N GPUs / M nodes, where the bottleneck is, what helps",
        description="Predict a training step before running it: per-layer compute, gradient communication per "
                    "link tier and how much of it hides under backward, compression, data loading; speed-up "
                    "and scaling efficiency for 1..N GPUs, the bottleneck, and advice.",
        epilog=EPILOG, formatter_class=HelpFormatter)
    p.add_argument("--model", required=True,
                   help="a built-in model (mnist-mlp, mnist-cnn, mnist-wide-cnn, alexnet, vgg16, resnet50, resnet152, "
                        "resnext101, se-resnext101, ssd300, bert-base, bert-large, gpt2, transformer-xl-base, "
                        "transformer-xl-large) or module:factory returning a torch module")
    p.add_argument("--cluster", default=None, help="cluster spec (.toml), bench profile (.json) or a description: comma-separated "
                   "parts in any order, e.g. '2 nodes x 8 V100 SXM2 16GB, NVLink, PCIe 3.0 x16, 100 Gbit/s "
                   "InfiniBand, GPUDirect, 512 GB RAM, 2 sockets'")
    p.add_argument("--profile", default=None, help="a gpurig bench profile to calibrate the cluster's GPUs with")
    p.add_argument("--batch", type=int, default=None, help="samples per GPU per step (default 64); the strong-scaling "
                   "table splits this many over the GPUs")
    p.add_argument("--tokens", type=int, default=None, help="sequence length for token models (bert, gpt2)")
    p.add_argument("--sample", default=None, help="one sample's input for module:factory, e.g. 3x224x224, 128:int64")
    p.add_argument("--parallel", default="data", help="data (default), model or hybrid")
    p.add_argument("--compression", default="none",
                   help="none (default), fp16, bf16, int8, int8-dynamic, powersgd or powersgd:R")
    p.add_argument("--precision", default="fp32", type=str.lower,
                   help="fp32 (default: PyTorch's, convolutions in TF32 on Ampere and later, matmuls in FP32), tf32, "
                        "fp16 or bf16 (automatic mixed precision), fp8 (Transformer Engine; Ada, Hopper and later)")
    p.add_argument("--software", default="current",
                   help="the framework release that runs it: current (default: PyTorch 1.13 or later), pytorch-1.7 "
                        "(NGC 20.10) or pytorch-1.4 (NGC 20.01, apex AMP); older releases compute slower (fitted "
                        "factors, docs/predict.md)")
    p.add_argument("--memory-format", default="contiguous",
                   help="convolutions' activation layout: contiguous (default: PyTorch's NCHW) or channels-last "
                        "(model.to(memory_format=torch.channels_last)); under fp16/bf16 NCHW convolutions pay "
                        "transposes around cuDNN's NHWC tensor-core kernels")
    p.add_argument("--optimizer", default=None,
                   help="the update each step runs over the parameters: sgd, momentum (SGD with momentum), adam, "
                        "adamw (decoupled weight decay) or lamb; default: what the model is usually trained with "
                        "(adamw for BERT and GPT-2, lamb / adam for Transformer-XL base / large, momentum for the "
                        "rest and for module:factory models)")
    p.add_argument("--optimizer-impl", default=None,
                   help="how it runs on a GPU, as torch.optim's foreach / fused arguments: foreach (one kernel per "
                        "operator over many tensors; the default with --software current), fused (one kernel for "
                        "the whole update), for-loop (one tensor at a time: foreach=False, the default before "
                        "PyTorch 2.0, hand-written optimizers; the host's launches can cost more than the GPU's work)")
    p.add_argument("--shard", default="none",
                   help="ZeRO, as gpurig train --shard: none (default), optimizer (the optimizer state split over the "
                        "GPUs) or gradients (the gradients too); priced as a reduce-scatter under backward and an "
                        "allgather after the step, the same bytes as the allreduce")
    p.add_argument("--gpus", type=int, default=None, help="predict up to this many GPUs (default: all)")
    p.add_argument("--engine", default=None, help="with a profile: whose link measurements (mpi, torch; default mpi)")
    p.add_argument("--algorithm", default="best", help="allreduce: best (default), ring, tree, hierarchical, naive")
    p.add_argument("--network-efficiency", type=float, default=None,
                   help="fraction of the network's rate gradients get (default: 0.9 InfiniBand, RoCE or GPUDirect RDMA, 0.93 TCP up "
                        "to 10 Gbit/s, 0.6 TCP beyond)")
    p.add_argument("--pageable", action="store_true",
                   help="batches in pageable host memory: each copy to the GPU blocks, at about half PCIe's rate "
                        "(default: pinned memory, copied beside compute)")
    p.add_argument("--no-prefetch", action="store_true",
                   help="read each batch when the step needs it (default: loader workers read ahead)")
    p.add_argument("--plot", default=None, metavar="PNG", help="write speed-up vs GPU count as a PNG plot")
    p.add_argument("--timeline", default=None, metavar="FILE",
                   help="write the predicted step as a Chrome trace (the format of gpurig train --timeline, "
                        "to open side by side in https://ui.perfetto.dev)")
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")
    p.set_defaults(handler=run)


def request_from(args):
    from gpurig.predict import PredictRequest

    return PredictRequest(model=args.model, cluster=args.cluster, profile=args.profile, batch=args.batch,
                          tokens=args.tokens, sample=args.sample, parallel=args.parallel,
                          compression=args.compression, precision=args.precision, engine=args.engine or "mpi",
                          gpus=args.gpus, algorithm=args.algorithm, network_efficiency=args.network_efficiency,
                          optimizer=args.optimizer, optimizer_impl=args.optimizer_impl, shard=args.shard,
                          pinned=not args.pageable,
                          prefetch=not args.no_prefetch, software=args.software,
                          memory_format=args.memory_format)


def run(args) -> int:
    """Run ``gpurig predict`` with parsed ``args``; return the exit code."""
    from gpurig.errors import UsageError, check_writable
    from gpurig.predict import predict
    from gpurig.predict.request import uses_profile

    request = request_from(args)
    if args.engine is not None and not uses_profile(request):  # given, where only a profile has engines to choose
        raise UsageError(f"--engine {args.engine} chooses whose link measurements a profile supplies; --cluster "
                         f"{args.cluster!r} is no profile: leave --engine out")

    if args.timeline is not None:
        check_writable(args.timeline, "--timeline")
    if args.plot is not None:
        check_plot_path(args.plot)
    with users_prints_aside(args.json):
        result = predict(request)
    if args.plot:
        plot(result, args.plot)
    if args.timeline is not None:
        write_timeline(result, args.timeline)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    show(result)
    if args.plot:
        print(f"plot: {args.plot}")
    if args.timeline:
        print(f"timeline: {args.timeline} (one predicted step; open it in https://ui.perfetto.dev)")
    return 0


def write_timeline(result: dict, path: str) -> None:
    """The predicted step as a Chrome trace at ``path``, one process: a rank of ``result``'s largest size."""
    from gpurig.perf import timeline

    events = timeline.predicted_step_events(result["step"], result.get("buckets") or [])
    timeline.write(path, timeline.chrome_trace(events, {0: f"predicted rank (of {result['gpus']})"}))


def show(result: dict) -> None:
    """The prediction as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    step = result["step"]
    unit = result.get("unit", "GPU")
    trainable = result.get("trainable_parameters", result["parameters"])
    frozen = f", {trainable:,} of them trainable" if trainable != result["parameters"] else ""
    count = result["parameters"]
    console.print(f"[bold]gpurig predict[/]: {result['model']} ("
                  + (f"{count / 1e6:.1f} M" if count >= 100_000 else f"{count:,}") + " parameters"
                  f"{frozen}), "
                  f"{result['batch_per_gpu']} samples"
                  + (f" of {result['tokens']:,} tokens" if result.get("tokens") else "")
                  + f" per {unit}, on {result['gpus']} {unit}"
                  f"{'s' if result['gpus'] != 1 else ''} in {result['nodes']} node{'s' if result['nodes'] != 1 else ''}"
                  f": {result['hardware']}"
                  + (f" = {result['gpu']}" if result.get("gpu") and any(
                      name not in result["hardware"] for name in result["gpu"].split(" + ")) else "")
                  + f" ({result['calibration']}); {result['parallel']} parallel, "
                  f"{result['precision']}, compression {result['compression']}"
                  + (f", {result['optimizer']}" if result.get("optimizer") else "")
                  + (f" ({result['optimizer_impl']})" if result.get("optimizer_impl") else "")
                  + (f", --shard {result['shard']}" if result.get("shard", "none") != "none" else "")
                  + (f", on {result['software']}" if result.get("software", "current") != "current" else "")
                  + (f", {result['memory_format']}" if result.get("memory_format", "contiguous") != "contiguous"
                     else ""))
    if result.get("hardware_note"):
        console.print(f"cluster: {result['hardware_note']}")
    if result.get("precision_note"):
        console.print(f"precision: {result['precision_note']}")
    columns = [("samples/s", None), ("step", "step_ms"), ("compute", "compute_ms"), ("comm", "comm_ms"),
               ("wait", "wait_ms"), ("data", "data_ms"), ("forward", "forward_ms"), ("backward", "backward_ms"),
               ("optimizer", "optimizer_ms"), ("comm total", "comm_total_ms"), ("codec", "codec_ms")]
    # an 80-column terminal gets the step's split and its detail as two tables, so every number shows whole
    groups = [columns] if console.width >= WIDE_COLUMNS else [columns[:6], columns[6:]]
    for i, group in enumerate(groups):
        split = Table(title=f"one step on {result['gpus']} {unit}(s), ms" if i == 0 else "compute and comm in detail, ms")
        for name, _ in group:
            split.add_column(name, justify="right")
        split.add_row(*(figures(result['samples_per_s']) if key is None else f"{step[key]:.2f}"
                        for _, key in group))
        console.print(split)
    needed = result["memory"]
    if needed.get("gpu_gb"):
        verdict = "fits" if needed["fits"] else "[bold red]does NOT fit[/]"
        console.print(f"memory per GPU: {needed['total_gb']:.1f} GiB of {needed['usable_gb']:.1f} usable "
                      f"({needed['gpu_gb']:g} GB): {verdict}; the largest batch that fits: {needed['largest_batch']:,}")
        console.print(f"  at the step's peak: {peak_parts(needed['parts_gb'])}")
    used = result.get("utilization") or {}
    if used.get("mfu") is not None:
        console.print(f"expected MFU: {used['mfu']:.1%} ({used['tflops_per_gpu']:.3g} of {used['peak_tflops']:.3g} "
                      f"TFLOP/s per GPU; the model's forward and backward FLOPs over the step, the peak from the "
                      f"{used['peak_source']})")
    console.print("step = compute + comm + wait + data. comm: communication not hidden under backward; wait: for the "
                  "slowest rank; comm total: all communication; codec: compression's arithmetic (in backward on a CPU)")
    for key in ("strong_scaling", "scaling"):
        console.print(f"speed-up by GPU count, [bold]{result[key + '_label']}[/]:")
        scaling = Table()
        narrow = console.width < WIDE_COLUMNS   # 80 columns: shorter headers and "comm", numbers whole
        for column in ("GPUs", "nodes", "batch" if narrow else "batch/GPU", "step ms", "speed-up",
                       "eff." if narrow else "efficiency", "bottleneck"):
            scaling.add_column(column, justify="right", no_wrap=True)
        for row in result[key]:
            scaling.add_row(str(row["gpus"]), str(row["nodes"]), str(row["batch_per_gpu"]), f"{row['step_ms']:.2f}",
                            f"{row['speedup']:.2f}x", f"{row['efficiency']:.0%}",
                            "comm" if narrow and row["bottleneck"] == "communication" else row["bottleneck"])
        console.print(scaling)
    console.print(f"bottleneck at {result['gpus']} {unit}(s): [bold]{result['bottleneck']}[/]")
    helps = [item for item in result["advice"] if not predicted_slower(item)]
    slower = [item for item in result["advice"] if predicted_slower(item)]
    for title, items in (("what would help (predicted)", helps),
                         ("predicted not to help (2 % or less, or it still does not fit)", slower)):
        if items:
            table = Table(title=title)
            for column in ("change", "samples/s", "why"):
                table.add_column(column, justify="left" if column != "samples/s" else "right")
            for item in items:
                gain = item["samples_per_s_gain"]
                table.add_row(item["what"], "—" if gain is None else f"{gain:.2f}x", item["why"])
            console.print(table)


def predicted_slower(item: dict) -> bool:
    """Whether an advice item was priced and came out no more than :data:`NO_GAIN` faster than the configuration
    asked about (within what the prediction can tell apart), or is a way to fit the GPU's memory that still does
    not fit: it is shown apart, so "what would help" lists only what would.

    >>> predicted_slower({"samples_per_s_gain": 0.25}), predicted_slower({"samples_per_s_gain": 1.3})
    (True, False)
    >>> predicted_slower({"samples_per_s_gain": 1.001}), predicted_slower({"samples_per_s_gain": None})
    (True, False)
    >>> predicted_slower({"samples_per_s_gain": None, "fits": False})
    True
    """
    gain = item.get("samples_per_s_gain")
    return gain is not None and gain <= NO_GAIN or item.get("fits") is False


NO_GAIN = 1.02   # a 2 % gain or less is no gain worth a change (the kernel choices' rule: docs/predict.md)


def peak_parts(parts_gb: dict) -> str:
    """What a GPU holds at the step's peak, largest first, in GiB (parts under 0.05 GiB left out).

    >>> peak_parts({"weights": 0.41, "optimizer": 0.82, "activations": 2.3, "backward_working": 0.01})
    'activations 2.3, optimizer 0.8, weights 0.4 GiB'
    """
    shown = sorted(((gb, name) for name, gb in parts_gb.items() if gb >= 0.05), reverse=True)
    return ", ".join(f"{name.replace('_', ' ')} {gb:.1f}" for gb, name in shown) + " GiB" if shown else "under 0.05 GiB"

def plot(result: dict, path: str) -> None:
    """Speed-up vs GPU count, with the ideal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = [r["gpus"] for r in result["scaling"]]
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(gpus, gpus, "--", color="grey", label="ideal")
    axes.plot(gpus, [r["speedup"] for r in result["scaling"]], "o-", label="weak scaling (batch per GPU fixed)")
    strong = result.get("strong_scaling") or []
    if strong:
        axes.plot([r["gpus"] for r in strong], [r["speedup"] for r in strong], "s-",
                  label="strong scaling (global batch fixed)")
    axes.set_xlabel("GPUs")
    axes.set_ylabel("speed-up over one GPU")
    axes.set_title(f"{result['model']} on {result['hardware']}", fontsize=9)
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
