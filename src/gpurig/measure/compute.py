"""Compute micro-benchmarks on every rank of a job at once: what each rank gets when all of them work.

Run by ``gpurig bench`` (part ``compute``) on 1 rank and on N ranks per node,
so the predictor knows a rank's speed both alone and while its neighbours
compete for cores, caches and memory bandwidth (``python -m gpurig.measure.compute CONFIG.json``).

- GEMM: (m × k)·(k × n) over a grid of shapes, as training's linear layers run them;
- memory: a large copy (bytes read + written per second), what optimizers and activations cost;
- per layer: the fixed cost of one small layer's forward and backward (dispatch, autograd);
- layers: real linear, convolution, pooling and activation layers, forward and backward timed apart over a
  few shapes, so the predictor knows how far this device's layers are from its GEMM and memory models;
- optimizers: one step of SGD, SGD with momentum and Adam per parameter value, at two model sizes;
- codecs: encode with error feedback + decode per value, each gradient codec.

Every rank times the same thing at the same moment (a barrier before each
run); the things of one kind (all GEMM shapes, all layers, ...) are timed turn
about, and per thing the median of its rounds and the slowest rank's time is kept.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from gpurig.perf.machine import build_layer
from gpurig.timing import device_sync, timed, timed_turns

GEMM_GRID = [(m, n, k) for m in (16, 64, 256, 1024) for (n, k) in ((128, 128), (1024, 1024), (1024, 4096),
                                                                   (4096, 1024), (10, 1024))]
GPU_GEMM_GRID = [(m, n, k) for m in (64, 512, 4096, 32768) for (n, k) in ((256, 256), (1024, 1024), (4096, 4096),
                                                                     (1024, 8192), (64, 4096))]
# Real layers, each (kind, constructor arguments, input shape, whether the input needs a gradient): what
# the predictor's GEMM and memory models miss (autograd's transposed operands, direct convolutions, pooling's
# index bookkeeping) is measured on a few shapes of each kind.
LAYER_GRID = [
    *[("linear", (1024, 1024), (batch, 1024), grad) for grad in (True, False) for batch in (32, 64, 128, 256)],
    ("linear", (1024, 16), (256, 1024), True), ("linear", (256, 4096), (64, 256), True),
    ("conv", (1, 32, 5), (32, 1, 28, 28), False), ("conv", (1, 32, 5), (128, 1, 28, 28), False),
    ("conv", (32, 64, 5), (32, 32, 12, 12), True), ("conv", (32, 64, 5), (128, 32, 12, 12), True),
    ("conv", (16, 32, 3), (32, 16, 32, 32), True),
    ("pool", (2,), (32, 32, 32, 32), True), ("pool", (2,), (32, 64, 8, 8), True),
    ("activation", (), (32, 32, 32, 32), True), ("activation", (), (32, 4096), True),
]
GPU_LAYER_GRID = [
    ("linear", (4096, 4096), (4096, 4096), True), ("linear", (1024, 1024), (512, 1024), True),
    ("linear", (4096, 4096), (4096, 4096), False), ("linear", (4096, 64), (8192, 4096), True),
    ("conv", (64, 64, 3), (32, 64, 58, 58), True), ("conv", (128, 128, 3), (32, 128, 30, 30), True),
    ("conv", (256, 256, 3), (32, 256, 16, 16), True), ("conv", (3, 64, 7), (32, 3, 230, 230), False),
    ("pool", (2,), (32, 64, 112, 112), True), ("activation", (), (32, 64, 112, 112), True),
]
QUICK_LAYER_GRID = [LAYER_GRID[0], LAYER_GRID[4], LAYER_GRID[10], LAYER_GRID[12], LAYER_GRID[15], LAYER_GRID[17]]
QUICK_GEMM_GRID = [(m, n, k) for m in (16, 256) for (n, k) in ((128, 128), (1024, 1024), (10, 1024))]
# A timed run repeats a small product to reach its FLOP budget, but never more than this many calls: on a GPU a
# tiny product costs a launch (~5 us), and the quick grid at a GPU's budget once asked for 150,000 launches a
# run, minutes for two ranks sharing one GPU. 2,000 launches still hide the synchronisation's ~20 us.
MAX_CALLS_PER_RUN = 2000


def turn_timer(comm, rounds: int = 7):
    """A function that times a list of functions turn about on every rank of ``comm`` at once (a barrier
    before each run, :func:`~gpurig.timing.timed_turns`) and returns, per function, the slowest rank's median.

    >>> turn_timer(gpurig.init())([lambda: None])      # doctest: +SKIP
    [1.2e-07]
    """
    sync = device_sync(comm.device)
    return lambda fns: _slowest(comm, timed_turns(fns, rounds, sync=sync, before=comm.barrier))


def gemm_rows(shapes, device, timer, budget_flops: float = 5e8) -> list[dict]:
    """Seconds per (m, n, k) product, the slowest rank's."""
    # one pair of buffers, each shape a view of them: only the largest shape's operands in memory
    left = torch.randn(max(m * k for m, n, k in shapes), device=device)
    right = torch.randn(max(k * n for m, n, k in shapes), device=device)

    def product(m, n, k):
        a, b = left[:m * k].view(m, k), right[:k * n].view(k, n)
        inner = min(MAX_CALLS_PER_RUN, max(1, int(budget_flops // (2 * m * n * k))))

        def run():
            for _ in range(inner):
                torch.mm(a, b)
        return run, inner

    runs = [product(*shape) for shape in shapes]
    seconds = timer([run for run, _ in runs])
    return [{"m": m, "n": n, "k": k, "seconds": s / inner, "gflops": 2 * m * n * k * inner / s / 1e9}
            for (m, n, k), s, (_, inner) in zip(shapes, seconds, runs)]


def memory_bytes_per_s(device, timer, nbytes: int = 64 << 20) -> float:
    """Bytes read + written per second by a large copy."""
    src = torch.empty(nbytes // 4, device=device).normal_()
    dst = torch.empty_like(src)
    return 2 * nbytes / timer([lambda: dst.copy_(src)])[0]


def layer_overhead_seconds(device, timer, layers: int = 20) -> float:
    """The fixed cost of one small linear layer's forward and backward (dispatch and autograd, no arithmetic)."""
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(layers)]).to(device)
    x = torch.randn(1, 4, device=device)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    return timer([step])[0] / layers


def layer_rows(grid, device, timer, repeat_s: float = 0.01) -> list[dict]:
    """Seconds of each layer's forward and of its backward (weight gradients, and the input's where the
    entry says so), the slowest rank's, with what built it; each timing repeats the layer for about
    ``repeat_s``.

    >>> layer_rows([("activation", (), (2, 8), True)], torch.device("cpu"), turn_timer(one_rank))[0]["kind"]  # doctest: +SKIP
    'activation'
    """
    def runs(layer, x, grad):
        def forward():
            layer(x)

        def both():
            # as a training step runs it: gradients written afresh (``zero_grad(set_to_none=True)``), not
            # added to the last repeat's (one more read and write of every weight, which made the MNIST
            # MLP's backward at 32 per rank 4.4-5.3 ms on 1 rank where a step spends 2.4-2.8)
            layer.zero_grad(set_to_none=True)
            x.grad = None
            layer(x).backward(grad)

        # Small layers take a fraction of a millisecond: each timing repeats the layer (about 10 ms), so
        # the timer and a stray interruption do not decide the ratio the predictor scales by.
        inner = max(1, min(200, int(repeat_s / max(timed(both, 1), 1e-6))))
        return (lambda: [forward() for _ in range(inner)]), (lambda: [both() for _ in range(inner)]), inner

    timings = []
    for kind, arguments, shape, input_grad in grid:
        layer = build_layer(kind, arguments).to(device)
        x = torch.randn(*shape, device=device, requires_grad=input_grad)
        timings.append(runs(layer, x, torch.ones_like(layer(x))))
    seconds = timer([fn for forward, both, _ in timings for fn in (forward, both)])
    rows = []
    for i, ((kind, arguments, shape, input_grad), (_, _, inner)) in enumerate(zip(grid, timings)):
        forward_s, total_s = seconds[2 * i] / inner, seconds[2 * i + 1] / inner
        rows.append({"kind": kind, "arguments": list(arguments), "input": list(shape), "input_grad": input_grad,
                     "forward_s": forward_s, "backward_s": max(total_s - forward_s, 0.0)})
    return rows


OPTIMIZERS = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.01),
              "momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
              "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3)}


def optimizer_rows(device, timer, sizes=(1 << 18, 1 << 22), names=tuple(OPTIMIZERS)) -> list[dict]:
    """Seconds per parameter value of one step of each optimizer in ``names``, over parameters of
    ``sizes`` values in all (four tensors each: a layer's weight and bias are separate tensors too).

    >>> optimizer_rows(torch.device("cpu"), turn_timer(one_rank), sizes=(4096,))[0]["optimizer"]  # doctest: +SKIP
    'sgd'
    """
    cases, steps = [], []
    for name in names:
        for values in sizes:
            params = [torch.nn.Parameter(torch.randn(values // 4, device=device)) for _ in range(4)]
            for p in params:
                p.grad = torch.randn_like(p)
            cases.append((name, values))
            steps.append(OPTIMIZERS[name](params).step)
    return [{"optimizer": name, "values": values, "seconds_per_value": seconds / values}
            for (name, values), seconds in zip(cases, timer(steps))]


def codec_seconds_per_value(device, timer, n: int = 1 << 20) -> dict:
    """Per codec: seconds per value to encode with error feedback, and to decode."""
    from gpurig.parallel import codecs

    names, runs = [], []
    for name, codec in codecs.CODECS.items():
        if name == "none":
            continue
        x, residual = torch.randn(n, device=device), torch.zeros(n, device=device)
        payload, decoded = codecs.empty_payload(codec, n, device), torch.empty(n, device=device)
        names.append(name)
        runs += [lambda c=codec, x=x, r=residual, p=payload: codecs.encode_with_feedback(c, x, r, p),
                 lambda c=codec, p=payload, d=decoded: codecs.decode_into(c, p, d)]
    seconds = timer(runs)
    return {name: {"encode_s_per_value": seconds[2 * i] / n, "decode_s_per_value": seconds[2 * i + 1] / n}
            for i, name in enumerate(names)}


def _slowest(comm, seconds: list[float]) -> list[float]:
    """Per entry, the largest of every rank's ``seconds``."""
    mine = torch.tensor(seconds, dtype=torch.float64)
    return comm.allgather(mine.view(1, -1)).max(dim=0).values.tolist()


def measure_all(comm, quick: bool = False) -> dict:
    """Every compute measurement, on all of ``comm``'s ranks at once (call it on every rank).

    >>> measure_all(gpurig.init(), quick=True)["ranks"]      # doctest: +SKIP
    2
    """
    device = comm.device
    timer = turn_timer(comm)
    return {
        "ranks": comm.size, "threads_per_rank": torch.get_num_threads(), "device": str(device),
        "gemm": gemm_rows(QUICK_GEMM_GRID if quick else GPU_GEMM_GRID if device.type == "cuda" else GEMM_GRID,
                          device, timer, budget_flops=5e10 if device.type == "cuda" else 5e8),
        "memory_bytes_per_s": memory_bytes_per_s(device, timer),
        "layer_overhead_s": layer_overhead_seconds(device, timer),
        "layers": layer_rows(QUICK_LAYER_GRID if quick else GPU_LAYER_GRID if device.type == "cuda" else LAYER_GRID,
                             device, timer, repeat_s=0.002 if quick else 0.01),
        "optimizers": optimizer_rows(device, timer, sizes=(1 << 18,) if quick else (1 << 18, 1 << 22),
                                     names=("momentum",) if quick else tuple(OPTIMIZERS)),
        "codecs": codec_seconds_per_value(device, timer, n=1 << 18 if quick else 1 << 20),
    }


def run(config: dict) -> dict:
    """All compute measurements on this job's ranks; rank 0 writes them to ``config["out"]``."""
    from gpurig import comm as comm_mod

    comm = comm_mod.init()
    result = measure_all(comm, quick=config.get("quick", False))
    if comm.rank == 0:
        Path(config["out"]).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    run(json.loads(Path(sys.argv[1]).read_text()))
