"""gpurig train's metrics where people look: metrics.jsonl beside the checkpoints, TensorBoard event files with
--logdir; both hold every step and every epoch, with the numbers the run's summary reports."""

import json
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import run_cli

STEPS = 3 * (4000 // 512)  # 3 epochs of --global-batch 512 on the 4,000 training images, last partial batches dropped


def test_metrics_reach_the_jsonl_file_and_tensorboard(int8_three_epochs_of_512):
    """conftest's int8 run (3 epochs of 512, --logdir beside its checkpoint directory)."""
    summary = int8_three_epochs_of_512
    ck = Path(summary["checkpoint"]).parent
    lines = [json.loads(line) for line in (ck / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in lines if r["kind"] == "step"]
    epochs = [r for r in lines if r["kind"] == "epoch"]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    for r in steps:
        assert r["loss"] > 0 and 0 <= r["accuracy"] <= 1 and r["samples_per_s"] > 0 and r["codec"] == "int8"
        assert r["compute_ms"] > 0 and r["comm_wait_ms"] >= 0 and r["data_ms"] >= 0
    assert steps[-1]["bytes_sent"] == summary["bytes_sent_per_step"] > 0
    assert [e["test_accuracy"] for e in epochs] == [e["test_accuracy"] for e in summary["epochs"]]

    events = EventAccumulator(str(ck.parent / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("step/loss")] == list(range(1, STEPS + 1))
    assert [round(e.value, 5) for e in events.Scalars("epoch/test_accuracy")] == \
        [e["test_accuracy"] for e in summary["epochs"]]
    assert {"step/samples_per_s", "step/comm_wait_ms", "step/bytes_sent", "epoch/loss"} <= set(events.Tags()["scalars"])


def test_a_resumed_run_keeps_the_lines_before_its_checkpoint_and_appends_its_own(int8_resumed):
    """A resumed run keeps the epochs it resumes after, drops what the killed run logged after them (epoch 3's
    lines and the step conftest's int8_resumed appended), appends its own."""
    _, ck, _ = int8_resumed
    lines = [json.loads(line) for line in (ck / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["kind"] == "step"] == list(range(1, STEPS + 1))
    assert [r["epoch"] for r in lines if r["kind"] == "epoch"] == [1, 2, 3]


def test_logdir_without_tensorboard_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "tensorboard", None)  # as if it were not installed
    code, out, err = run_cli(["train", "--logdir", tmp_path / "tb", "--checkpoint-dir", tmp_path / "none"])
    assert code == 2 and "pip install tensorboard" in err and "Traceback" not in err + out


def test_the_epoch_table_shows_its_numbers_whole_in_80_columns():
    """An 80-column terminal drops the table's lines and the columns the epoch lines already print (data,
    TFLOP/s); a wide one gets them all. Four-digit step times and a six-digit rate stay whole either way."""
    import io

    from rich.console import Console

    from gpurig.cli.train import _TrainView

    row = {"epoch": 12, "loss": 1.00834, "test_accuracy": 0.9876, "samples_per_s": 123456.0, "step_ms": 1693.83,
           "compute_ms": 1648.5, "comm_ms": 1043.5, "wait_ms": 1001.5, "data_ms": 100.4, "tflops": 0.0123,
           "mfu": 0.123}
    done = {"model": "mlp", "data": "mnist", "ranks": 2, "engine": "mpi", "epochs": [row], "global_batch": 128,
            "test_accuracy": 0.98, "checkpoint": "c",
            "predicted": {"step_ms": 1693.8, "compute_ms": 1648.5, "comm_ms": 1043.5, "wait_ms": 1001.5,
                          "data_ms": 100.4, "profile": "p", "compression": "none"}}
    for width, shown in [(80, ["1693.8", "1648.5", "1043.5", "1001.5", "123456", "1.0083", "98.8%", "12.3%"]),
                         (160, ["100.4", "0.0123"])]:
        view = _TrainView()
        view.console = Console(width=width, file=io.StringIO())
        view.summary(done)
        out = view.console.file.getvalue()
        assert max(len(line) for line in out.splitlines()) <= width and "…" not in out
        table = out.split("test accuracy")[0]
        assert all(number in table for number in shown), table
