"""ZeRO with Adam: optimizer-state and gradient bytes per rank, and step time, unsharded vs shard=optimizer vs
shard=gradients, on the engine the job runs (MPI, or Gloo with ``--engine torch``).

All three variants live in one job, on the same ranks and the same batches, and
are timed interleaved (:func:`common.interleave`), so the noise of a shared
machine hits them alike; the step time is the slowest rank's, per block of
``--block`` Adam steps, and the ratio to unsharded is the median of the per-round
ratios. The bytes are counted from the tensors each rank holds after the steps:
the optimizer's state (Adam's two moments and step counters,
:func:`gpurig.parallel.optimizer_state_bytes`) and the gradient buffers the
DataParallel keeps between steps (the buckets; with shard=gradients this rank's
shards).

    gpurig run -n 2 -- python benchmarks/zero_memory.py --out /tmp/zero.json
    gpurig run -n 3 --engine torch -- python benchmarks/zero_memory.py --out /tmp/zero.json
"""

import torch
import torch.nn.functional as F

import gpurig
from common import batches, interleave, median, paired_ratio, slowest_rank, spread, step_benchmark_args, write_result
from gpurig import models
from gpurig.parallel import optimizer_state_bytes

VARIANTS = ("none", "optimizer", "gradients")


def gradient_bytes(dp: gpurig.DataParallel) -> int:
    """Bytes of gradients this rank keeps between steps: the bucket buffers, or with shard=gradients its shards."""
    held = [b.flat for b in dp.buckets] + (dp.zero.grad_shards if dp.shard == "gradients" else [])
    return sum(t.numel() * t.element_size() for t in held)


def variant(shard: str, model_name: str, data, comm):
    """A DataParallel of ``shard`` with Adam, and a function running one block of steps on ``data``."""
    torch.manual_seed(0)
    dp = gpurig.DataParallel(models.build(model_name), comm, shard=shard)
    opt = torch.optim.Adam(dp.parameters(), lr=1e-3)
    if shard != "none":
        opt = gpurig.ZeroRedundancyOptimizer(opt, dp)

    def block():
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(dp(x), y).backward()
            opt.step()

    return dp, opt, block


def main() -> None:
    args = step_benchmark_args(__doc__).parse_args()
    comm = gpurig.init()
    data = batches(args.block, args.per_rank_batch, comm.rank)
    built = {shard: variant(shard, args.model, data, comm) for shard in VARIANTS}
    seconds = interleave({shard: block for shard, (_, _, block) in built.items()}, args.rounds, args.warmup)
    slowest = {shard: slowest_rank(comm, seconds[shard]) for shard in VARIANTS}
    rows = {}
    for shard, (dp, opt, _) in built.items():
        state = [int(v) for v in comm.allgather(torch.tensor([optimizer_state_bytes(opt)])).tolist()]
        grads = [int(v) for v in comm.allgather(torch.tensor([gradient_bytes(dp)])).tolist()]
        rows[shard] = {"optimizer_state_bytes_per_rank": state, "gradient_bytes_per_rank": grads,
                       "step_ms": 1e3 * median(slowest[shard]) / args.block, "spread": spread(slowest[shard]),
                       "time_vs_unsharded": paired_ratio(slowest[shard], slowest["none"])}
    whole = rows["none"]["optimizer_state_bytes_per_rank"][0]
    for row in rows.values():
        row["state_vs_ddp_over_n"] = max(row["optimizer_state_bytes_per_rank"]) / (whole / comm.size)
    result = {"ranks": comm.size, "engine": comm.engine_name, "model": args.model,
              "per_rank_batch": args.per_rank_batch, "block": args.block, "rounds": args.rounds, "variants": rows}
    write_result(comm, args.out, result)
    if comm.rank == 0:
        print(f"{args.model}, Adam, {comm.size} ranks over {comm.engine_name}, {args.per_rank_batch} samples per rank, "
              f"{args.rounds} rounds of {args.block} steps")
        print(f"{'shard':<10} {'opt. state MB/rank':>19} {'x (DDP/N)':>10} {'grads MB/rank':>14} {'step ms':>8} "
              f"{'vs unsharded':>13}")
        for shard, row in rows.items():
            print(f"{shard:<10} {max(row['optimizer_state_bytes_per_rank']) / 2**20:>19.2f} "
                  f"{row['state_vs_ddp_over_n']:>10.3f} {max(row['gradient_bytes_per_rank']) / 2**20:>14.2f} "
                  f"{row['step_ms']:>8.1f} {row['time_vs_unsharded']:>13.3f}")
    gpurig.shutdown()


if __name__ == "__main__":
    main()
