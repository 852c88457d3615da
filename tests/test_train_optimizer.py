"""``gpurig train --optimizer``: torch.optim's Adam(W) on real ranks equals plain torch on the whole global batch,
its state resumes, and what it cannot take is one line."""

import json

import pytest
import torch

from conftest import gpurig, resume_in_one_process, run_cli
from gpurig.train.checkpoints import epoch_path, load


def test_adamw_on_two_ranks_resumes_to_plain_torch_on_the_whole_batch(tmp_path):
    """2 ranks train an epoch with AdamW and write its moments; 2 ranks resume for a second epoch with no --lr or
    --weight-decay (the checkpoint's carry over, not AdamW's defaults) and reach the weights and moments of
    torch.optim.AdamW resuming the same checkpoint in one process on the whole global batches (1e-5). A third
    epoch resumed compressing starts its error-feedback residuals from zero, and says so; its --lr replaces the
    checkpoint's."""
    common = ["-n", 2, "--optimizer", "adamw", "--no-predict", "--json", "--global-batch", 480,
              "--checkpoint-dir", tmp_path]
    done = gpurig("train", "--epochs", 1, "--lr", "0.002", "--weight-decay", "0.05", "--compression", "none", *common,
                  timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["optimizer"] == "adamw"
    saved = load(epoch_path(tmp_path, 1))
    assert saved["optimizer_name"] == "adamw"
    assert saved["optimizer"]["param_groups"][0]["weight_decay"] == 0.05
    done = gpurig("train", "--epochs", 2, "--resume", "--compression", "none", *common, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = load(epoch_path(tmp_path, 2))

    model, opt = resume_in_one_process(saved, torch.optim.AdamW, 480, epoch=1, lr=0.002, weight_decay=0.05)
    for name, weight in model.state_dict().items():
        assert torch.allclose(resumed["model"][name], weight, rtol=1e-5, atol=1e-6), name
    for i, state in opt.state_dict()["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(resumed["optimizer"]["state"][i][key], state[key], rtol=1e-5, atol=1e-7), (i, key)

    done = gpurig("train", "--epochs", 3, "--resume", "--lr", "0.003", "--compression", "int8", *common, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "did not compress gradients: compression's error-feedback residuals start from zero" in " ".join(
        done.stderr.split())
    third = load(epoch_path(tmp_path, 3))
    assert third["feedback"] and third["optimizer"]["param_groups"][0]["lr"] == 0.003
    assert third["optimizer"]["param_groups"][0]["weight_decay"] == 0.05

    # residuals the resumed run cannot take (another codec on rank 0, a damaged file on rank 1): every rank starts
    # error feedback afresh, and each says why
    feedback = epoch_path(tmp_path, 3, "feedback-rank1")
    feedback.write_bytes(feedback.read_bytes()[:100])
    done = gpurig("train", "--epochs", 4, "--resume", "--compression", "fp16", *common, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = " ".join(done.stderr.split())
    assert ("rank 0: the residuals were saved by compression 'int8', this model sends 'fp16': compression's "
            "error-feedback residuals start from zero on every rank") in said, said
    assert f"rank 1: {feedback} has no gpurig checksum line" in said and "Traceback" not in said, said

    code, out, err = run_cli(["train", "-n", "2", "--resume", "--epochs", "5", "--checkpoint-dir", tmp_path])
    assert code == 2 and out.strip() == "" and err.strip() == (
        f"gpurig: error: --resume: {epoch_path(tmp_path, 4)} holds the state of --optimizer adamw, not momentum: "
        "resume with --optimizer adamw, or use another --checkpoint-dir")


@pytest.mark.parametrize("args,message", [
    (["--optimizer", "lamb"], "--optimizer lamb: torch.optim has no LAMB (gpurig predict prices it); train with "
                              "sgd, momentum, adam or adamw"),
    (["--optimizer", "adagrad"], "--optimizer must be one of sgd, momentum, adam, adamw, got 'adagrad'"),
    (["--optimizer", "adam", "--momentum", "0.9"], "--momentum is SGD's: use --optimizer momentum, or leave it out "
                                                   "with --optimizer adam"),
    (["--weight-decay", "-1"], "--weight-decay must be a number ≥ 0, got -1.0"),
])
def test_an_optimizer_train_cannot_run_is_one_line_and_exit_2(args, message, tmp_path):
    code, out, err = run_cli(["train", *args, "--checkpoint-dir", tmp_path / "none"])
    assert code == 2 and out.strip() == "" and err.strip() == f"gpurig: error: {message}"
