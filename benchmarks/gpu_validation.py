"""gpurig predict against real training steps on a GPU (run on a GPU machine; benchmarks/on_gpu.sh calls it).

    python benchmarks/gpu_validation.py --out /tmp/gpu_validation.json

For each built-in model: a training step (forward, backward, SGD with
momentum; synthetic data already on the GPU; fp32 with TF32 off, so the
arithmetic is what the catalog's FP32 figure describes) timed on this GPU, and
gpurig predict's step for one GPU two ways: from the catalog (datasheet peaks
at the stated efficiencies) and from a ``gpurig bench`` compute profile of
this GPU (measured GEMM rates, memory bandwidth, per-layer overhead). The
profile is measured first, from micro-benchmarks only.
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

from gpurig.predict import PredictRequest, predict
from gpurig.models import preset

CASES = [("mnist-mlp", 64), ("mnist-cnn", 64), ("alexnet", 128), ("resnet50", 64), ("vgg16", 32),
         ("bert-base", 32), ("gpt2", 8)]


def measured_step_ms(name: str, batch: int, steps: int = 10) -> float:
    model = preset(name).factory().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    example = preset(name).example()
    shape = (batch, *example.shape[1:])
    if example.dtype == torch.int64:
        x = torch.randint(0, 1000, shape, device="cuda")
    else:
        x = torch.randn(shape, device="cuda")

    def step():
        optimizer.zero_grad(set_to_none=True)
        out = model(x)
        out = out if isinstance(out, torch.Tensor) else out[0]
        loss = out.float().square().mean() if out.dim() != 2 else F.cross_entropy(out, torch.zeros(
            batch, dtype=torch.long, device="cuda"))
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start) / steps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--gpu", default=None, help="catalog name of this GPU (default: from the device name)")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gpu = args.gpu or torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "profile.json"
        subprocess.run([sys.executable, "-m", "gpurig", "bench", "--parts", "compute", "-n", "1", "--out",
                        str(profile), "--json"], check=True, capture_output=True)
        rows = []
        for name, batch in CASES:
            measured = measured_step_ms(name, batch)
            catalog = predict(PredictRequest(model=name, cluster=f"1 node x 1 {gpu}", batch=batch))["step"]
            calibrated = predict(PredictRequest(model=name, cluster=f"1 node x 1 {gpu}", profile=str(profile),
                                                batch=batch))["step"]
            rows.append({"model": name, "batch": batch, "measured_ms": measured,
                         "catalog_ms": catalog["step_ms"], "profile_ms": calibrated["step_ms"]})
            print(f"{name:10s} batch {batch:4d}  measured {measured:8.2f} ms  catalog {catalog['step_ms']:8.2f} "
                  f"({catalog['step_ms'] / measured - 1:+.0%})  profile {calibrated['step_ms']:8.2f} "
                  f"({calibrated['step_ms'] / measured - 1:+.0%})", flush=True)
        Path(args.out).write_text(json.dumps({"gpu": gpu, "rows": rows,
                                              "profile": json.loads(profile.read_text())}, indent=2))


if __name__ == "__main__":
    main()
