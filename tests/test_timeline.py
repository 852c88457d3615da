"""The timeline: ``gpurig train --timeline``, ``gpurig.timeline()`` in one's own script, ``gpurig predict --timeline``.

Real ranks over real engines: the trace must be Chrome trace event JSON that
Perfetto opens (the fields it needs, one process per rank, named), its
main-thread phases must tile each rank's steps, and their totals must match the
step split ``gpurig train`` prints within 5 %.
"""

import json
import os
import textwrap
from pathlib import Path

import pytest

from conftest import gpurig, run_cli
from gpurig.perf.timeline import PHASES, phase_totals
from gpurig.train.loop import WARMUP_STEPS

SPLIT = {"compute": ("forward", "backward", "optimizer"), "comm": ("communication",),
         "wait": ("wait for slowest rank",), "data": ("data loading",)}


def strict_json(path) -> dict:
    """The file parsed as JSON that browsers (Perfetto's JSON.parse) accept: Python's NaN / Infinity refused."""
    def refuse(word):
        raise ValueError(f"{path}: {word} is not JSON")

    return json.loads(Path(path).read_text(), parse_constant=refuse)


def check_format(trace: dict) -> list[dict]:
    """Every event has what the trace event format asks of it. Returns the X events."""
    events = trace["traceEvents"]
    assert events and all({"name", "ph", "pid", "tid"} <= set(e) for e in events)
    assert {e["ph"] for e in events} == {"X", "M"}  # complete events, and the metadata naming processes and threads
    assert all(isinstance(e["pid"], int) and isinstance(e["tid"], int) for e in events)
    complete = [e for e in events if e["ph"] == "X"]
    assert all(isinstance(e["ts"], float) and isinstance(e["dur"], float) and e["dur"] >= 0 for e in complete)
    return complete


def check_schema(trace: dict, ranks: int) -> list[dict]:
    """The trace event format, and one named process per rank. Returns the X events."""
    events, complete = trace["traceEvents"], check_format(trace)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {rank: f"rank {rank}" for rank in range(ranks)}
    assert {e["pid"] for e in complete} == set(range(ranks))
    return complete


def assert_tiles(complete: list[dict], pid: int) -> None:
    """A rank's main-thread phases never overlap (they are laid end to end, waits cut out of backward)."""
    main = sorted((e for e in complete if e["pid"] == pid and e["tid"] == 0), key=lambda e: e["ts"])
    for before, after in zip(main, main[1:]):
        assert before["ts"] + before["dur"] <= after["ts"] + 0.01, (before, after)


# the runs below: the engine, and what else the step does (model parallelism's exchanges inside forward and
# backward, ZeRO's allgather inside the optimizer's step: each cut out of its phase, as the printed split cuts it)
RUNS = {"torch": ("torch",), "mpi": ("mpi",), "model parallel": ("torch", "--parallel", "model"),
        "sharded": ("torch", "--shard", "optimizer")}


@pytest.fixture(params=list(RUNS))
def timeline_run(request, tmp_path) -> tuple[dict, Path]:
    """(summary, trace) of gpurig train --timeline on 2 ranks, 512 a step, uncompressed: over Gloo one epoch run
    here; over MPI conftest's mlp_two_epochs_of_512 (2 epochs, recorded with --timeline)."""
    if request.param == "mpi":
        summary = request.getfixturevalue("mlp_two_epochs_of_512")
        assert summary["engine"] == "mpi" and summary["compression"] == "none" and summary["global_batch"] == 512
        return summary, Path(summary["timeline"])
    engine, *more = RUNS[request.param]
    trace_path = tmp_path / "trace.json"
    done = gpurig("train", "-n", 2, "--engine", engine, "--epochs", 1, "--global-batch", 512, "--compression",
                  "none", "--no-predict", "--json", "--checkpoint-dir", tmp_path / "ck", "--timeline", trace_path,
                  *more, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), trace_path


def test_train_timeline_matches_the_printed_split(timeline_run):
    summary, trace_path = timeline_run
    trace = strict_json(trace_path)
    complete = check_schema(trace, ranks=2)
    epochs = summary["epochs"]
    steps = len(epochs) * (4000 // 512)
    sharded = summary.get("shard", "none") != "none"   # buckets reduce-scattered straight from the gradients
    names = {"reduce-scatter"} if sharded else {"copy in", "allreduce"}
    collective = "reduce-scatter" if sharded else "allreduce"
    for pid in (0, 1):
        assert_tiles(complete, pid)
        buckets = [e for e in complete if e["pid"] == pid and e["tid"] > 0]
        if summary.get("parallel", "data") != "data":   # model parallelism: no buckets
            assert not buckets
            continue
        assert {e["name"] for e in buckets} == names
        assert len([e for e in buckets if e["name"] == collective]) == steps * len({e["tid"] for e in buckets})
    # the printed split leaves out the run's first WARMUP_STEPS steps (loading kernels, growing the allocator, an
    # engine's first collective): so do the trace's totals, from the data loading of the step after them
    timed = {name: 0.0 for name in PHASES}
    for pid in (0, 1):
        after = next(e["ts"] for e in complete if e["pid"] == pid and e["tid"] == 0 and e["name"] == "data loading"
                     and e["args"]["step"] == WARMUP_STEPS + 1)
        kept = {**trace, "traceEvents": [e for e in trace["traceEvents"] if e["ph"] != "X" or e["ts"] >= after]}
        for name, seconds in phase_totals(kept, pid).items():
            timed[name] = timed.get(name, 0.0) + seconds / 2
    per_epoch = steps // len(epochs)
    counts = [per_epoch - WARMUP_STEPS] + [per_epoch] * (len(epochs) - 1)
    for part, phases in SPLIT.items():
        traced_ms = 1000 * sum(timed[p] for p in phases) / sum(counts)
        printed = sum(epoch[f"{part}_ms"] * n for epoch, n in zip(epochs, counts)) / sum(counts)
        # within 5 % of the printed number, each part, however small (2 µs: the printed numbers' rounding)
        assert abs(traced_ms - printed) <= 0.05 * printed + 0.002, (part, traced_ms, printed)


WRAP = """
model = gpurig.DataParallel(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 512),
                                                torch.nn.Linear(512, 512)),  # 3 buckets
                            bucket_cap_mb=0.01, compression={compression!r})
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""
SCRIPT = textwrap.dedent("""
    import torch, gpurig
    comm = gpurig.init()
    torch.manual_seed(0)
    {before}
    with gpurig.timeline({path!r}) as timeline:
        {inside}
        for step in range(3):
            with timeline.span("forward"):
                loss = model(torch.randn(8, 64)).square().mean()
            with timeline.span("backward"):
                loss.backward()
            with timeline.span("optimizer"):
                optimizer.step()
""")


@pytest.mark.parametrize("compression,wrapped_before", [("none", False), ("int8", True)])
def test_own_script_records_with_gpurig_timeline(tmp_path, compression, wrapped_before):
    """The library: a script's own spans and DataParallel's buckets (several), both ranks, under gpurig run (MPI);
    compressed buckets record their two halves; a model wrapped before the block records in it too."""
    trace_path = tmp_path / "own.json"
    script = tmp_path / "own.py"
    wrap = WRAP.format(compression=compression)
    before, inside = (wrap, "") if wrapped_before else ("", textwrap.indent(wrap, " " * 4).strip())
    script.write_text(SCRIPT.format(path=str(trace_path), before=before, inside=inside))
    done = gpurig("run", "-n", 2, "--", "python", script, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    complete = check_schema(strict_json(trace_path), ranks=2)
    halves = ["allreduce"] if compression == "none" else [f"encode + send ({compression})", "receive + decode"]
    for pid in (0, 1):
        mine = [e["name"] for e in complete if e["pid"] == pid]
        assert mine.count("forward") == 3 and mine.count("optimizer") == 3
        buckets = {e["tid"] for e in complete if e["pid"] == pid and e["tid"] > 0}
        assert len(buckets) > 1
        for half in halves:
            assert mine.count(half) == 3 * len(buckets), (half, mine)


def test_predict_timeline_is_the_printed_step(tmp_path):
    path = tmp_path / "predicted.json"
    code, out, err = run_cli(["predict", "--model", "resnet50", "--cluster", "2 nodes x 4 A100, 100GbE",
                              "--timeline", str(path), "--json"])
    assert code == 0, err
    step = json.loads(out)["step"]
    trace = strict_json(path)
    check_format(trace)
    totals = phase_totals(trace, pid=0)
    for phase, key in (("forward", "forward_ms"), ("backward", "backward_ms"), ("optimizer", "optimizer_ms"),
                       ("communication", "comm_ms"), ("wait for slowest rank", "wait_ms"),
                       ("data loading", "data_ms")):
        assert 1000 * totals[phase] == pytest.approx(step[key], rel=1e-3, abs=1e-3), phase
    assert sum(1000 * v for v in totals.values()) == pytest.approx(step["step_ms"], rel=1e-3)


def test_a_timeline_is_written_through_a_link_and_never_over_a_device_or_fifo(tmp_path):
    """Written atomically (a file renamed into place): renamed over a link it would cut the link, over a FIFO or a
    device node (as root: /dev/full) it would replace the node with a plain file."""
    target, link, fifo = tmp_path / "kept.json", tmp_path / "link.json", tmp_path / "fifo.json"
    target.write_text("old")
    link.symlink_to(target)
    os.mkfifo(fifo)
    args = ["predict", "--model", "mnist-mlp", "--cluster", "2 x T4", "--timeline"]
    code, _, err = run_cli([*args, str(link)])
    assert code == 0 and link.is_symlink() and "traceEvents" in strict_json(target), err
    for node in (fifo, "/dev/full"):
        code, out, err = run_cli([*args, str(node)])
        assert code == 2 and err.strip() == (f"gpurig: error: --timeline {node}: {Path(node).resolve()} is not a "
                                             f"regular file (a device, a FIFO): give a file name"), err
    assert fifo.is_fifo() and Path("/dev/full").is_char_device()
