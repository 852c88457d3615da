"""gpurig train on a user's own model and data (``--model module:factory --data module:loader``), end to end on
scikit-learn's digits (examples/own_model/digits.py, no gpurig code in it), and what a bad one prints."""

import json
from pathlib import Path

import pytest
import torch

from conftest import gpurig, run_cli
from gpurig.errors import UsageError
from gpurig.train import data
from gpurig.train.checkpoints import saved_epochs

EXAMPLE = Path(__file__).parent.parent / "examples" / "own_model"
OWN = ("--model", "digits:build", "--data", "digits:load")


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    ck = tmp_path_factory.mktemp("digits")
    done = gpurig("train", *OWN, "--epochs", 3, "--json", "--checkpoint-dir", ck, cwd=EXAMPLE, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), ck


def test_own_model_and_data_train_like_the_reference_ones(digits_run):
    summary, ck = digits_run
    assert summary["model"] == "digits:build" and summary["data"] == "digits:load" and summary["ranks"] == 2
    assert summary["test_accuracy"] >= 0.8, summary["epochs"]    # 89 % after 5 epochs (docs/training.md)
    assert saved_epochs(ck) == [3, 2, 1]                          # the same checkpoints
    assert summary["predicted"]["step_ms"] > 0, summary["predicted"]  # and the predicted split beside the measured
    assert (Path(ck) / "metrics.jsonl").is_file()


def test_own_model_resumes(digits_run, tmp_path):
    _, ck = digits_run
    done = gpurig("train", *OWN, "--epochs", 4, "--resume", "--no-predict", "--json", "--checkpoint-dir", ck,
                  cwd=EXAMPLE, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [e["epoch"] for e in json.loads(done.stdout)["epochs"]] == [1, 2, 3, 4]


@pytest.mark.parametrize("args,message", [
    (["--model", "digits:biuld"], "has no attribute 'biuld' (closest: build)"),
    (["--model", "no_such_module:build"], "cannot import 'no_such_module'"),
    (["--model", "torch.nn:Linear"], "the factory raised TypeError"),
    (["--model", "digits:load"], "not a torch.nn.Module"),
    (["--model", "mlp"], "does not fit --model mlp: RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
    (["--model", "torch.nn:Flatten"], "gives 64 outputs per sample for the 10 classes"),
    (["--data", "digits:build"], "the loader returned a Sequential, not (train, test)"),
])
def test_a_bad_model_or_data_is_one_line_and_leaves_the_checkpoints(digits_run, args, message, monkeypatch):
    """In this process (refused before any rank starts), from the example's folder as digits_run was."""
    _, ck = digits_run
    before = {p.name: p.read_bytes() for p in Path(ck).iterdir() if p.is_file()}
    words = dict(zip(OWN[::2], OWN[1::2]))
    words.update(zip(args[::2], args[1::2]))
    monkeypatch.chdir(EXAMPLE)
    code, out, err = run_cli(["train", *[w for pair in words.items() for w in pair], "--checkpoint-dir", ck])
    assert code == 2 and message in err and "Traceback" not in err + out, err
    assert len(err.strip().splitlines()) == 1, err
    assert {p.name: p.read_bytes() for p in Path(ck).iterdir() if p.is_file()} == before


def test_a_loader_may_return_torch_datasets(tmp_path):
    (tmp_path / "sets.py").write_text(
        "import torch\n"
        "from torch.utils.data import TensorDataset\n"
        "def load():\n"
        "    x, y = torch.arange(40, dtype=torch.float64).view(20, 2), torch.arange(20) % 3\n"
        "    return TensorDataset(x[:15], y[:15]), TensorDataset(x[15:], y[15:])\n"
        "def bad_labels():\n"
        "    return (torch.zeros(4, 2), torch.full((4,), 0.5)), (torch.zeros(2, 2), torch.zeros(2))\n")
    loaded = data.load(f"{tmp_path / 'sets.py'}:load")
    assert loaded.x_train.shape == (15, 2) and loaded.x_train.dtype == torch.float32 and loaded.classes == 3
    assert torch.equal(loaded.y_test, torch.arange(15, 20) % 3)
    with pytest.raises(UsageError, match="labels must be class numbers"):
        data.load(f"{tmp_path / 'sets.py'}:bad_labels")
