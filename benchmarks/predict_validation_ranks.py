"""The measured side of benchmarks/predict_validation.py: training steps of each configuration, on every rank.

    gpurig run -n 2 -- python benchmarks/predict_validation_ranks.py CONFIG.json

CONFIG lists configurations (model, per-rank batch, compression); for each,
rank 0 writes the step time (the slower rank's median over the timed steps;
its mean too), and the part of it spent waiting for communication
at the end of backward (each rank's median; the least over the ranks: the
network's share, not the slower rank's compute), and
right after it one GEMM of bench's grid timed as bench times it (how fast the
machine was just then: this shared machine drifts by 10-30 % over minutes).
"""

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import gpurig
from gpurig import models
from gpurig.measure.compute import gemm_rows, turn_timer


REFERENCE = (256, 1024, 1024)  # one GEMM of bench's grid, timed as bench times it, next to every configuration


def reference_seconds(comm) -> float:
    """The machine's speed right now: bench's own timing of one of its GEMMs (the slowest rank's)."""
    return gemm_rows([REFERENCE], comm.device, turn_timer(comm))[0]["seconds"]


def measure(comm, model_name: str, batch: int, compression: str, warmup: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = models.build(model_name)
    if comm.size > 1:
        model = gpurig.DataParallel(model, comm, compression=compression)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(comm.rank)
    x, y = torch.randn(batch, 784, generator=g), torch.randint(0, 10, (batch,), generator=g)

    def step():
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    comm.barrier()
    times, waits = [], []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
        waits.append(model.stats.last_exposed_s if comm.size > 1 else 0.0)
    per_rank = comm.allgather(torch.tensor([times + waits], dtype=torch.float64))
    times, waits = per_rank[:, :steps], per_rank[:, steps:]
    # This shared machine stalls a rank now and then (single steps up to 2x), which a rank's mean keeps and its
    # median does not: the model predicts a typical step. The slower rank's is the job's step.
    return {"step_ms": 1000 * times.quantile(0.5, dim=1).max().item(),
            "mean_step_ms": 1000 * times.mean(dim=1).max().item(),
            "comm_ms": 1000 * waits.quantile(0.5, dim=1).min().item(), "reference_s": reference_seconds(comm)}


def main():
    config = json.loads(Path(sys.argv[1]).read_text())
    comm = gpurig.init()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = []
    for case in config["cases"]:
        measured = measure(comm, case["model"], case["batch"], case["compression"], config["warmup"],
                           config["steps"])
        rows.append({**case, **measured})
    if comm.rank == 0:
        Path(config["out"]).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
