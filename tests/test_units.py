"""Pure functions and single-process behaviour: no launcher needed."""

import subprocess
import sys

import pytest
import torch

import gpurig.train.checkpoints
import gpurig.comm.communicator
import gpurig.launch.env
import gpurig.launch.hosts
import gpurig.launch.job
import gpurig.launch.status
import gpurig.cli.train
import gpurig.models
import gpurig.parallel.auto
import gpurig.parallel.codecs
import gpurig.parallel.compression
import gpurig.parallel.data_parallel
import gpurig.parallel.native
import gpurig.parallel.powersgd
import gpurig.parallel.sharding
import gpurig.train
from gpurig.comm import split_sizes
from gpurig.errors import UsageError
from gpurig.parallel import assign_buckets, tile_advice
from gpurig.parallel.data_parallel import first_difference
from gpurig.parallel.sharding import per_rank_batches
from gpurig.train import TrainConfig, validate
from gpurig.train.metrics import split_across_ranks


@pytest.mark.parametrize("n,parts", [(10, 4), (0, 3), (3, 4), (128, 4), (7, 1)])
def test_split_sizes_match_tensor_split(n, parts):
    assert split_sizes(n, parts) == [len(c) for c in torch.tensor_split(torch.arange(n), parts)]


def test_buckets_cover_every_parameter_once_in_reverse_order():
    params = [torch.zeros(s) for s in (100, 5, 300, 7, 50, 1)]
    buckets = assign_buckets(params, cap_bytes=1000)
    flat = [i for b in buckets for i in b]
    assert flat == list(reversed(range(len(params))))
    for b in buckets[:-1]:  # a bucket closes with the parameter that takes it to the cap
        assert sum(params[i].numel() * 4 for i in b[:-1]) < 1000 <= sum(params[i].numel() * 4 for i in b)


def test_buckets_never_mix_dtypes():
    params = [torch.zeros(3), torch.zeros(3, dtype=torch.float16), torch.zeros(3)]
    assert assign_buckets(params, cap_bytes=10**6) == [[2], [1], [0]]


def test_first_difference_names_rank_and_tensor():
    a = [["param", "w", [2], "torch.float32", True], ["param", "b", [2], "torch.float32", True]]
    assert first_difference([a, a, a]) is None
    frozen = [["param", "w", [2], "torch.float32", False], a[1]]
    assert first_difference([a, frozen]) == ("param 'w': requires_grad is True on rank 0, False on rank 1 (freeze "
                                             "the same parameters on every rank)")
    dtype = [["param", "w", [2], "torch.float32", True], ["param", "b", [2], "torch.float64", True]]
    assert "param 'b': rank 0 has shape [2] torch.float32, rank 2 has shape [2] torch.float64" in \
        first_difference([a, a, dtype])
    assert "only rank 0 has param 'b'" in first_difference([a, a[:1]])


def test_per_rank_batch_of_zero_is_an_error():
    assert per_rank_batches(128, 4) == [32] * 4
    with pytest.raises(ValueError, match="no samples"):
        per_rank_batches(3, 4)


@pytest.mark.parametrize("batch,ok", [(64, True), (128, True), (96, True), (32, False), (16, False), (100, False)])
def test_tile_rule(batch, ok):
    assert (tile_advice(batch) is None) == ok


def test_split_across_ranks_attributes_waiting_to_the_faster_rank():
    per_rank = torch.tensor([[2.0, 1.0, 0.1], [1.0, 2.0, 0.1]], dtype=torch.float64)  # rank 1 computes 1 s less
    split = split_across_ranks(per_rank, steps=1)
    assert split == {"compute_ms": 1500.0, "comm_ms": 1000.0, "wait_ms": 500.0, "data_ms": 100.0}


def test_checkpoint_roundtrip_and_atomic_replace(tmp_path):
    path = tmp_path / "ck.pt"
    gpurig.train.checkpoints.save(path, {"epoch": 1, "w": torch.ones(3)})
    gpurig.train.checkpoints.save(path, {"epoch": 2, "w": torch.zeros(3)})
    state = gpurig.train.checkpoints.load(path)
    assert state["epoch"] == 2 and torch.equal(state["w"], torch.zeros(3))
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"]  # no temporary files left


# Damaged and crafted checkpoints: tests/test_checkpoints.py


def test_the_source_mnist_net_has_the_source_shape():
    layers = [m for m in gpurig.models.mlp() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in layers] == [(784, 1200), (1200, 1200), (1200, 10)]


def test_reference_data_set_is_balanced_and_real():
    from gpurig.train.data import mnist

    data = mnist()
    assert data.x_train.shape == (4000, 784) and data.x_test.shape == (1000, 784)
    assert torch.bincount(data.y_test).tolist() == [100] * 10
    assert data.x_train.std() > 0.5  # real images, normalised


@pytest.mark.parametrize("change,message", [
    (dict(global_batch=1), "leaves 1 rank"),
    (dict(model="resnet9000"), "unknown model"),
    (dict(engine="carrier-pigeon"), "unknown engine"),
    (dict(epochs=0), "--epochs"),
    (dict(lr=-1.0), "--lr"),
    (dict(bucket_mb=0), "--bucket-mb"),
    (dict(resume=True, checkpoint_dir="/nonexistent"), "no checkpoint"),
    (dict(global_batch=99_999_999), r"larger than the mnist training set \(4000 samples\): use at most 4000"),
])
def test_impossible_training_configurations(change, message):
    with pytest.raises(UsageError, match=message):
        validate(TrainConfig(**change), nprocs=2)


def test_single_process_data_parallel_without_launcher():
    code = ("import gpurig, torch; m = gpurig.DataParallel(torch.nn.Linear(3, 1)); "
            "m(torch.ones(4, 3)).sum().backward(); print(gpurig.size(), m.module.bias.grad.item())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "4.0"]


def test_a_handle_waits_at_most_its_timeout_and_can_be_waited_again():
    """``Handle.wait(timeout=)`` on an engine's request: TimeoutError when it has not finished by then (it was
    ignored: the wait blocked until the collective ended), its result once it has."""
    import time as clock

    from gpurig.comm.communicator import Handle

    class Request:  # an engine's nonblocking request that finishes at a set time
        def __init__(self, seconds):
            self.done_at = clock.monotonic() + seconds

        def is_completed(self):
            return clock.monotonic() >= self.done_at

        def wait(self):
            clock.sleep(max(0.0, self.done_at - clock.monotonic()))

    handle = Handle(work=Request(0.5), finish=lambda: "averaged")
    with pytest.raises(TimeoutError, match="did not finish within 0.05 s"):  # not blocked until it finished
        handle.wait(timeout=0.05)
    assert handle.wait(timeout=5) == "averaged" and handle.is_completed()
