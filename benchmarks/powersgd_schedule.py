"""PowerSGD's schedule: each bucket begun when ready and finished after the next begins, vs its whole chain at once.

    .venv/bin/python benchmarks/powersgd_schedule.py               # 2 local ranks; 2 emulated nodes at 1 Gbit/s (root)
    .venv/bin/python benchmarks/powersgd_schedule.py --rounds 20   # quicker

gpurig.DataParallel begins a PowerSGD bucket when its gradients are ready (the
products P = M·Q and a non-blocking allreduce of P) and finishes it (Q's
products and allreduce, the average) after the next compressed bucket has
begun, the last one at the end of backward, as it does the element-wise
codecs. Before, it ran each bucket's whole chain, both allreduces blocking, as
soon as the bucket was ready, and checked each allreduce against the other
ranks on its own. On CPU ranks that made every rank wait for the others in
the middle of backward. This times both schedules side by side (one step of
each per round, after a barrier; the slower rank's median step), with
uncompressed and int8 steps for reference, on the source's MLP and the CNN.
Rank 0 writes benchmarks/results/powersgd_schedule.json.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
VARIANTS = ("none", "int8", "powersgd, whole chain at once", "powersgd")


def whole_chain_data_parallel():
    """DataParallel with PowerSGD's schedule before: the whole chain as soon as a bucket is ready, unannounced."""
    from gpurig import DataParallel
    from gpurig.parallel.compression import average

    class WholeChain(DataParallel):
        def _signatures(self):
            return [] if any(m.startswith("powersgd") for m in self.methods) else super()._signatures()

        def _begin_compressed(self, bucket, name):
            if not bucket.method.startswith("powersgd"):
                return super()._begin_compressed(bucket, name)
            self._finish_in_flight()
            self.stats.bytes_sent += average(self.comm, bucket.flat, bucket.method, bucket.state, bucket.shapes,
                                             name)

    return WholeChain


def ranks(config: dict) -> None:
    """Every rank: each configuration's variants, one step of each per round."""
    import gpurig
    from gpurig import models

    comm = gpurig.init()
    whole_chain = whole_chain_data_parallel()
    rows = []
    for model_name, batch in config["cases"]:
        steppers = {}
        for variant in VARIANTS:
            torch.manual_seed(0)
            cls = whole_chain if "whole" in variant else gpurig.DataParallel
            model = cls(models.build(model_name), comm, compression=variant.split(",")[0])
            steppers[variant] = (model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
        g = torch.Generator().manual_seed(comm.rank)
        x, y = torch.randn(batch, 784, generator=g), torch.randint(0, 10, (batch,), generator=g)
        times = {v: [] for v in VARIANTS}
        for round_ in range(config["warmup"] + config["rounds"]):
            for variant, (model, optimizer) in steppers.items():
                comm.barrier()
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                if round_ >= config["warmup"]:
                    times[variant].append(time.perf_counter() - start)
        medians = comm.allgather(torch.tensor([[statistics.median(times[v]) for v in VARIANTS]], dtype=torch.float64))
        rows.append({"model": model_name, "batch": batch,
                     **{v: 1000 * medians[:, i].max().item() for i, v in enumerate(VARIANTS)}})
    if comm.rank == 0:
        Path(config["out"]).write_text(json.dumps(rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--ranks", metavar="CONFIG", help=argparse.SUPPRESS)  # what each rank runs
    args = p.parse_args()
    if args.ranks:
        return ranks(json.loads(Path(args.ranks).read_text()))

    from rich.console import Console
    from rich.table import Table

    from calibration import run_env
    from gpurig.launch.emulator import unavailable

    console = Console(width=None if sys.stdout.isatty() else 160)
    reason = unavailable()
    envs = ["local"] + (["1gbit"] if reason is None else [])
    if reason:
        console.print(f"[yellow]no emulated nodes ({reason}): 2 local ranks only[/]")
    results = []
    with tempfile.TemporaryDirectory(prefix="gpurig-powersgd-") as tmp:
        for env in envs:
            out, config = Path(tmp) / f"{env}.json", Path(tmp) / f"{env}-config.json"
            config.write_text(json.dumps({"cases": [["mlp", 32], ["mlp", 128], ["cnn", 32], ["cnn", 128]],
                                          "rounds": args.rounds, "warmup": args.warmup, "out": str(out)}))
            run_env(env, [sys.executable, str(Path(__file__).resolve()), "--ranks", str(config)])
            results += [{"env": env, **row} for row in json.loads(out.read_text())]
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "powersgd_schedule.json").write_text(json.dumps(results, indent=2))
    table = Table(title="PowerSGD's schedule: step time, ms (2 ranks, the slower rank's median)")
    for column in ("environment", "model", "batch per rank", *VARIANTS, "whole chain / pipelined"):
        table.add_column(column, justify="left" if column in ("environment", "model") else "right")
    for r in results:
        table.add_row(r["env"], r["model"], str(r["batch"]), *(f"{r[v]:.1f}" for v in VARIANTS),
                      f"{r[VARIANTS[2]] / r['powersgd']:.2f}x")
    console.print(table)


if __name__ == "__main__":
    main()
