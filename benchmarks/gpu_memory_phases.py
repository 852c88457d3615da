"""Where a training step's memory peaks on a GPU, against where predict's trace says (run on a GPU machine).

    python benchmarks/gpu_memory_phases.py --models held_out_models:t5_small=512:int64@16 --out /tmp/phases.json

For each model (``module:factory=SAMPLE@BATCH``, or a preset's name ``@BATCH``)
and precision: the bytes allocated beyond the weights and the optimizer's state
when the loss is computed (what forward keeps for backward), the peak during
forward and the loss, and the peak during backward, each from
``torch.cuda.memory_allocated`` / ``max_memory_allocated``; beside them the same
three from :func:`gpurig.models.peak.trace_step` on the meta device; and the
CUDA kernels the step ran whose names say attention or softmax
(``torch.profiler``), which say which attention kernel the GPU chose.
"""

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from gpu_validation import configure, model_and_example
from gpurig.models.describe import on_meta
from gpurig.models.peak import trace_step
from gpurig.parallel.mixed_precision import AUTOCAST

GIB = 2**30


def parse(spec: str) -> tuple[str, str | None, int]:
    """``module:factory=SAMPLE@BATCH`` or ``preset@BATCH`` → (name, sample or None, batch)."""
    head, _, batch = spec.rpartition("@")
    name, _, sample = head.partition("=")
    return name, sample or None, int(batch)


def measured(name: str, sample: str | None, batch: int, precision: str) -> dict:
    """The step's memory by phase on this GPU, and the attention and softmax kernels it ran."""
    configure(precision)
    model, example = model_and_example(name, sample)
    model = model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    shape = (batch, *example.shape[1:])
    x = torch.randint(0, 1000, shape, device="cuda") if example.dtype == torch.int64 else torch.randn(shape, device="cuda")
    mixed = AUTOCAST.get(precision)

    def step(phases: dict | None = None):
        optimizer.zero_grad(set_to_none=True)
        if phases is not None:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            phases["base"] = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=mixed or torch.float32, enabled=mixed is not None):
            out = model(x)
            out = out if isinstance(out, torch.Tensor) else out[0]
            loss = F.cross_entropy(out.flatten(0, -2), torch.zeros(out.shape[:-1].numel(), dtype=torch.long,
                                                                   device="cuda"))
        if phases is not None:
            torch.cuda.synchronize()
            phases["held_for_backward"] = torch.cuda.memory_allocated() - phases["base"]
            phases["forward_peak"] = torch.cuda.max_memory_allocated() - phases["base"]
            torch.cuda.reset_peak_memory_stats()
        loss.backward()
        if phases is not None:
            torch.cuda.synchronize()
            phases["backward_peak"] = torch.cuda.max_memory_allocated() - phases["base"]
        optimizer.step()

    for _ in range(2):
        step()
    phases: dict = {}
    step(phases)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = sorted({e.key for e in prof.key_averages()
                      if any(w in e.key.lower() for w in ("attention", "fmha", "flash", "softmax", "cudnn"))})
    del model, optimizer, x
    torch.cuda.empty_cache()
    return {**{k: v / GIB for k, v in phases.items()}, "kernels": kernels[:12]}


def traced(name: str, sample: str | None, batch: int, precision: str) -> dict:
    """The same step traced on the meta device, as predict traces it: the peak and its parts, in GiB."""
    model, example = model_and_example(name, sample)
    x = torch.empty((batch, *example.shape[1:]), dtype=example.dtype, device="meta")
    return {k: v / GIB for k, v in trace_step(on_meta(model), x, AUTOCAST.get(precision)).items()
            if not k.endswith("_ops")}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["held_out_models:t5_small=512:int64@16",
                                                   "held_out_models:distilbert=512:int64@16"])
    p.add_argument("--precisions", default="bf16,fp32")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rows = []
    for spec in args.models:
        name, sample, batch = parse(spec)
        for precision in args.precisions.split(","):
            row = {"model": name, "sample": sample, "batch": batch, "precision": precision,
                   "traced": traced(name, sample, batch, precision)}
            try:
                row["measured"] = measured(name, sample, batch, precision)
            except Exception as e:  # noqa: BLE001 (record it, go on)
                row["error"] = repr(e)[:300]
            rows.append(row)
            Path(args.out).write_text(json.dumps(rows, indent=2))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
