"""Data vs model vs hybrid parallelism over a slow network: one training step of each, interleaved, on emulated nodes.

Runs inside ``gpurig.launch.emulator.Cluster`` (one rank per node; started by
``benchmarks/model_parallel.py``). The model has a large fully connected layer:
by default the CNN widened to 4096 hidden units (4.3 M parameters, 98 % of them
in the two dense layers). The same global batch in every variant:

- data:   gpurig.DataParallel, each rank its part of the batch, gradients averaged;
- model:  gpurig.parallelize with Krizhevsky's plan, every rank the whole batch;
- hybrid: the same plan with hybrid=True: convolutions data-parallel on each
          rank's part, the dense layers model-parallel on the gathered batch.

One step of every variant per round, the order rotating; a barrier before each
step; a step lasts as long as its slowest rank. Bytes sent are read from the
node's interface counters, and also counted by gpurig (``stats.bytes_sent``).
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F

import gpurig
from common import median, paired_ratio, slowest_rank
from gpurig import models

VARIANTS = ["data", "model", "hybrid"]


def tx_bytes() -> int:
    with open("/sys/class/net/eth1/statistics/tx_bytes") as f:
        return int(f.read())


def build(variant: str, args, comm):
    torch.manual_seed(0)
    model = models.cnn(hidden=args.hidden) if args.model == "cnn" else models.mlp(hidden=args.hidden)
    if variant == "data":
        return gpurig.DataParallel(model, comm)
    return gpurig.parallelize(model, gpurig.krizhevsky_plan(model), comm, hybrid=variant == "hybrid")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    p.add_argument("--hidden", type=int, default=4096, help="width of the large fully connected layer")
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    comm = gpurig.init()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(args.global_batch, 784, generator=g), torch.randint(0, 10, (args.global_batch,), generator=g)
    inputs = {"data": (x.tensor_split(comm.size)[comm.rank], y.tensor_split(comm.size)[comm.rank]), "model": (x, y)}
    inputs["hybrid"] = inputs["data"]
    nets = {v: build(v, args, comm) for v in VARIANTS}
    optimizers = {v: torch.optim.SGD(nets[v].parameters(), lr=0.01, momentum=0.9) for v in VARIANTS}
    seconds = {v: [] for v in VARIANTS}
    sent = {v: [] for v in VARIANTS}
    for rnd in range(args.warmup + args.rounds):
        for v in VARIANTS[rnd % 3:] + VARIANTS[: rnd % 3]:
            comm.barrier()
            before, start = tx_bytes(), time.perf_counter()
            optimizers[v].zero_grad()
            F.cross_entropy(nets[v](inputs[v][0]), inputs[v][1]).backward()
            optimizers[v].step()
            elapsed, after = time.perf_counter() - start, tx_bytes()
            if rnd >= args.warmup:
                seconds[v].append(elapsed)
                sent[v].append(after - before)
    steps = {v: slowest_rank(comm, seconds[v]) for v in VARIANTS}
    if comm.rank == 0:
        result = {"ranks": comm.size, "engine": comm.engine_name, "model": args.model, "hidden": args.hidden,
                  "parameters": sum(p.numel() for p in nets["data"].parameters()),
                  "global_batch": args.global_batch, "rounds": args.rounds, "variants": {}}
        for v in VARIANTS:
            step = median(steps[v])
            result["variants"][v] = {
                "step_ms": 1000 * step, "samples_per_s": args.global_batch / step,
                "bytes_sent_per_step": median(sent[v]),
                "bytes_counted_per_step": nets[v].stats.bytes_sent // nets[v].stats.steps,
                "parameter_bytes_per_rank": gpurig.parameter_bytes(nets[v]),
                "data_over_this": paired_ratio(steps["data"], steps[v]),
            }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
