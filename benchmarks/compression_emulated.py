"""Gradient compression over a slow network: step throughput per codec, on emulated nodes.

Runs inside ``gpurig.launch.emulator.Cluster`` (network namespaces, links limited
with tc): one rank per node, the source's 784-1200-1200-10 MLP, one
``DataParallel`` per codec, one step of each per round in a rotating order.
Bytes sent are read from the node's interface counters (what really left the
namespace), not computed.

    .venv/bin/python benchmarks/compression.py      # starts it; needs root
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F

import gpurig
from gpurig import models

CODECS = ["none", "fp16", "int8", "int8-dynamic", "powersgd", "auto"]


def tx_bytes() -> int:
    with open("/sys/class/net/eth1/statistics/tx_bytes") as f:
        return int(f.read())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=30)
    # auto decides after 6 steps, then times up to 3 shortlisted assignments for 4 steps each
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--per-rank-batch", type=int, default=64)
    p.add_argument("--bucket-mb", type=float, default=None, help="default: DataParallel's (25 MB, 4 MB compressed)")
    p.add_argument("--codecs", default=",".join(CODECS), help="comma-separated; default: all; CODEC/before: "
                   "without keeping a bucket's pieces moving until the next one (DataParallel.keep_moving)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    codecs = args.codecs.split(",")
    comm = gpurig.init()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(comm.rank)
    x = torch.randn(args.per_rank_batch, 784, generator=g)
    y = torch.randint(0, 10, (args.per_rank_batch,), generator=g)
    variants = {}
    for name in codecs:
        torch.manual_seed(0)
        method, _, before = name.partition("/")  # "int8/before": pieces left until the next bucket, as before
        model = gpurig.DataParallel(models.mlp(), compression=method, bucket_cap_mb=args.bucket_mb)
        model.keep_moving = before != "before"
        variants[name] = (model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    times = {name: [] for name in codecs}
    sent = {name: [] for name in codecs}
    exposed = {name: [] for name in codecs}

    def step(model, opt) -> tuple[float, int]:
        comm.barrier()
        before, start = tx_bytes(), time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        return time.perf_counter() - start, tx_bytes() - before

    # Warm-up: each variant's steps in a row, as in training (auto decides and times its shortlist here,
    # on its own steps); then the measured rounds, one step of each variant per round, in rotating order.
    for name in codecs:
        for _ in range(args.warmup):
            step(*variants[name])
    for rnd in range(args.rounds):
        for name in codecs[rnd % len(codecs):] + codecs[: rnd % len(codecs)]:
            elapsed, nbytes = step(*variants[name])
            times[name].append(elapsed)
            sent[name].append(nbytes)
            exposed[name].append(variants[name][0].stats.last_exposed_s)
    slowest = comm.allreduce(torch.tensor([sorted(times[n])[len(times[n]) // 2] for n in codecs],
                                          dtype=torch.float64), op="sum") / comm.size
    # each round's step as the slower rank took it, so variants can be compared round by round (paired)
    per_round = comm.allgather(torch.tensor([times[n] for n in codecs], dtype=torch.float64).unsqueeze(0))
    per_round = per_round.max(dim=0).values
    if comm.rank == 0:
        result = {"ranks": comm.size, "per_rank_batch": args.per_rank_batch, "engine": comm.engine_name, "codecs": {}}
        for i, name in enumerate(codecs):
            step = slowest[i].item()
            result["codecs"][name] = {
                "step_ms": 1000 * step,
                "exposed_ms": 1000 * sorted(exposed[name])[len(exposed[name]) // 2], "samples_per_s": comm.size * args.per_rank_batch / step,
                "bytes_sent_per_step": sorted(sent[name])[len(sent[name]) // 2],
                "bytes_computed_per_step": variants[name][0].stats.bytes_sent // variants[name][0].stats.steps,
                "methods": variants[name][0].methods,
                "auto_reasoning": variants[name][0].auto_choice,
                "rounds_ms": [round(1000 * t, 3) for t in per_round[i].tolist()],
            }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
