"""MFU: the FLOPs gpurig counts for a training step are the FLOPs PyTorch runs (``torch.utils.flop_counter``), and
train and predict report achieved TFLOP/s and MFU from them."""

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import gpurig
from conftest import run_cli
from gpurig import models
from gpurig.train.utilization import PEAK_UNKNOWN, achieved, flops_per_step


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_step_flops_are_what_flop_counter_mode_counts(name):
    """One real forward and backward of the reference model, counted by PyTorch, against the description's count."""
    torch.manual_seed(0)
    model = models.build(name)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    counted = counter.get_total_flops()
    assert flops_per_step(model, x, 64) == pytest.approx(counted, rel=0.03)


def test_three_times_forward_would_overstate_the_mlp():
    """nanoGPT's and Megatron's 3x forward assumes every layer's input needs a gradient; the MLP's first layer
    (39 % of its FLOPs) takes the data, which needs none: a step is 2.6x its forward."""
    model, x = models.build("mlp"), torch.randn(64, 784)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    assert flops_per_step(model, x, 64) / counter.get_total_flops() == pytest.approx(2.61, abs=0.01)


def test_achieved_and_mfu_from_a_step():
    assert achieved(4e12, 2.0, 1e12, 4) == {"tflops": 2.0, "mfu": 0.5}
    assert achieved(4e12, 2.0, None, 4) == {"tflops": 2.0, "mfu": None}


def test_train_reports_tflops_per_epoch(tmp_path, monkeypatch):
    """One rank, one epoch: TFLOP/s is the step's FLOPs over the step's time; without a profile the peak is unknown."""
    monkeypatch.chdir(tmp_path)  # no runs/bench/profile.json here; the ranks still import this gpurig
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(gpurig.__file__).resolve().parents[1]),
                                                      *filter(None, [os.environ.get("PYTHONPATH")])]))
    code, out, err = run_cli(["train", "-n", "1", "--epochs", "1", "--global-batch", "512", "--no-predict",
                              "--compression", "none", "--json", "--checkpoint-dir", str(tmp_path)])
    assert code == 0, err
    summary = json.loads(out)
    epoch = summary["epochs"][0]
    assert epoch["tflops"] == pytest.approx(summary["flops_per_step"] / (epoch["step_ms"] / 1000) / 1e12, rel=1e-3)
    assert summary["peak"] == PEAK_UNKNOWN and summary["peak_flops_per_s"] is None and epoch["mfu"] is None


def test_train_table_shows_tflops_and_mfu_whole_in_a_log(tmp_path, monkeypatch):
    """Into a pipe or a log (no terminal, rich's 80 columns) the table's TFLOP/s and MFU were cut to "0.0…" and "—":
    every column is whole, and an unknown MFU says why."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(gpurig.__file__).resolve().parents[1]),
                                                      *filter(None, [os.environ.get("PYTHONPATH")])]))
    code, out, err = run_cli(["train", "-n", "1", "--epochs", "1", "--global-batch", "512", "--no-predict",
                              "--compression", "none", "--checkpoint-dir", str(tmp_path)])
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("┃") and "samples/s" in line)
    assert "TFLOP/s" in header and "MFU" in header and "…" not in out
    row = next(line for line in out.splitlines() if line.startswith("│") and "%" in line)
    assert float(row.split("│")[-3]) > 0  # the TFLOP/s cell, whole
    assert f"MFU: — ({PEAK_UNKNOWN}, or train without --no-predict)" in " ".join(out.split())
    assert "measuring this job" not in out + err  # --no-predict: no calibration to announce


def test_predict_reports_the_mfu_it_expects():
    code, out, err = run_cli(["predict", "--model", "gpt2", "--cluster", "8 H100", "--json"])
    assert code == 0, err
    result = json.loads(out)
    used = result["utilization"]
    assert used["peak_tflops"] == 67.0  # fp32: the H100's FP32 rate, matrix multiplies only
    assert used["mfu"] == pytest.approx(used["tflops_per_gpu"] / used["peak_tflops"])
    assert used["tflops_per_gpu"] == pytest.approx(
        used["flops_per_step_per_gpu"] / result["step"]["step_ms"] * 1000 / 1e12)
