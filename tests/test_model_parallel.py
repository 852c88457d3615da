"""Model and hybrid parallelism on real ranks (both engines): split layers, gpurig.parallelize, gpurig train --parallel.

The comparisons run inside the ranks (tests/workers/model_parallel.py, which
states the tolerances); here the jobs are launched and the command line is checked.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest

from conftest import assert_all_ok, run_cases, run_cli
from conftest import gpurig as gpurig_cli
from gpurig.train.checkpoints import saved_epochs

CASES = 25


def test_split_layers_and_training_on_three_ranks(engine, tmp_path):
    assert_all_ok(run_cases("model_parallel.py", engine, 3, tmp_path), CASES)


def test_split_layers_and_training_on_two_ranks_over_mpi(tmp_path):
    assert_all_ok(run_cases("model_parallel.py", "mpi", 2, tmp_path), CASES)


# -- gpurig train --parallel ----------------------------------------------------------------------------------------

def train(*args, checkpoint_dir, timeout=300) -> dict:
    done = gpurig_cli("train", *args, "--no-predict", "--json", "--checkpoint-dir", checkpoint_dir, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def mlp_runs(default_run, tmp_path_factory):
    """The default MLP run for 2 epochs, uncompressed, in each --parallel mode. The data-parallel one is the first
    2 epochs of conftest's 5-epoch default run (no learning-rate schedule: epochs 1-2 do not depend on the later ones)."""
    runs = {mode: train("--parallel", mode, "--epochs", 2, "--compression", "none",
                        checkpoint_dir=tmp_path_factory.mktemp(mode)) for mode in ("model", "hybrid")}
    assert default_run["parallel"] == "data" and default_run["compression"] == "none"
    two = default_run["epochs"][:2]
    assert [e["epoch"] for e in two] == [1, 2]
    runs["data"] = {**default_run, "epochs": two, "test_accuracy": two[-1]["test_accuracy"], "checkpoint": None}
    return runs


def test_model_and_hybrid_reach_the_data_parallel_accuracy(mlp_runs):
    data = mlp_runs["data"]
    assert data["test_accuracy"] > 0.85
    for mode in ("model", "hybrid"):
        run = mlp_runs[mode]
        assert run["parallel"] == mode and abs(run["test_accuracy"] - data["test_accuracy"]) <= 0.01, run


def test_model_parallel_ranks_hold_half_the_mlp_and_send_activations(mlp_runs):
    run = mlp_runs["model"]
    whole, held = run["parameter_bytes_whole"], run["parameter_bytes_per_rank"]
    every_rank = (1200 * 10 + 10 + 1200) * 4          # the classifier and the row layer's bias stay whole
    assert held == [(whole - every_rank) // 2 + every_rank] * 2, (held, whole)
    assert run["optimizer_state_bytes_per_rank"] == held     # momentum: one buffer per parameter held
    assert mlp_runs["data"]["parameter_bytes_per_rank"] == [whole, whole]
    # One allreduce per step: the row layer's 128 x 1200 outputs (the column layer's input, the data, needs no gradient).
    assert run["bytes_sent_per_step"] == 2 * (2 - 1) // 2 * 128 * 1200 * 4
    assert run["bytes_sent_per_step"] < mlp_runs["data"]["bytes_sent_per_step"] / 15


def test_model_parallel_run_resumes_to_the_uninterrupted_weights(mlp_runs, tmp_path):
    """The model-parallel run's checkpoints, epoch 2's removed (as if killed in epoch 2): resumed, it ends bit for bit
    where the uninterrupted run did."""
    shutil.copytree(Path(mlp_runs["model"]["checkpoint"]).parent, tmp_path, dirs_exist_ok=True)
    for path in tmp_path.glob("*-epoch2.pt"):
        path.unlink()
    assert saved_epochs(tmp_path) == [1]
    resumed = train("--parallel", "model", "--epochs", 2, "--compression", "none", "--resume", checkpoint_dir=tmp_path)
    assert [e["epoch"] for e in resumed["epochs"]] == [1, 2]
    assert resumed["weights_digest"] == mlp_runs["model"]["weights_digest"]


def test_krizhevsky_hybrid_cnn_over_gloo_reaches_the_data_parallel_accuracy(torch_cnn_one_epoch, tmp_path):
    runs = {"data": torch_cnn_one_epoch,  # conftest's: the same flags with --parallel data, shared with test_train
            "hybrid": train("--engine", "torch", "--model", "cnn", "--parallel", "hybrid", "--epochs", 1,
                            "--compression", "none", checkpoint_dir=tmp_path / "hybrid")}
    assert runs["data"]["parallel"] == "data" and runs["data"]["engine"] == "torch/gloo"
    assert runs["hybrid"]["engine"] == "torch/gloo" and runs["data"]["test_accuracy"] > 0.85
    assert abs(runs["hybrid"]["test_accuracy"] - runs["data"]["test_accuracy"]) <= 0.01, runs
    assert runs["hybrid"]["parameter_bytes_per_rank"][0] < 0.7 * runs["hybrid"]["parameter_bytes_whole"]


@pytest.mark.parametrize("args,message", [
    (["--parallel", "pipeline"], "unknown parallelism 'pipeline'"),
    (["-n", "3", "--model", "cnn", "--parallel", "model"],
     "--parallel model: plan: '8' (column) has 256 output features, which do not split evenly over 3 ranks"),
    (["--parallel", "model", "--compression", "int8"], "with --parallel model none are"),
])
def test_bad_parallel_flags_are_one_line_and_exit_2(args, message, tmp_path):
    code, out, err = run_cli(["train", *args, "--checkpoint-dir", tmp_path])
    assert code == 2 and message in err and "Traceback" not in err + out, err
    assert len([line for line in err.splitlines() if line.startswith("gpurig")]) == 1


def test_hybrid_batch_parts_cut_otherwise_than_tensor_split_end_the_job_with_the_reason():
    script = ("import torch, gpurig; c = gpurig.init()\n"
              "net = gpurig.parallelize(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), "
              "torch.nn.Linear(4, 2)), {'0': 'column', '2': 'row'}, hybrid=True)\n"
              "net(torch.zeros(5 if c.rank == 0 else 3, 4))")
    done = gpurig_cli("run", "-n", 2, "--", sys.executable, "-c", script, timeout=90)
    assert done.returncode != 0
    assert "holds 5 rows of a batch of 8: the parts must be cut as torch.tensor_split cuts them (4 here)" in done.stderr
