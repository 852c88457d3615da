"""Checkpoints: the checksum finds every kind of damage, a crafted pickle runs nothing, the series falls back.

In-process and real files throughout; torch.load itself must still read gpurig's files.
"""

import hashlib
import json
import os

import pytest
import torch

from conftest import run_cli
from gpurig.train import TrainConfig
from gpurig.train.checkpoints import (CHECKPOINT_FORMAT, CheckpointError, damaged, epoch_path, load, load_newest, lock,
                                      remove_leftovers, save, save_epoch, saved_epochs, verify)
from gpurig.train.state import CannotResume, resume_state

STATE = {"epoch": 3, "model": {"w": torch.arange(1000, dtype=torch.float32)}, "history": [{"loss": 0.5}]}


def test_a_checkpoint_loads_with_gpurig_and_with_plain_torch(tmp_path):
    path = save(tmp_path / "ck.pt", STATE)
    assert torch.equal(load(path)["model"]["w"], STATE["model"]["w"])
    assert torch.equal(torch.load(path, weights_only=True)["model"]["w"], STATE["model"]["w"])
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"]  # no temporary file left


def _damage(path, how):
    data = bytearray(path.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "bit flipped":
        data[len(data) // 3] ^= 0x01
    elif how == "appended":
        data += b"more"
    elif how == "empty":
        data = b""
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how,message", [
    ("truncated", "has no gpurig checksum line"),
    ("bit flipped", "is corrupt: its SHA-256 does not match"),
    ("appended", "has no gpurig checksum line"),
    ("empty", "has no gpurig checksum line"),
])
def test_damage_is_reported_in_one_line(tmp_path, how, message):
    path = save(tmp_path / "ck.pt", STATE)
    _damage(path, how)
    with pytest.raises(CheckpointError) as error:
        load(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_cut_inside_the_payload_keeping_the_checksum_line_is_found(tmp_path):
    path = save(tmp_path / "ck.pt", STATE)
    data = path.read_bytes()
    trailer = data.rindex(b"\n#gpurig-checkpoint")
    path.write_bytes(data[:100] + data[trailer:])
    with pytest.raises(CheckpointError, match="was cut or added to"):
        verify(path)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("with_checksum", [False, True])
def test_a_crafted_pickle_is_refused_and_runs_nothing(tmp_path, with_checksum):
    """With a valid checksum line too: a checksum is no signature, so loading must still refuse code."""
    marker, path = tmp_path / "pwned", tmp_path / "evil.pt"
    torch.save({"model": _Evil(marker)}, path)
    if with_checksum:
        data = path.read_bytes()
        with open(path, "ab") as f:
            f.write(b"\n#gpurig-checkpoint sha256=%s bytes=%020d\n" % (hashlib.sha256(data).hexdigest().encode(),
                                                                         len(data)))
    with pytest.raises(CheckpointError) as error:
        load(path)
    text = str(error.value)
    assert ("was refused: it asks to run code" in text and "system" in text) if with_checksum else \
        "no gpurig checksum line" in text
    assert not marker.exists()


def test_the_series_keeps_the_last_k_and_points_at_the_newest(tmp_path):
    for epoch in range(1, 6):
        save_epoch(tmp_path, epoch, {"epoch": epoch}, keep=3)
        save(epoch_path(tmp_path, epoch, "feedback-rank1"), {"epoch": epoch})  # a rank's file of the same epoch
    save_epoch(tmp_path, 6, {"epoch": 6}, keep=3)
    assert saved_epochs(tmp_path) == [6, 5, 4]
    assert (tmp_path / "latest").read_text() == "checkpoint-epoch6.pt\n"
    assert sorted(p.name for p in tmp_path.glob("feedback-*")) == ["feedback-rank1-epoch4.pt",
                                                                  "feedback-rank1-epoch5.pt"]
    assert damaged(tmp_path) == {}


def test_checkpoints_and_traces_get_the_mode_of_any_new_file(tmp_path):
    """Written through a temporary file, they had mkstemp's 0600: other users could read the log, not these."""
    from gpurig.perf.timeline import chrome_trace, write

    saved = os.umask(0o022)
    try:
        save_epoch(tmp_path, 1, {"epoch": 1})
        write(tmp_path / "trace.json", chrome_trace([], {0: "rank 0"}))
    finally:
        os.umask(saved)
    for name in ("checkpoint-epoch1.pt", "latest", "trace.json"):
        assert oct((tmp_path / name).stat().st_mode & 0o777) == oct(0o644), name


def test_resume_passes_over_damaged_checkpoints_to_the_newest_good_one(tmp_path):
    for epoch in (1, 2, 3):
        save_epoch(tmp_path, epoch, {"epoch": epoch})
    _damage(epoch_path(tmp_path, 3), "bit flipped")
    _damage(epoch_path(tmp_path, 2), "truncated")
    state, path, problems = load_newest(tmp_path)
    assert state["epoch"] == 1 and path == epoch_path(tmp_path, 1)
    assert len(problems) == 2 and "checkpoint-epoch3.pt is corrupt" in problems[0]
    assert sorted(damaged(tmp_path)) == ["checkpoint-epoch2.pt", "checkpoint-epoch3.pt"]
    _damage(epoch_path(tmp_path, 1), "empty")
    with pytest.raises(CheckpointError, match="no good checkpoint in"):
        load_newest(tmp_path)


def _mlp_checkpoint(directory, epoch=1):
    """What gpurig train --model mlp writes after ``epoch`` (the fields resuming reads first)."""
    return save_epoch(directory, epoch, {"format": CHECKPOINT_FORMAT, "model_name": "mlp", "epoch": epoch, "step": 0,
                                         "history": []})


@pytest.mark.parametrize("how,args,message", [
    ("another model's", ["--model", "cnn"], "checkpoint-epoch1.pt was written by a run of --model mlp, not cnn: "
                                            "resume with --model mlp, or use another --checkpoint-dir"),
    ("garbage", [], "no good checkpoint in {dir}: {dir}/checkpoint-epoch1.pt has no gpurig checksum line"),
])
def test_train_resume_refuses_a_checkpoint_it_cannot_use_in_one_line_exit_2(tmp_path, how, args, message):
    """Refused before any rank starts (each rank once printed a CheckpointError traceback, exit 1)."""
    path = _mlp_checkpoint(tmp_path)
    if how == "garbage":
        path.write_bytes(b"garbage")
    code, out, err = run_cli(["train", "--resume", "--epochs", 2, *args, "--checkpoint-dir", tmp_path])
    assert code == 2 and message.format(dir=tmp_path) in err and "Traceback" not in err + out, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("gpurig: error: --resume: "), err


class _Ranks:
    """A communicator whose other ranks found ``theirs`` ([can resume, epoch, step] each), for resume_state."""

    rank = 0

    def __init__(self, *theirs):
        self.theirs, self.size = theirs, 1 + len(theirs)

    def allgather(self, tensor, name=None):
        return torch.cat([tensor, torch.tensor(self.theirs, dtype=tensor.dtype)])


@pytest.mark.parametrize("theirs,message", [
    ([1, 1, 0], None),
    ([0, 0, 0], "rank 1 cannot resume from {dir}: is it one directory shared by all the ranks?"),
    ([1, 2, 0], "the ranks found different newest checkpoints (the end of epoch 1, the end of epoch 2)"),
])
def test_the_ranks_resume_or_stop_together(tmp_path, theirs, message):
    """Every rank compares what it found before any raises: a rank that cannot resume stops them all (CannotResume,
    which gpurig.train.loop.run_rank turns into one line and exit 2), none is left waiting in a collective."""
    _mlp_checkpoint(tmp_path)
    config = TrainConfig(model="mlp", resume=True, checkpoint_dir=str(tmp_path))
    if message is None:
        assert resume_state(config, _Ranks(theirs))["epoch"] == 1
        return
    with pytest.raises(CannotResume) as error:
        resume_state(config, _Ranks(theirs))
    assert message.format(dir=tmp_path) in str(error.value)
    with pytest.raises(CannotResume, match="was written by a run of --model mlp, not cnn"):  # its own reason first
        resume_state(TrainConfig(model="cnn", resume=True, checkpoint_dir=str(tmp_path)), _Ranks([1, 1, 0]))


def test_a_second_run_on_a_checkpoint_directory_in_use_is_one_line_exit_2(tmp_path):
    """Two runs on one directory: the second would clear the first one's series (a fresh start) or mix its
    checkpoints in. The directory is held while a job runs; the second is refused before any rank starts."""
    with lock(tmp_path):
        code, out, err = run_cli(["train", "--epochs", "1", "--checkpoint-dir", tmp_path])
    assert code == 2 and out == "" and err.strip() == (
        f"gpurig: error: --checkpoint-dir {tmp_path} is in use by another gpurig train (process {os.getpid()}): "
        "give another --checkpoint-dir, or let that run end"), err
    with lock(tmp_path):  # released when its holder let go
        pass


def test_a_write_a_crash_cut_short_leaves_nothing_behind_once_resumed_or_restarted(tmp_path):
    save_epoch(tmp_path, 1, {"epoch": 1})
    torn = [tmp_path / ".checkpoint-epoch2.pt.ab12cd.tmp", tmp_path / ".feedback-rank1-epoch2.pt.x9.tmp",
            tmp_path / ".latest.q1w2"]
    for path in torn:
        path.write_bytes(b"half a checkpoint")
    assert load_newest(tmp_path)[0]["epoch"] == 1       # never taken for a checkpoint
    assert sorted(p.name for p in remove_leftovers(tmp_path)) == sorted(p.name for p in torn)
    assert [p.name for p in tmp_path.iterdir()] and not any(p.exists() for p in torn)
    assert load_newest(tmp_path)[0]["epoch"] == 1


def test_a_metrics_line_a_crash_cut_short_does_not_stop_resume(tmp_path):
    from gpurig.train.metrics import MetricsLog, last_step

    log = MetricsLog(tmp_path, None, enabled=True, first_epoch=0)
    for step in (1, 2, 3):
        log.step(1, step, loss=1.0)
    log.close()
    whole = (tmp_path / "metrics.jsonl").read_text()
    (tmp_path / "metrics.jsonl").write_text(whole + '{"kind": "step", "epoch": 1, "st')   # the failure's append
    assert last_step(tmp_path) == 3
    MetricsLog(tmp_path, None, enabled=True, first_epoch=0, first_step=2).close()   # resuming after step 2
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
