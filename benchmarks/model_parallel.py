"""Data vs model vs hybrid parallelism behind a 1 Gbit/s link, measured: run the emulated benchmark, print its table.

    .venv/bin/python benchmarks/model_parallel.py                # needs root (network namespaces)
    .venv/bin/python benchmarks/model_parallel.py --engine torch --rate 10gbit

Two emulated nodes x 1 rank (``gpurig.launch.emulator.Cluster``), the CNN with a
4096-unit dense layer, global batch 128; one step of each variant per round,
interleaved (see benchmarks/model_parallel_emulated.py). The table: step time,
samples/s, MB each rank sent per step (interface counters; gpurig's own count
beside it), parameters held per rank, and data parallelism's step time over
each variant's (> 1: faster than data parallelism), the median of per-round ratios.

Beside it, ``gpurig predict``'s step time for each variant, from a profile made
of micro-benchmarks only (benchmarks/calibration.py: gpurig bench's compute part,
allreduce by size over the same emulated link), and whether the variant the
predictor picks is the one measured fastest (``--no-predict`` skips this).
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from calibration import calibrate_compute, profile_for
from gpurig.launch.emulator import Cluster
from gpurig.predict import PredictRequest, predict

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
console = Console(width=None if sys.stdout.isatty() else 150)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--engine", default="mpi")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--no-predict", dest="predict", action="store_false", help="measure only")
    args = p.parse_args()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"model_parallel-{args.model}-{args.rate}-{args.engine}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    with Cluster(nodes=2, rate=args.rate) as cluster:
        code = cluster.run([sys.executable, str(HERE / "model_parallel_emulated.py"), "--model", args.model,
                            "--hidden", str(args.hidden), "--rounds", str(args.rounds), "--out", str(out)],
                           engine=args.engine, env=env)
    if code:
        raise SystemExit(code)
    result = json.loads(out.read_text())
    if args.predict:
        if args.model != "cnn" or args.hidden != 4096:
            raise SystemExit("predictions are made for the default model (the CNN with 4096 hidden units) only")
        result["predicted_ms"] = predictions(args.rate, result["global_batch"] // 2)
        out.write_text(json.dumps(result, indent=2))
    table = Table(title=f"2 emulated nodes x 1 rank, {args.rate} link, {result['engine']}, {result['model']} with a "
                        f"{result['hidden']}-unit dense layer ({result['parameters'] / 1e6:.1f} M parameters), "
                        f"global batch {result['global_batch']}, {result['rounds']} rounds")
    for col in ("variant", "step ms", "samples/s", "MB sent per step (measured)", "MB counted by gpurig",
                "MB of parameters per rank", "data step / this step", "predicted step ms"):
        table.add_column(col, justify="right")
    predicted = result.get("predicted_ms", {})
    for name, row in result["variants"].items():
        table.add_row(name, f"{row['step_ms']:.1f}", f"{row['samples_per_s']:.0f}",
                      f"{row['bytes_sent_per_step'] / 1e6:.3f}", f"{row['bytes_counted_per_step'] / 1e6:.3f}",
                      f"{row['parameter_bytes_per_rank'] / 2**20:.1f}", f"{row['data_over_this']:.2f}x",
                      f"{predicted[name]:.1f}" if name in predicted else "")
    console.print(table)
    if predicted:
        measured_best = min(result["variants"], key=lambda v: result["variants"][v]["step_ms"])
        predicted_best = min(predicted, key=predicted.get)
        console.print(f"fastest measured: {measured_best}; the predictor's choice: {predicted_best} "
                      f"({'agrees' if measured_best == predicted_best else 'DISAGREES'})")
    console.print(f"raw numbers: {out}")


def predictions(rate: str, per_rank_batch: int) -> dict[str, float]:
    """gpurig predict's step time (ms) per variant, calibrated from micro-benchmarks on this machine and link
    (the link's allreduces measured over Open MPI)."""
    with tempfile.TemporaryDirectory(prefix="gpurig-mp-predict-") as tmp_name:
        tmp = Path(tmp_name)
        path = profile_for(calibrate_compute(tmp), rate, tmp)
        return {variant: predict(PredictRequest(model="mnist-wide-cnn", cluster=str(path), gpus=2, batch=per_rank_batch,
                                                parallel=variant, engine="mpi"))["step"]["step_ms"]
                for variant in ("data", "model", "hybrid")}


if __name__ == "__main__":
    main()
