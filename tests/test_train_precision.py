"""gpurig train's step options end to end: --precision, --accumulate, and the one line a diverging run ends with."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from conftest import gpurig, run_cli
from gpurig.train.checkpoints import epoch_path, load, saved_epochs

FAST = ("--no-predict", "--compression", "none")


def _train(tmp_path, *args, timeout=300):
    done = gpurig("train", *FAST, "--json", "--checkpoint-dir", tmp_path, *args, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


# 1 epoch of 7 steps of 512 (fp16 is slow on CPU cores); docs/training.md has the 5-epoch MLP and CNN numbers
SHORT = ("--epochs", 1, "--global-batch", 512)


@pytest.fixture(scope="module")
def fp32_accuracy(mlp_two_epochs_of_512):
    """SHORT's test accuracy in fp32 on 2 MPI ranks, uncompressed: epoch 1 of conftest's run (shared with
    test_resilience; no learning-rate schedule makes epoch 1 depend on the epochs after it)."""
    assert mlp_two_epochs_of_512["precision"] == "fp32" and mlp_two_epochs_of_512["engine"] == "mpi"
    assert mlp_two_epochs_of_512["global_batch"] == 512 and mlp_two_epochs_of_512["ranks"] == 2
    return mlp_two_epochs_of_512["epochs"][0]["test_accuracy"]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_reaches_the_fp32_accuracy(fp32_accuracy, precision, tmp_path):
    summary = _train(tmp_path, *SHORT, "--precision", precision)
    assert summary["precision"] == precision and summary["ranks"] == 2
    assert abs(summary["test_accuracy"] - fp32_accuracy) <= 0.005, (summary, fp32_accuracy)
    if precision == "fp16":  # the loss scaler ran and the scale is in the checkpoint, for --resume
        assert summary["loss_scale"] >= 1.0
        assert load(epoch_path(tmp_path, 1))["scaler"]["scale"] == summary["loss_scale"]


@pytest.fixture(scope="module")
def one_good_epoch(mlp_two_epochs_of_512, tmp_path_factory):
    """One plain epoch of 7 steps of 512 (fp32, MPI, uncompressed): the directory with its checkpoint, and the run's
    summary. Epoch 1 of conftest's 2-epoch run (nothing in epoch 1 depends on the epochs after it), epoch 2's removed."""
    directory = tmp_path_factory.mktemp("good")
    shutil.copytree(Path(mlp_two_epochs_of_512["checkpoint"]).parent, directory, dirs_exist_ok=True)
    for path in directory.glob("*-epoch2*.pt"):
        path.unlink()
    assert saved_epochs(directory) == [1] and mlp_two_epochs_of_512["precision"] == "fp32"
    return directory, mlp_two_epochs_of_512


def test_accumulation_on_the_command_line_matches_the_plain_step(one_good_epoch, tmp_path):
    # 7 steps of 512: over dozens of steps a ReLU that sits within float rounding of zero can flip either way
    # and part any two summation orders (tests/workers/train_step.py checks the step itself on 2 and 3 ranks)
    plain_dir, plain = one_good_epoch
    accumulated = _train(tmp_path / "k4", "--epochs", 1, "--global-batch", 512, "--accumulate", 4, "--engine", "torch")
    assert accumulated["accumulate"] == 4 and accumulated["bytes_sent_per_step"] == plain["bytes_sent_per_step"]
    a, b = load(epoch_path(plain_dir, 1))["model"], load(epoch_path(tmp_path / "k4", 1))["model"]
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=1e-5, atol=1e-6), (name, (a[name] - b[name]).abs().max())


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_a_diverging_run_ends_in_one_line_and_keeps_the_last_checkpoint(one_good_epoch, engine, tmp_path):
    shutil.copytree(one_good_epoch[0], tmp_path, dirs_exist_ok=True)
    good = epoch_path(tmp_path, 1).read_bytes()
    done = gpurig("train", *FAST, "--engine", engine, "--checkpoint-dir", tmp_path, "--resume", "--epochs", 2,
                  "--global-batch", 512, "--lr", 1000, timeout=300)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stdout, done.stderr
    assert lines[0].startswith("gpurig train: training diverged at step ") and "(epoch 2)" in lines[0]
    assert "holds NaN" in lines[0] or "holds Inf" in lines[0]
    assert "checkpoint-epoch1.pt is untouched" in lines[0] and "--lr (this run: 1000)" in lines[0]
    assert "--on-nonfinite skip" in lines[0]
    assert saved_epochs(tmp_path) == [1] and epoch_path(tmp_path, 1).read_bytes() == good


@pytest.mark.parametrize("parallel", ["model"])
def test_split_layers_are_guarded_too(parallel, tmp_path):
    """No DataParallel averages (and guards) the split layers' gradients: the step checks them, every rank together."""
    done = gpurig("train", *FAST, "--parallel", parallel, "--lr", 1000, "--epochs", 1, "--global-batch", 512,
                  "--checkpoint-dir", tmp_path, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("training diverged at step") == 1 and saved_epochs(tmp_path) == []
    # --on-nonfinite skip: tests/workers/train_step.py (every rank skips what one rank alone saw)


def test_a_diverging_rank_of_gpurig_run_says_it_once(tmp_path):
    done = gpurig("run", "-n", 2, "--", sys.executable, "-m", "gpurig", "train", *FAST, "--lr", 1000, "--epochs", 1,
                  "--checkpoint-dir", tmp_path, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.count("training diverged at step") == 1, done.stderr


@pytest.mark.parametrize("args,message", [
    (["--precision", "fp12"], "unknown precision 'fp12'"),
    (["--precision", "fp8"], "Transformer Engine"),
    (["--precision", "fp16", "--on-nonfinite", "ignore"], "loss scaler"),
    (["--accumulate", "0"], "--accumulate must be at least 1"),
    (["--accumulate", "65"], "use at most 64"),
])
def test_bad_step_options_are_one_line_and_exit_2(args, message, tmp_path):
    code, out, err = run_cli(["train", *args, "--checkpoint-dir", tmp_path / "none"])
    assert code == 2 and message in err and "Traceback" not in err + out, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="TF32 is a GPU mode")
def test_tf32_on_cpu_ranks_is_refused_not_ignored(tmp_path):
    code, _, err = run_cli(["train", "--precision", "tf32", "--checkpoint-dir", tmp_path / "none"])
    assert code == 2 and "these ranks compute on CPU cores" in err
