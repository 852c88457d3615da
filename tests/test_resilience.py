"""No lost work, end to end: a short chaos run on emulated nodes, and a resume on another rank count.

``benchmarks/chaos.py --runs 20`` is the long version (docs/reliability.md);
here 2 runs, one per engine, with a 3 s failure timeout. Both compare with one
uninterrupted run of the same training (2 ranks: every engine sums the same two
numbers, so one run serves them all). The bound on the time a faulted run takes to
end is generous here (60 s past the failure timeout, the benchmark's 20 s): what
the suite proves is that it ends, named, rather than hangs, also when other jobs
load this machine's 2 cores.
"""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from conftest import gpurig
from gpurig.train.checkpoints import epoch_path, load
from gpurig.launch.emulator import unavailable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import chaos  # noqa: E402

PLAN = chaos.Plan(nodes=2, rate="10gbit", epochs=2, global_batch=512, failure_timeout=3, grace=60)
TRAIN = ["train", "--epochs", PLAN.epochs, "--global-batch", PLAN.global_batch, "--compression", "none", "--no-predict",
         "--json"]


@pytest.fixture(scope="module")
def uninterrupted(mlp_two_epochs_of_512):
    """TRAIN on 2 ranks (conftest's run, shared with test_train_precision)."""
    assert PLAN.epochs == 2 and PLAN.global_batch == 512 and mlp_two_epochs_of_512["ranks"] == 2
    return mlp_two_epochs_of_512


@pytest.mark.skipif(unavailable() is not None, reason=f"network namespaces unavailable: {unavailable()}")
def test_chaos_runs_end_in_time_named_and_resume_to_the_same_weights(uninterrupted):
    digest = uninterrupted["weights_digest"]
    outcomes, _ = chaos.run_chaos(2, seed=5, plan=PLAN, engines=["mpi", "torch"],
                                  references={"mpi": digest, "torch": digest})
    print(chaos.table(outcomes, PLAN, 5))
    failed = [o for o in outcomes if not o.ok]
    assert not failed, failed
    assert {o.fault.split("signal=")[1].split()[0] for o in outcomes} == {"SIGKILL", "SIGSTOP"}  # seed 5: one each


@pytest.mark.parametrize("engine,signal", [("torch", "SIGKILL"), ("mpi", "SIGSTOP")])
def test_a_job_that_restarts_ends_as_an_uninterrupted_one(uninterrupted, engine, signal, tmp_path):
    """--max-restarts: a rank killed or stopped in epoch 2; the job starts again by itself from epoch 1's
    checkpoint and ends with the uninterrupted run's weights, bit for bit (2 ranks sum the same two numbers)."""
    steps_per_epoch = 4000 // PLAN.global_batch
    fault = f"rank=1 step={steps_per_epoch + 3} signal={signal}"
    done = gpurig(*TRAIN, "-n", 2, "--engine", engine, "--max-restarts", 2, "--checkpoint-dir", tmp_path,
                  "--failure-timeout", PLAN.failure_timeout, env={"GPURIG_FAULT": fault}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["restarts"] == 1 and [e["epoch"] for e in summary["epochs"]] == [1, 2]
    assert summary["weights_digest"] == uninterrupted["weights_digest"]
    assert "restart 1 of 2" in done.stderr and "rank 1 on host" in done.stderr


def test_checkpoint_every_resumes_mid_epoch_at_the_exact_step(uninterrupted, tmp_path):
    """--checkpoint-every 3: rank 1 killed in step 12 (epoch 2's 5th of 7); the restart resumes from the checkpoint
    after step 9 (epoch 2, step 2), says the 2 steps since are lost, and ends bit for bit as the uninterrupted run."""
    done = gpurig(*TRAIN, "-n", 2, "--max-restarts", 1, "--checkpoint-every", 3, "--checkpoint-dir", tmp_path,
                  "--failure-timeout", PLAN.failure_timeout, env={"GPURIG_FAULT": "rank=1 step=12 signal=SIGKILL"},
                  timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["restarts"] == 1 and summary["weights_digest"] == uninterrupted["weights_digest"]
    assert [e["loss"] for e in summary["epochs"]] == pytest.approx([e["loss"] for e in uninterrupted["epochs"]],
                                                                   abs=2e-5)
    assert ("resuming from step 2 of epoch 2 (checkpoint-epoch2-step2.pt); lost: the 2 steps since, run again"
            in done.stderr)
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "step"]
    assert steps == list(range(1, 15))  # the lost steps' lines are replaced, not repeated


@pytest.mark.skipif(unavailable() is not None, reason=f"network namespaces unavailable: {unavailable()}")
def test_a_restart_goes_on_without_a_lost_host(uninterrupted, tmp_path):
    """2 emulated nodes, one rank each: in step 12 node 2 is lost (its rank killed, and mpirun can no longer start
    anything there). --max-restarts finds it gone and restarts on node 1 alone, one rank resuming from the
    checkpoint after step 9, and ends where the uninterrupted 2-rank run did, up to summation order."""
    done = gpurig("emulate", "--nodes", 2, "--rate", "10gbit", "--max-restarts", 1, "--", "python", "-m", "gpurig",
                  *TRAIN, "--checkpoint-every", 3, "--checkpoint-dir", tmp_path, "--failure-timeout", PLAN.failure_timeout,
                  env={"GPURIG_FAULT": "rank=1 step=12 host=lost"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["ranks"] == 1 and [e["epoch"] for e in summary["epochs"]] == [1, 2]
    assert re.search(r"host \S+ is gone \(ssh: .*\): the job goes on without it", done.stderr)
    assert "restart 1 of 1: starting the 1 rank again" in done.stderr
    mine, theirs = load(summary["checkpoint"])["model"], load(uninterrupted["checkpoint"])["model"]
    for name, tensor in theirs.items():
        assert torch.allclose(mine[name], tensor, rtol=1e-4, atol=1e-6), name


@pytest.mark.skipif(unavailable() is not None, reason=f"network namespaces unavailable: {unavailable()}")
def test_emulated_torch_nodes_restart_and_end_as_an_uninterrupted_run(uninterrupted, tmp_path):
    """gpurig emulate --engine torch --max-restarts: rank 1 (node 2) killed in step 12; the ranks are started again
    on both nodes (a fresh rendezvous port), resume from the checkpoint after step 9 and end bit for bit as the
    uninterrupted run; the summary counts the restart."""
    done = gpurig("emulate", "--nodes", 2, "--rate", "10gbit", "--engine", "torch", "--max-restarts", 1, "--",
                  "python", "-m", "gpurig", *TRAIN, "--checkpoint-every", 3, "--checkpoint-dir", tmp_path,
                  "--failure-timeout", PLAN.failure_timeout, env={"GPURIG_FAULT": "rank=1 step=12 signal=SIGKILL"},
                  timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["restarts"] == 1 and summary["weights_digest"] == uninterrupted["weights_digest"]
    assert "rank 1 on host node2 was killed by SIGKILL" in done.stderr
    assert "restart 1 of 1: starting the 2 ranks again" in done.stderr


def test_resume_on_another_rank_count(uninterrupted, tmp_path):
    """Data parallelism replicates model and optimizer: 2 ranks' checkpoint after epoch 1 (the uninterrupted run's,
    epoch 2's removed), then 1 rank on to epoch 2 (the same global batch), ends where the uninterrupted 2-rank run
    did, up to floating-point summation order."""
    shutil.copytree(Path(uninterrupted["checkpoint"]).parent, tmp_path, dirs_exist_ok=True)
    for path in tmp_path.glob("*-epoch2*.pt"):
        path.unlink()
    assert load(epoch_path(tmp_path, 1))["ranks"] == 2
    resumed = gpurig(*TRAIN, "-n", 1, "--resume", "--checkpoint-dir", tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout)
    assert summary["ranks"] == 1 and [e["epoch"] for e in summary["epochs"]] == [1, 2]
    mine, theirs = load(summary["checkpoint"])["model"], load(uninterrupted["checkpoint"])["model"]
    assert summary["weights_digest"] != uninterrupted["weights_digest"]  # not bitwise: the sums ran in another order
    for name, tensor in theirs.items():
        assert torch.allclose(mine[name], tensor, rtol=1e-4, atol=1e-6), name
