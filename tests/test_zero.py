"""ZeRO stages 1 and 2 on real ranks over MPI and Gloo (tests/workers/zero.py): sharded equals unsharded and the
1-rank reference to 1e-5 (Adam, SGD, groups, --accumulate with fp16), the whole-format state dict, 1/N of Adam's
state per rank, compression, the agreed skip."""

import pytest

from conftest import assert_all_ok, run_cases

CASES = 4 * 2 + 10 + 3 * 2   # + clip_grad_norm_ unsharded and both stages, 2- and inf-norm


@pytest.mark.parametrize("nprocs", [2, 3])
def test_zero_equals_unsharded(engine, nprocs, tmp_path):
    assert_all_ok(run_cases("zero.py", engine, nprocs, tmp_path), CASES)


def test_zero_on_one_rank(tmp_path):
    assert_all_ok(run_cases("zero.py", "mpi", 1, tmp_path), CASES)


def test_train_shard_checkpoint_resumes_on_another_rank_count(tmp_path):
    """gpurig train --shard: 2 ranks sharded write a whole checkpoint (the plain optimizer's format); 3 ranks resume
    from it sharded (stage 2) and reach the weights and momentum of plain torch resuming it in one process on the
    whole global batches (1e-5)."""
    import json

    import torch

    from conftest import gpurig, resume_in_one_process
    from gpurig.train.checkpoints import epoch_path, load

    common = ["--no-predict", "--json", "--global-batch", 480]  # 8 steps an epoch, 240 or 160 samples per rank
    done = gpurig("train", "-n", 2, "--shard", "optimizer", "--epochs", 1, *common, "--checkpoint-dir", tmp_path,
                  timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["shard"] == "optimizer" and summary["compression"] == "none"
    saved = load(epoch_path(tmp_path, 1))
    halves, whole = summary["optimizer_state_bytes_per_rank"], 4 * sum(t.numel() for t in saved["model"].values())
    assert all(b <= 1.1 * whole / 2 for b in halves) and sum(halves) >= whole, (halves, whole)
    for i, (name, weight) in enumerate(saved["model"].items()):  # the plain optimizer's format, whole
        assert saved["optimizer"]["state"][i]["momentum_buffer"].shape == weight.shape, name

    done = gpurig("train", "-n", 3, "--shard", "gradients", "--resume", "--epochs", 2, *common,
                  "--checkpoint-dir", tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = load(epoch_path(tmp_path, 2))
    assert resumed["ranks"] == 3

    model, opt = resume_in_one_process(saved, torch.optim.SGD, 480, epoch=1, lr=0.05, momentum=0.9)
    for name, weight in model.state_dict().items():
        assert torch.allclose(resumed["model"][name], weight, rtol=1e-5, atol=1e-6), name
    for i, state in opt.state_dict()["state"].items():
        assert torch.allclose(resumed["optimizer"]["state"][i]["momentum_buffer"], state["momentum_buffer"],
                              rtol=1e-5, atol=1e-6), i


@pytest.mark.parametrize("args,message", [
    (["--shard", "stage3"], "unknown --shard 'stage3'; choose one of: none, optimizer, gradients"),
    (["--shard", "gradients", "--compression", "powersgd"], "'powersgd' cannot be sharded"),
    (["--shard", "optimizer", "--compression", "auto"], "'auto' cannot be sharded"),
    (["--shard", "optimizer", "--parallel", "model"], "use --parallel data"),
])
def test_train_shard_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    from conftest import run_cli

    code, out, err = run_cli(["train", *args, "--checkpoint-dir", tmp_path / "none"])
    assert code == 2 and message in err and "Traceback" not in err + out, err
    assert len([line for line in err.splitlines() if line.startswith("gpurig")]) == 1


def test_predict_prices_sharding_and_suggests_it_when_a_model_does_not_fit():
    """gpurig predict --shard: optimizer state (and stage 2's gradients) / N, the update on 1/N, the same bytes on
    the wire with the allgather exposed after the step; advice offers --shard when the step does not fit."""
    from gpurig.predict import PredictRequest, predict

    def run(shard):
        return predict(PredictRequest(model="bert-large", cluster="4 x RTX 2080 Ti", batch=32, tokens=512,
                                      optimizer="adam", shard=shard))

    plain, stage1, stage2 = run("none"), run("optimizer"), run("gradients")
    parts = [r["memory"]["parts_gb"] for r in (plain, stage1, stage2)]
    assert parts[1]["optimizer"] == pytest.approx(parts[0]["optimizer"] / 4, rel=1e-3)
    assert parts[1]["gradients"] == parts[0]["gradients"] and parts[1]["buckets"] == parts[0]["buckets"]
    assert parts[2]["gradients"] == pytest.approx(parts[0]["gradients"] / 4, rel=1e-3)
    assert parts[2]["buckets"] < parts[0]["buckets"] / 4
    assert plain["memory"]["largest_batch"] < stage1["memory"]["largest_batch"] < stage2["memory"]["largest_batch"]
    steps = [r["step"] for r in (plain, stage1, stage2)]
    assert steps[1]["comm_total_ms"] == pytest.approx(steps[0]["comm_total_ms"])  # same bytes on a ring
    assert steps[1]["optimizer_ms"] < steps[0]["optimizer_ms"]
    assert steps[1]["comm_ms"] >= steps[1]["comm_total_ms"] / 2  # the allgather after the step: nothing hides it
    suggested = [a["what"] for a in plain["advice"]]
    assert not plain["memory"]["fits"] and any(w.startswith("--shard gradients") for w in suggested), suggested
    assert not any(a["what"].startswith("--shard") for a in stage2["advice"])


@pytest.mark.parametrize("args,message", [
    (["--shard", "stage3"], "--shard must be one of none, optimizer, gradients"),
    (["--shard", "optimizer", "--parallel", "model"], "use --parallel data"),
    (["--shard", "optimizer", "--compression", "powersgd"], "cannot be sharded"),
])
def test_predict_shard_bad_input_is_one_line_and_exit_2(args, message):
    from conftest import run_cli

    code, out, err = run_cli(["predict", "--model", "mnist-mlp", "--cluster", "2 x RTX 3090", *args])
    assert code == 2 and message in err and "Traceback" not in err + out, err


@pytest.mark.parametrize("engine,signal", [("mpi", "SIGSTOP")])  # (killed ranks, Gloo: tests/test_resilience.py)
def test_a_dead_or_stopped_rank_ends_a_sharded_job_naming_it(engine, signal, tmp_path):
    """A rank killed or stopped mid-step (inside a reduce-scatter or an allgather, wherever it lands) ends the
    sharded job on every rank within the failure timeout, naming the rank; the last checkpoint stays intact."""
    from conftest import gpurig
    from gpurig.train.checkpoints import damaged

    done = gpurig("train", "-n", 2, "--engine", engine, "--shard", "gradients", "--epochs", 2, "--global-batch", 480,
                  "--no-predict", "--failure-timeout", 3, "--checkpoint-dir", tmp_path,
                  env={"GPURIG_FAULT": f"rank=1 step=11 signal={signal} delay=0.01"}, timeout=120)
    assert done.returncode != 0 and "rank 1 on host" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert damaged(tmp_path) == {} and (tmp_path / "checkpoint-epoch1.pt").is_file()
