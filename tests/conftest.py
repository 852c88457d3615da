"""Shared helpers: launch real multi-process jobs through ``gpurig run`` and read their results."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

WORKERS = Path(__file__).parent / "workers"
ENGINES = ["mpi", "torch"]


def gpurig(*args, timeout=180, env=None, cwd=None, stdin=None) -> subprocess.CompletedProcess:
    """Run the ``gpurig`` command line (as ``python -m gpurig``) and capture its output."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "gpurig", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd, stdin=stdin)


def run_cases(worker: str, engine: str, nprocs: int, tmp_path: Path, timeout=240) -> list[dict]:
    """Launch ``tests/workers/<worker>`` on ``nprocs`` ranks; return each rank's {case: outcome}."""
    env = {"CASE_DIR": str(tmp_path), "PYTHONPATH": os.pathsep.join([str(WORKERS), os.environ.get("PYTHONPATH", "")])}
    done = gpurig("run", "-n", nprocs, "--engine", engine, "--", sys.executable, WORKERS / worker,
                  timeout=timeout, env=env)
    assert done.returncode == 0, f"job failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(nprocs)]


def assert_all_ok(per_rank: list[dict], expected_cases: int) -> None:
    """Every case passed on every rank, and as many cases ran as the worker defines."""
    failures = [f"rank {r} {name}:\n{outcome}" for r, cases in enumerate(per_rank)
                for name, outcome in cases.items() if outcome != "ok"]
    assert not failures, "\n".join(failures[:10])
    assert all(len(cases) == expected_cases for cases in per_rank), [len(c) for c in per_rank]


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


def leftovers(marker: str, wait: float = 10.0) -> list:
    """Processes whose command line holds ``marker`` still alive after up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        alive = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


@pytest.fixture
def marker():
    tag = f"gpurig-test-{uuid.uuid4().hex[:12]}"
    yield tag
    for p in leftovers(tag, wait=0):
        p.kill()


def run_cli(argv: list) -> tuple[int, str, str]:
    """``gpurig ARGV`` in this process (no interpreter start): (exit code, stdout, stderr)."""
    from gpurig.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


# -- training runs that several modules compare with (each is a whole job: start-up costs more than its epochs) ------

def resume_in_one_process(saved: dict, optimizer_class, global_batch: int, epoch: int, **settings):
    """What ``gpurig train --resume`` of the MLP should reach: plain torch, one process, the checkpoint ``saved``
    loaded into ``optimizer_class(**settings)``, one epoch of the whole global batches in the order every rank
    drew. Returns (model, optimizer)."""
    import torch
    import torch.nn.functional as F
    from types import SimpleNamespace

    from gpurig.parallel import shard
    from gpurig.train import data as datasets
    from gpurig.train.sources import build_model

    model = build_model("mlp")
    model.load_state_dict(saved["model"])
    optimizer = optimizer_class(model.parameters(), **settings)
    optimizer.load_state_dict(saved["optimizer"])
    mnist = datasets.load("mnist")
    batches = shard((mnist.x_train, mnist.y_train), global_batch=global_batch, comm=SimpleNamespace(rank=0, size=1),
                    seed=0, split=False)
    batches.set_epoch(epoch)
    for x, y in batches:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model, optimizer


def train_json(*args, checkpoint_dir, timeout=300) -> dict:
    """``gpurig train ARGS --json`` in a fresh process; its summary."""
    done = gpurig("train", *args, "--json", "--checkpoint-dir", checkpoint_dir, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="session")
def default_run(tmp_path_factory):
    """The default run (the MLP, 5 epochs of global batch 128 on 2 MPI ranks) without compression (auto's choice
    depends on timing), uninterrupted. test_train's reference, and (its first 2 epochs: no learning-rate schedule
    makes them depend on the epochs after them) test_model_parallel's data-parallel MLP."""
    return train_json("--compression", "none", "--no-predict", checkpoint_dir=tmp_path_factory.mktemp("uninterrupted"))


@pytest.fixture(scope="session")
def mlp_two_epochs_of_512(tmp_path_factory):
    """The MLP for 2 epochs of 7 steps of 512 on 2 MPI ranks, uncompressed, uninterrupted, recorded with --timeline
    (its summary's ``timeline``); its checkpoints are kept (copy them before changing any). test_resilience's
    reference run, (its epoch 1, as no learning-rate schedule makes epoch 1 depend on the epochs after it)
    test_train_precision's plain epoch and fp32 reference for mixed precision, and test_timeline's MPI run
    (recording changes no number: the weights are those of a run without it)."""
    directory = tmp_path_factory.mktemp("mlp-2x512")
    return train_json("--epochs", 2, "--global-batch", 512, "--compression", "none", "--no-predict",
                      "--timeline", directory / "trace.json", checkpoint_dir=directory / "ck")


@pytest.fixture(scope="session")
def torch_cnn_one_epoch(tmp_path_factory):
    """One epoch of the CNN over Gloo (--engine torch), data parallel, uncompressed, with its prediction:
    test_train's torch-engine run and test_model_parallel's reference for the hybrid CNN."""
    return train_json("--engine", "torch", "--model", "cnn", "--parallel", "data", "--epochs", 1, "--compression",
                      "none", checkpoint_dir=tmp_path_factory.mktemp("cnn-gloo"))


INT8_THREE_EPOCHS = ("--epochs", 3, "--global-batch", 512, "--keep-checkpoints", 2, "--compression", "int8")


@pytest.fixture(scope="session")
def int8_three_epochs_of_512(tmp_path_factory):
    """The MLP for 3 epochs of 7 steps of 512 on 2 MPI ranks with int8, the 2 newest checkpoints kept (copy them
    before changing any), TensorBoard event files in ``<checkpoint dir>/../tb``. test_train's int8 run (its epoch 2
    against mlp_two_epochs_of_512: no learning-rate schedule makes epochs 1-2 depend on epoch 3) and
    test_train_metrics' run."""
    directory = tmp_path_factory.mktemp("int8-3x512")
    return train_json(*INT8_THREE_EPOCHS, "--no-predict", "--logdir", directory / "tb", checkpoint_dir=directory / "ck")


@pytest.fixture(scope="session")
def int8_resumed(int8_three_epochs_of_512, tmp_path_factory):
    """int8_three_epochs_of_512 resumed from epoch 2's checkpoint in a copy of its directory left as a run killed
    during epoch 3 leaves it: epoch 3's files removed, one more line in metrics.jsonl (a step logged before the kill).
    Returns (the resumed run's summary, the directory, the names of the checkpoint files copied). test_train checks
    the weights (the error-feedback residuals came back), test_train_metrics the lines."""
    directory = tmp_path_factory.mktemp("int8-resumed")
    shutil.copytree(Path(int8_three_epochs_of_512["checkpoint"]).parent, directory, dirs_exist_ok=True)
    kept = sorted(p.name for p in directory.glob("*.pt"))
    for path in directory.glob("*-epoch3.pt"):
        path.unlink()
    with open(directory / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "step", "epoch": 3, "step": 999}) + "\n")
    summary = train_json(*INT8_THREE_EPOCHS, "--resume", "--no-predict", checkpoint_dir=directory)
    return summary, directory, kept
