"""gpurig train on a user's own model and data (``--model module:factory --data module:loader``), end to end on
scikit-learn's digits (examples/own_model/digits.py, no gpurig code in it), and what a bad one prints."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import gpurig, run_cli
from gpurig.errors import UsageError
from gpurig.train import TrainConfig, data
from gpurig.train.checkpoints import epoch_path, load, saved_epochs
from gpurig.train.config import check_fits
from gpurig.train.sources import build_model

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
    (["--model", "torch.nn:Flatten"], "has no weights to train (no parameter that requires grad)"),
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


# Models and data of a user's own for the checks below: written to a file, named as file.py:factory.
USERS = """
import torch
from torch import nn


class Attention(nn.Module):
    \"\"\"A transformer's block: attention, a residual add and a normalisation between its nn.Linear layers.\"\"\"

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(64, 16)
        self.attention = nn.MultiheadAttention(16, 2, batch_first=True)
        self.norm = nn.LayerNorm(16)
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        h = self.embed(x).unsqueeze(1)
        h = self.norm(h + self.attention(h, h, h)[0])
        return self.head((h + self.down(torch.relu(self.up(h)))).squeeze(1))


class OneByOne(nn.Module):
    \"\"\"An nn.Sequential whose layers the forward calls itself, with a normalisation between them.\"\"\"

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 10))

    def forward(self, x):
        return self.body[1](torch.layer_norm(self.body[0](x), (32,)))


def attention():
    return Attention()


def one_by_one():
    return OneByOne()


def frozen():
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    model[0].requires_grad_(False)
    return model


def eight_outputs():
    return nn.Linear(64, 8)


def no_nines():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(320, 64, generator=g), torch.randint(0, 9, (320,), generator=g)
    return (x[:256], y[:256]), (x[256:], y[256:])
"""


@pytest.fixture(scope="module")
def users(tmp_path_factory):
    path = tmp_path_factory.mktemp("users") / "users.py"
    path.write_text(USERS)
    return path


@pytest.mark.parametrize("parallel", ["model", "hybrid"])
@pytest.mark.parametrize("model,message", [
    ("attention", "--model {users}:attention has no pair of nn.Linear layers gpurig can split (one followed by "
                  "another in an nn.Sequential, only activations or dropout between them): 'embed' is used by "
                  "Attention's own forward, not run by an nn.Sequential; use --parallel data"),
    ("one_by_one", "plan: 'body.0' is called by OneByOne's forward, not run by its nn.Sequential 'body'"),
])
def test_layers_krizhevskys_plan_cannot_split_correctly_are_refused_in_one_line(users, parallel, model, message):
    """Splitting them would pair an attention's out_proj (never called as a module) or layers with a normalisation
    or a residual add between them: wrong sizes on every rank, or wrong numbers. Refused before any rank starts."""
    code, out, err = run_cli(["train", "-n", 2, "--parallel", parallel, "--model", f"{users}:{model}",
                              "--data", f"{users}:no_nines", "--global-batch", 32])
    assert code == 2 and message.format(users=users) in err and "Traceback" not in err + out, err
    assert len(err.strip().splitlines()) == 1, err


def test_more_outputs_than_classes_train_fewer_are_refused(users):
    """Labels 0-8 (a subset without the top class): 10 outputs are a valid cross-entropy model, 8 are not."""
    dataset = data.load(f"{users}:no_nines")
    check_fits(TrainConfig(model=f"{users}:frozen", data=f"{users}:no_nines"), dataset)
    with pytest.raises(UsageError, match="gives 8 outputs per sample, and the labels of .* go up to 8: its last "
                                         "layer should have at least 9"):
        check_fits(TrainConfig(model=f"{users}:eight_outputs", data=f"{users}:no_nines"), dataset)


@pytest.mark.parametrize("shard", ["optimizer", "gradients"])
def test_frozen_weights_stay_as_they_are_when_the_optimizer_is_sharded(users, shard, tmp_path):
    """The optimizer takes the weights that require grad only (ZeRO refused the frozen ones it does not shard)."""
    done = subprocess.run([sys.executable, "-m", "gpurig", "train", "-n", "2", "--epochs", "1", "--global-batch", "32",
                           "--model", f"{users}:frozen", "--data", f"{users}:no_nines", "--shard", shard,
                           "--no-predict", "--json", "--checkpoint-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    trained = load(epoch_path(tmp_path, 1))["model"]
    torch.manual_seed(0)  # the run's --seed: every rank builds these initial weights
    initial = build_model(f"{users}:frozen").state_dict()
    assert torch.equal(trained["0.weight"], initial["0.weight"]) and torch.equal(trained["0.bias"], initial["0.bias"])
    assert not torch.equal(trained["2.weight"], initial["2.weight"])


TWO_HEADS = '''
import torch
from torch import nn


class TwoHeads(nn.Module):
    """A body and two heads; only the first is ever used (a multi-task model trained on one task)."""

    def __init__(self):
        super().__init__()
        self.body, self.used, self.spare = nn.Linear(64, 32), nn.Linear(32, 10), nn.Linear(32, 10)

    def forward(self, x):
        return self.used(torch.relu(self.body(x)))


def build():
    torch.manual_seed(7)
    return TwoHeads()
'''


def test_find_unused_parameters_leaves_a_head_no_rank_used_untouched(tmp_path):
    """With AdamW's weight decay, a zero gradient still moves a weight, and no gradient leaves it: with
    --find-unused-parameters the spare head comes out of training exactly as it went in, as in one process."""
    (tmp_path / "twoheads.py").write_text(TWO_HEADS)
    ck = tmp_path / "ck"
    done = gpurig("train", "--model", "twoheads:build", "--data", "digits:load", "--optimizer", "adamw", "--epochs", 1,
                  "--find-unused-parameters", "--no-predict", "--compression", "none", "--checkpoint-dir", ck,
                  cwd=EXAMPLE, env={"PYTHONPATH": str(tmp_path)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    sys.path.insert(0, str(tmp_path))
    try:
        import twoheads
        fresh = twoheads.build().state_dict()
    finally:
        sys.path.remove(str(tmp_path))
    trained = load(epoch_path(ck, 1))["model"]
    assert torch.equal(trained["spare.weight"], fresh["spare.weight"]), "the unused head moved"
    assert not torch.equal(trained["used.weight"], fresh["used.weight"])
    code, _, err = run_cli(["train", "--find-unused-parameters", "--shard", "optimizer", "--checkpoint-dir", ck])
    assert code == 2 and "--find-unused-parameters is data parallelism's, unsharded: not with --shard optimizer" in err
