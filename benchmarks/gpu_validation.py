"""gpurig predict against real training steps on a GPU, per precision (run on a GPU machine; on_gpu.sh calls it).

    python benchmarks/gpu_validation.py --out /tmp/gpu_validation.json

For each case (model, batch per GPU, ``--precision``, memory format): a
training step (forward, backward, SGD with momentum; synthetic data already on
the GPU) timed on this GPU with PyTorch set up as the precision says
(:mod:`gpurig.perf.precision`: ``fp32`` is PyTorch's default, convolutions in
TF32 and matrix multiplies in FP32; ``tf32`` both in TF32; ``fp16``/``bf16``
``torch.autocast`` with FP32 weights, and a ``GradScaler`` for fp16; the loss
is cross-entropy over the output's last dimension, per sample or per token, as
predict's memory assumes), its peak
``torch.cuda.max_memory_allocated``, and gpurig predict's step and memory for
one GPU from the catalog alone (what a user who does not own the GPU gets) and,
for fp32, from a ``gpurig bench`` compute profile of this GPU. Rows are
written to ``--out`` as they are measured, so a run cut short keeps what it
measured. ``--device cpu --quick`` runs the same code on a CPU (a check of the
script, not of predict).
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from gpurig.errors import UsageError
from gpurig.models import load_factory, preset
from gpurig.models.factory import sample_batch
from gpurig.parallel.mixed_precision import AUTOCAST
from gpurig.predict import PredictRequest, predict
from gpurig.timing import device_sync

# (model, batches per GPU, precisions); every convolutional model also runs channels-last in mixed precision
CASES = [
    ("resnet50", (64, 128), ("fp32", "tf32", "bf16", "fp16")),
    ("bert-base", (8, 32, 64), ("fp32", "tf32", "bf16", "fp16")),
    ("gpt2", (4, 8), ("fp32", "tf32", "bf16")),
    ("vgg16", (32,), ("fp32", "bf16")),
    ("alexnet", (128,), ("fp32", "bf16")),
    ("mnist-mlp", (64,), ("fp32",)),
    ("mnist-cnn", (64,), ("fp32",)),
]
QUICK = [("mnist-mlp", (64,), ("fp32", "bf16")), ("mnist-cnn", (64,), ("fp32",))]
CONVOLUTIONAL = {"resnet50", "vgg16", "alexnet", "mnist-cnn"}
LAUNCH_BOUND = {"mnist-mlp", "mnist-cnn"}  # steps of 1-2 ms: kernel launches, not what predict is for


HELD_OUT_PRECISIONS = ("bf16", "fp32")


def cases(quick: bool, only: str | None, held_out: bool = False):
    """(model, per-sample input or None for a preset, batch, precision, channels_last) for every case to time;
    ``only``: comma-separated precisions; ``held_out``: the models of held_out_models.py instead of the presets."""
    if held_out:
        from held_out_models import HELD_OUT
        table = [(name, sample, batches, HELD_OUT_PRECISIONS) for name, sample, batches in HELD_OUT]
    else:
        table = [(name, None, batches, precisions) for name, batches, precisions in (QUICK if quick else CASES)]
    for name, sample, batches, precisions in table:
        for batch in batches:
            for precision in precisions:
                if only and precision not in only.split(","):
                    continue
                yield name, sample, batch, precision, False
                if name in CONVOLUTIONAL and precision in ("bf16", "fp16"):
                    yield name, sample, batch, precision, True


def configure(precision: str) -> None:
    """PyTorch's switches as ``--precision`` describes them (gpurig.perf.precision)."""
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default, which gpurig's fp32 assumes


def model_and_example(name: str, sample: str | None) -> tuple[torch.nn.Module, torch.Tensor]:
    """A preset's model with real weights and its one-sample meta input, or a ``module:factory``'s with ``sample``."""
    if sample is None:
        return preset(name).factory(), preset(name).example()
    return load_factory(name, device=None), sample_batch(sample)


def training_step(name: str, batch: int, precision: str, channels_last: bool, device: torch.device,
                  sample: str | None = None):
    """One training step of a model (a preset, or ``module:factory`` with ``sample``) on synthetic data already
    on ``device``, as ``precision`` runs it."""
    configure(precision)
    model, example = model_and_example(name, sample)
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    shape = (batch, *example.shape[1:])
    if example.dtype == torch.int64:
        x = torch.randint(0, 1000, shape, device=device)
    else:
        x = torch.randn(shape, device=device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
    mixed = AUTOCAST.get(precision)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=mixed or torch.float32, enabled=mixed is not None):
            out = model(x)
            out = out if isinstance(out, torch.Tensor) else out[0]
            labels = torch.zeros(out.shape[:-1].numel(), dtype=torch.long, device=device)  # per sample, or token
            loss = F.cross_entropy(out.flatten(0, -2), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return step


def measured_step(name: str, batch: int, precision: str, channels_last: bool, device: torch.device,
                  seconds: float, sample: str | None = None) -> dict:
    """The mean step time over about ``seconds`` after a warm-up, and the peak memory allocated."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    step = training_step(name, batch, precision, channels_last, device, sample)
    sync = device_sync(device)
    for _ in range(3):
        step()
    sync()
    start = time.perf_counter()
    step()
    sync()
    once = time.perf_counter() - start
    steps = max(3, min(50, int(seconds / max(once, 1e-6))))
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    elapsed = (time.perf_counter() - start) / steps
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None  # GiB, as predict's "GB"
    return {"measured_ms": 1000 * elapsed, "steps": steps, "peak_allocated_gib": peak}


def predicted(name: str, batch: int, precision: str, channels_last: bool, gpu: str, profile: str | None,
              sample: str | None = None) -> dict:
    """gpurig predict's step (ms) and memory (GB) for one GPU, or the one-line reason it refuses."""
    try:
        r = predict(PredictRequest(model=name, cluster=f"1 node x 1 {gpu}", batch=batch, precision=precision,
                                   profile=profile, sample=sample, optimizer="momentum",   # as measure() steps
                                   memory_format="channels-last" if channels_last else "contiguous"))
    except UsageError as e:
        return {"error": str(e)}
    except Exception as e:  # a crash of predict is a finding to record, not a reason to lose the run
        return {"error": f"predict crashed: {e!r}"}
    return {"step_ms": r["step"]["step_ms"], "memory_gb": r["memory"]["total_gb"],
            "largest_batch": r["memory"]["largest_batch"], "mfu": r["utilization"].get("mfu")}


def bench_profile(path: Path) -> bool:
    """This GPU's compute profile (GEMM rates, memory bandwidth, per-layer cost) from ``gpurig bench``."""
    try:
        done = subprocess.run([sys.executable, "-m", "gpurig", "bench", "--parts", "compute", "-n", "1", "--out",
                               str(path), "--json"], capture_output=True, text=True, timeout=240)
    except (subprocess.SubprocessError, OSError) as e:
        print(f"gpurig bench failed: {e}", flush=True)
        return False
    if done.returncode != 0:
        print(f"gpurig bench failed ({done.returncode}): {done.stderr.strip()[-600:]}", flush=True)
    return done.returncode == 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--gpu", default=None, help="catalog name of this GPU (default: from the device name)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seconds", type=float, default=1.0, help="time each case for about this long")
    p.add_argument("--quick", action="store_true", help="two small cases (a check of the script)")
    p.add_argument("--no-profile", action="store_true", help="skip the gpurig bench profile")
    p.add_argument("--precisions", default=None, help="only these, comma-separated (default: every case's)")
    p.add_argument("--held-out", action="store_true", help="the models of held_out_models.py (torchvision's and "
                                                           "transformers', which predict was never tuned on)")
    p.add_argument("--again", metavar="RUN.json", help="no GPU needed: predict a stored run's rows again with this "
                                                      "tree's predict, print them and the summary")
    args = p.parse_args()
    if args.again:
        return again(args.again)
    device = torch.device(args.device)
    gpu = args.gpu or (torch.cuda.get_device_name() if device.type == "cuda" else "H100 SXM")
    result = {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda, "loss": "cross-entropy",
              "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "profile.json"
        have_profile = not args.no_profile and bench_profile(profile)
        if have_profile:
            result["profile"] = json.loads(profile.read_text())
        for name, sample, batch, precision, channels_last in cases(args.quick, args.precisions, args.held_out):
            try:
                row = measured_step(name, batch, precision, channels_last, device, args.seconds, sample)
            except torch.OutOfMemoryError as e:
                row = {"error": f"out of memory: {e}"[:200]}
            except Exception as e:  # a model that does not train here is a finding to record, not a lost run
                row = {"error": f"training failed: {e!r}"[:300]}
            row.update({"model": name, "batch": batch, "precision": precision,
                        "memory_format": "channels-last" if channels_last else "contiguous",
                        "catalog": predicted(name, batch, precision, channels_last, gpu, None, sample)})
            if sample is not None:
                row["sample"] = sample
            if have_profile and precision == "fp32" and not channels_last:
                row["profile"] = predicted(name, batch, precision, False, gpu, str(profile), sample)
            result["rows"].append(row)
            Path(args.out).write_text(json.dumps(result, indent=2))
            print(line(row), flush=True)


def again(path: str) -> None:
    """A stored run's measurements against this tree's predictions, from the catalog and, where the run holds
    its GPU's bench profile, from that profile; then the median and worst |error| of step and memory. A run made before the loss was
    cross-entropy for every model gets the memory its loss held on top (:func:`square_loss_extra`)."""
    import statistics

    run = json.loads(Path(path).read_text())
    steps, memories, profiled = [], [], []
    profile = None
    if "profile" in run:
        profile = Path(tempfile.mkdtemp()) / "profile.json"
        profile.write_text(json.dumps(run["profile"]))
    for row in run["rows"]:
        if "measured_ms" not in row:
            continue
        if "peak_allocated_gb" in row:  # the first runs stored decimal GB
            row["peak_allocated_gib"] = row.pop("peak_allocated_gb") * 1e9 / 2**30
        row["catalog"] = predicted(row["model"], row["batch"], row["precision"],
                                   row["memory_format"] == "channels-last", run["gpu"], None, row.get("sample"))
        if "loss" not in run and "memory_gb" in row["catalog"]:
            row["catalog"]["memory_gb"] += square_loss_extra(row) / 2**30
        if profile is not None and "profile" in row:
            row["profile"] = predicted(row["model"], row["batch"], row["precision"], False, run["gpu"], str(profile),
                                       row.get("sample"))
        if "error" in row["catalog"]:   # a model this machine cannot build (Hugging Face's, without transformers)
            print(f"{row['model']} {row['batch']} {row['precision']}: not predicted here: {row['catalog']['error']}")
            continue
        print(line(row))
        if row["model"] in LAUNCH_BOUND:
            continue
        if "step_ms" in row.get("profile", {}):
            profiled.append(abs(row["profile"]["step_ms"] / row["measured_ms"] - 1))
        steps.append(abs(row["catalog"]["step_ms"] / row["measured_ms"] - 1))
        memories.append(abs(row["catalog"]["memory_gb"] / row["peak_allocated_gib"] - 1))
    for name, errors in (("step", steps), ("memory", memories), ("step from the profile", profiled)):
        if not errors:
            continue
        print(f"{name}: {len(errors)} rows, median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}, "
              f"{sum(e <= 0.1 for e in errors)} within 10 %, {sum(e <= 0.25 for e in errors)} within 25 %")


def square_loss_extra(row: dict) -> float:
    """Bytes a run before 2026-11-27 held beyond predict's cross-entropy for a model whose output has tokens (a
    language model's logits, BERT's hidden states): those runs trained it on ``out.float().square().mean()``. The
    difference of the two steps' peaks, each traced on the meta device (:func:`gpurig.models.peak.trace_step`)."""
    example = preset(row["model"]).example()
    if example.dtype != torch.int64:
        return 0.0
    from gpurig.models.describe import example_input
    from gpurig.models.peak import trace_step

    def square_loss(out):
        return (out if isinstance(out, torch.Tensor) else out[0]).float().square().mean()

    x, mixed = example_input(example, row["batch"]), AUTOCAST.get(row["precision"])
    with_square = trace_step(preset(row["model"]).build(), x, mixed, loss_of=square_loss)
    return with_square["peak"] - trace_step(preset(row["model"]).build(), x, mixed)["peak"]


def line(row: dict) -> str:
    """One row as text: measured, and each prediction's error."""
    head = f"{row['model'].split(':')[-1]:15s} {row['batch']:4d} {row['precision']:5s} {row['memory_format'][:8]:8s}"
    if "measured_ms" not in row:
        return f"{head} {row['error']}"
    text = f"{head} measured {row['measured_ms']:8.2f} ms"
    for source in ("catalog", "profile"):
        pred = row.get(source)
        if pred and "step_ms" in pred:
            text += f"  {source} {pred['step_ms']:8.2f} ({pred['step_ms'] / row['measured_ms'] - 1:+.0%})"
        elif pred:
            text += f"  {source}: {pred['error'][:40]}"
    if row.get("peak_allocated_gib") is not None and "memory_gb" in row["catalog"]:
        text += f"  memory {row['peak_allocated_gib']:.2f} GiB, predicted {row['catalog']['memory_gb']:.2f}"
    return text


if __name__ == "__main__":
    main()
