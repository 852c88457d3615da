"""Compute micro-benchmarks on every rank of a job at once: what each rank gets when all of them work.

Run by ``gpurig bench`` (part ``compute``) on 1 rank and on N ranks per node,
so the predictor knows a rank's speed both alone and while its neighbours
compete for cores, caches and memory bandwidth (``python -m gpurig.measure.compute CONFIG.json``).

- GEMM: (m × k)·(k × n) over a grid of shapes, as training's linear layers run them;
- memory: a large copy (bytes read + written per second), what optimizers and activations cost;
- per layer: the fixed cost of one small layer's forward and backward (dispatch, autograd);
- convolutions: real ``nn.Conv2d`` forward and backward over a few shapes, with their im2col GEMM sizes,
  so the predictor knows how far this device's convolutions are from its GEMMs;
- codecs: encode with error feedback + decode per value, each gradient codec.

Every rank times the same thing at the same moment (a barrier before each);
the slowest rank's time is kept.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from gpurig.timing import device_sync, timed

GEMM_GRID = [(m, n, k) for m in (16, 64, 256, 1024) for (n, k) in ((128, 128), (1024, 1024), (1024, 4096),
                                                                   (4096, 1024), (10, 1024))]
GPU_GEMM_GRID = [(m, n, k) for m in (64, 512, 4096, 32768) for (n, k) in ((256, 256), (1024, 1024), (4096, 4096),
                                                                     (1024, 8192), (64, 4096))]
# Convolutions: (batch, in channels, out channels, kernel, image side), stride 1, no padding.
CONV_GRID = [(32, 1, 32, 5, 28), (32, 32, 64, 5, 12), (32, 16, 32, 3, 32), (128, 1, 32, 5, 28), (128, 32, 64, 5, 12)]
GPU_CONV_GRID = [(32, 64, 64, 3, 58), (32, 128, 128, 3, 30), (32, 256, 256, 3, 16), (32, 3, 64, 7, 230)]
QUICK_CONV_GRID = [(32, 1, 32, 5, 28), (32, 32, 64, 5, 12)]
QUICK_GEMM_GRID = [(m, n, k) for m in (16, 256) for (n, k) in ((128, 128), (1024, 1024), (10, 1024))]


def _timer(device: torch.device):
    """The typical time of a run on ``device`` (the median: under contention the best case is not typical)."""
    sync = device_sync(device)
    return lambda fn, repeats: timed(fn, repeats, sync=sync, typical=True)


def gemm_rows(shapes, device, best, comm, budget_flops: float = 5e8) -> list[dict]:
    """Seconds per (m, n, k) product, the slowest rank's."""
    rows = []
    for m, n, k in shapes:
        a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
        inner = max(1, int(budget_flops // (2 * m * n * k)))

        def run():
            for _ in range(inner):
                torch.mm(a, b)

        comm.barrier()
        seconds = _slowest(comm, best(run, 5) / inner)
        rows.append({"m": m, "n": n, "k": k, "seconds": seconds, "gflops": 2 * m * n * k / seconds / 1e9})
    return rows


def memory_bytes_per_s(device, best, comm, nbytes: int = 64 << 20) -> float:
    """Bytes read + written per second by a large copy."""
    src = torch.empty(nbytes // 4, device=device).normal_()
    dst = torch.empty_like(src)
    comm.barrier()
    return 2 * nbytes / _slowest(comm, best(lambda: dst.copy_(src), 5))


def layer_overhead_seconds(device, best, comm, layers: int = 20) -> float:
    """The fixed cost of one small linear layer's forward and backward (dispatch and autograd, no arithmetic)."""
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(layers)]).to(device)
    x = torch.randn(1, 4, device=device)

    def step():
        model(x).sum().backward()

    comm.barrier()
    return _slowest(comm, best(step, 9) / layers)


def convolution_rows(shapes, device, best, comm) -> list[dict]:
    """Seconds of one ``nn.Conv2d``'s forward and backward (weight gradient, and input gradient unless it has
    at most 3 input channels, as a first layer) per shape, the slowest rank's, with the (m, n, k) of its im2col GEMM: m = batch × output pixels, n = out channels, k = in channels ×
    kernel area.

    >>> convolution_rows([(2, 1, 4, 3, 8)], torch.device("cpu"), _timer(torch.device("cpu")), one_rank)[0]["m"]  # doctest: +SKIP
    72
    """
    rows = []
    for batch, c_in, c_out, kernel, side in shapes:
        conv = torch.nn.Conv2d(c_in, c_out, kernel).to(device)
        # a network's first layer (an image's 1 or 3 channels) needs no input gradient
        x = torch.randn(batch, c_in, side, side, device=device, requires_grad=c_in > 3)

        def step():
            conv(x).sum().backward()

        comm.barrier()
        seconds = _slowest(comm, best(step, 5))
        out_side = side - kernel + 1
        rows.append({"batch": batch, "in_channels": c_in, "out_channels": c_out, "kernel": kernel, "side": side,
                     "m": batch * out_side * out_side, "n": c_out, "k": c_in * kernel * kernel, "seconds": seconds})
    return rows


def codec_seconds_per_value(device, best, comm, n: int = 1 << 20) -> dict:
    """Per codec: seconds per value to encode with error feedback, and to decode."""
    from gpurig.parallel import codecs

    out = {}
    for name, codec in codecs.CODECS.items():
        if name == "none":
            continue
        x, residual = torch.randn(n, device=device), torch.zeros(n, device=device)
        payload, decoded = codecs.empty_payload(codec, n, device), torch.empty(n, device=device)
        comm.barrier()
        encode = _slowest(comm, best(lambda: codecs.encode_with_feedback(codec, x, residual, payload), 5))
        comm.barrier()
        decode = _slowest(comm, best(lambda: codec.decode(payload, decoded), 5))
        out[name] = {"encode_s_per_value": encode / n, "decode_s_per_value": decode / n}
    return out


def _slowest(comm, seconds: float) -> float:
    """The largest of every rank's ``seconds``."""
    return comm.allgather(torch.tensor([seconds], dtype=torch.float64)).max().item()


def measure_all(comm, quick: bool = False) -> dict:
    """Every compute measurement, on all of ``comm``'s ranks at once (call it on every rank).

    >>> measure_all(gpurig.init(), quick=True)["ranks"]      # doctest: +SKIP
    2
    """
    device = comm.device
    best = _timer(device)
    return {
        "ranks": comm.size, "threads_per_rank": torch.get_num_threads(), "device": str(device),
        "gemm": gemm_rows(QUICK_GEMM_GRID if quick else GPU_GEMM_GRID if device.type == "cuda" else GEMM_GRID,
                          device, best, comm, budget_flops=5e10 if device.type == "cuda" else 5e8),
        "memory_bytes_per_s": memory_bytes_per_s(device, best, comm),
        "layer_overhead_s": layer_overhead_seconds(device, best, comm),
        "conv": convolution_rows(QUICK_CONV_GRID if quick else GPU_CONV_GRID if device.type == "cuda" else CONV_GRID,
                                 device, best, comm),
        "codecs": codec_seconds_per_value(device, best, comm, n=1 << 18 if quick else 1 << 20),
    }


def run(config: dict) -> dict:
    """All compute measurements on this job's ranks; rank 0 writes them to ``config["out"]``."""
    import gpurig

    comm = gpurig.init()
    result = measure_all(comm, quick=config.get("quick", False))
    if comm.rank == 0:
        Path(config["out"]).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    run(json.loads(Path(sys.argv[1]).read_text()))
