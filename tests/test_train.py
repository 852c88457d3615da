"""``gpurig train``, the main job, end to end: accuracy, both engines, crash and resume, bad input."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import gpurig, run_cli, train_json
from gpurig.train.checkpoints import damaged, epoch_path, saved_epochs

# Stated in the README: the default run (mlp, 5 epochs, global batch 128 on 2 ranks) reaches about 92 %.
DEFAULT_RUN_ACCURACY = 0.91


# default_run: conftest's (the default run without compression, uninterrupted), shared with test_model_parallel


def test_the_default_command_reaches_the_stated_accuracy(tmp_path):
    with open(tmp_path / "configurations.txt", "w+") as listing:   # a shell loop's `while read ...; done < list`
        listing.write("mlp\ncnn\n")
        listing.flush()
        listing.seek(0)
        done = gpurig("train", "--json", "--checkpoint-dir", tmp_path, timeout=300, stdin=listing)
        assert os.lseek(listing.fileno(), 0, os.SEEK_CUR) == 0, "the ranks read the caller's standard input"
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["compression"] == "auto" and summary["test_accuracy"] >= DEFAULT_RUN_ACCURACY
    # two ranks on one machine share memory, not a network: auto keeps gradients uncompressed
    assert summary["compression_choice"]["codec"] == "none", summary["compression_choice"]
    # next to the measured split, gpurig predict's for the same configuration, from the job's micro-benchmarks
    predicted, measured = summary["predicted"], summary["epochs"][-1]
    assert predicted["compression"] == "none" and (tmp_path / "profile.json").is_file()
    # those seconds are said, not silent (stderr: --json's stdout is the summary only)
    assert "measuring this job's 2 ranks and their links for the prediction" in done.stderr, done.stderr[-2000:]
    assert 1 / 3 < predicted["step_ms"] / measured["step_ms"] < 3, (predicted, measured)  # units and wiring right
    parts = predicted["compute_ms"] + predicted["comm_ms"] + predicted["wait_ms"] + predicted["data_ms"]
    assert abs(parts - predicted["step_ms"]) < 0.01
    # the compressed averages auto may choose were timed whole in the job, each at two bucket sizes
    engine = json.loads((tmp_path / "profile.json").read_text())["comm"]["engines"]["mpi"]
    for method in ("fp16", "int8", "powersgd"):
        rows = engine[f"compressed:{method}"]["rows"]
        assert [r["bytes"] for r in rows] == [4 << 18, 4 << 20] and all(r["seconds"] > 0 for r in rows), rows


def test_uncompressed_run_reaches_the_stated_accuracy(default_run):
    assert default_run["ranks"] == 2 and default_run["engine"] == "mpi" and default_run["per_rank_batch"] == 64
    assert len(default_run["epochs"]) == 5
    assert default_run["test_accuracy"] >= DEFAULT_RUN_ACCURACY
    for epoch in default_run["epochs"]:  # the measured split adds up to the step time (within loop overhead)
        parts = epoch["compute_ms"] + epoch["comm_ms"] + epoch["wait_ms"] + epoch["data_ms"]
        assert 0.8 * epoch["step_ms"] <= parts <= 1.05 * epoch["step_ms"], epoch


def test_torch_engine_trains_too(torch_cnn_one_epoch):
    # conftest's run (uncompressed; test_model_parallel compares the hybrid CNN with it): auto on Gloo is
    # tests/workers/compression.py's, on both engines
    summary = torch_cnn_one_epoch
    assert summary["engine"] == "torch/gloo" and summary["model"] == "cnn" and summary["test_accuracy"] > 0.85
    # predicted over the engine that ran it (the job's Gloo measurements; it once said "--engine must be mpi or
    # torch, got 'torch/gloo'" here instead)
    predicted, measured = summary["predicted"], summary["epochs"][-1]
    assert 1 / 3 < predicted["step_ms"] / measured["step_ms"] < 3, (predicted, measured)


def _rank_processes(job: subprocess.Popen) -> list[psutil.Process]:
    """The rank processes of ``job`` (its descendants only: other jobs may train on this machine too)."""
    def cmdline(p):
        try:
            return " ".join(p.cmdline())
        except psutil.Error:
            return ""
    return [p for p in psutil.Process(job.pid).children(recursive=True)
            if "gpurig.train" in cmdline(p) and "rank_wrapper" not in cmdline(p)]


def test_killed_run_resumes_to_the_uninterrupted_weights_past_a_corrupt_checkpoint(default_run, tmp_path):
    """SIGKILL mid-run, then the newest checkpoint damaged on disk: resume reports it, takes the one before, and
    still ends with the uninterrupted run's weights."""
    job = subprocess.Popen([sys.executable, "-m", "gpurig", "train", "--compression", "none", "--no-predict", "--json",
                            "--checkpoint-dir", str(tmp_path)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300  # generous: on a loaded machine 3 epochs have taken over 2 minutes
    while (saved_epochs(tmp_path) or [0])[0] < 3:  # kill during epoch 4
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
        time.sleep(0.2)
    victims = _rank_processes(job)
    assert victims, "no rank process found"
    victims[-1].send_signal(signal.SIGKILL)
    _, err = job.communicate(timeout=60)
    assert job.returncode != 0 and "SIGKILL" in err.splitlines()[-1]
    assert damaged(tmp_path) == {}  # the kill left no torn checkpoint
    newest = saved_epochs(tmp_path)[0]
    assert newest in (3, 4)
    data = bytearray(epoch_path(tmp_path, newest).read_bytes())
    data[len(data) // 2] ^= 0xFF
    epoch_path(tmp_path, newest).write_bytes(bytes(data))

    resumed = gpurig("train", "--compression", "none", "--no-predict", "--json", "--resume", "--checkpoint-dir", tmp_path,
                     timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"checkpoint-epoch{newest}.pt is corrupt" in resumed.stderr
    assert f"resuming from {epoch_path(tmp_path, newest - 1)}" in resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["weights_digest"] == default_run["weights_digest"]
    assert [e["loss"] for e in summary["epochs"]] == [e["loss"] for e in default_run["epochs"]]


def test_resuming_at_or_past_epochs_trains_nothing_and_says_so(mlp_two_epochs_of_512, tmp_path):
    """conftest's run ended at epoch 2: --resume --epochs 1 (or 2) trains nothing, says so, and names epoch 2's
    checkpoint, whose accuracy it reports (it once said "epochs 3..1" and named checkpoint-epoch1.pt)."""
    shutil.copytree(Path(mlp_two_epochs_of_512["checkpoint"]).parent, tmp_path, dirs_exist_ok=True)
    again = ("--resume", "--epochs", 1, "--global-batch", 512, "--compression", "none", "--no-predict")
    summary = train_json(*again, checkpoint_dir=tmp_path)
    assert summary["nothing_to_train"] and summary["checkpoint"] == str(epoch_path(tmp_path, 2))
    assert summary["epochs"] == mlp_two_epochs_of_512["epochs"]
    assert summary["weights_digest"] == mlp_two_epochs_of_512["weights_digest"]
    done = gpurig("train", "-n", 1, *again, "--checkpoint-dir", tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = " ".join(done.stdout.split())  # rich wraps long lines
    assert ("the checkpoint is at the end of epoch 2 and --epochs 1 asks for no more: nothing to train "
            "(--epochs 3 or more trains on)") in out, out
    assert f"test accuracy {100 * summary['test_accuracy']:.1f} %; checkpoint {epoch_path(tmp_path, 2)}" in out
    assert "mlp on mnist: 1 rank, mpi" in out and "epochs 3..1" not in out
    assert saved_epochs(tmp_path) == [2, 1]  # nothing written


@pytest.mark.parametrize("args,message", [
    (["--global-batch", "1"], "leaves 1 rank(s) with no samples"),
    (["--model", "resnet9000"], "unknown model"),
    (["--resume"], "no checkpoint"),
    (["-n", "0"], "-n must be at least 1"),
    (["--epochs", "0"], "--epochs"),
    (["--epochs", "three"], "invalid int value"),
    (["--compression", "int4"], "unknown compression"),
    (["--compression", "powersgd:0"], "positive integer"),
    (["--compression", "auto:int4"], "'int4' is not a method"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    code, out, err = run_cli(["train", *args, "--checkpoint-dir", tmp_path / "none"])
    assert code == 2 and message in err and "Traceback" not in err + out
    assert len([line for line in err.splitlines() if line.startswith("gpurig")]) == 1


def test_help_explains_with_examples():
    for args in (["--help"], ["train", "--help"], ["run", "--help"]):
        done = gpurig(*args, timeout=30)
        assert done.returncode == 0 and "examples:" in done.stdout
    assert "gpurig train" in gpurig("--help").stdout


# int8 and int8-dynamic reach the uncompressed accuracy in conftest's 2 epochs of 7 steps of 512 (its
# mlp_two_epochs_of_512); powersgd's rank-4 factors need the default run's 5 epochs of 31 steps of 128 to catch up
SHORT = ("--epochs", 2, "--global-batch", 512)


def test_int8_training_matches_uncompressed_accuracy(mlp_two_epochs_of_512, int8_three_epochs_of_512):
    """conftest's int8 run is SHORT and one epoch more: its epoch 2 against the uncompressed 2 epochs."""
    uncompressed, int8_run = mlp_two_epochs_of_512, int8_three_epochs_of_512
    assert [e["epoch"] for e in uncompressed["epochs"]] == [1, 2] and uncompressed["global_batch"] == 512
    assert abs(int8_run["epochs"][1]["test_accuracy"] - uncompressed["test_accuracy"]) <= 0.005
    assert int8_run["bytes_sent_per_step"] < uncompressed["bytes_sent_per_step"] / 3.9  # 8 bits + scales vs 32


@pytest.mark.parametrize("method,reference,args", [("int8-dynamic", "mlp_two_epochs_of_512", SHORT),
                                                   ("powersgd", "default_run", ())], ids=["int8-dynamic", "powersgd"])
def test_other_codecs_match_uncompressed_accuracy(request, method, reference, args, tmp_path):
    uncompressed = request.getfixturevalue(reference)
    done = gpurig("train", *args, "--compression", method, "--no-predict", "--json", "--checkpoint-dir", tmp_path,
                  timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["global_batch"] == uncompressed["global_batch"]
    assert len(summary["epochs"]) == len(uncompressed["epochs"])
    assert abs(summary["test_accuracy"] - uncompressed["test_accuracy"]) <= 0.005
    if method == "powersgd":  # rank-4 factors of the two big layers: about 1 % of the bytes
        assert summary["bytes_sent_per_step"] < uncompressed["bytes_sent_per_step"] / 50


def test_error_feedback_state_resumes_exactly(int8_three_epochs_of_512, int8_resumed):
    """conftest's int8 run keeps its 2 newest checkpoints, with every rank's residuals (epoch 1's pruned); resumed
    from epoch 2's (conftest's int8_resumed: as if killed in epoch 3, after its checkpoint), the run ends bit for bit
    where it did: the residuals came back, not zeros."""
    summary, _, kept = int8_resumed
    assert [name for name in kept if name.startswith("feedback-")] == [  # the residuals of every kept checkpoint
        f"feedback-rank{r}-epoch{e}.pt" for r in (0, 1) for e in (2, 3)]
    assert [e["epoch"] for e in summary["epochs"]] == [1, 2, 3]
    assert summary["weights_digest"] == int8_three_epochs_of_512["weights_digest"]
