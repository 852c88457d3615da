"""Gradient compression on real ranks (both engines): close to the true average, error feedback, training."""

from conftest import assert_all_ok, run_cases

CASES = 4 + 1 + 5 * 3 + 3 + 6


def test_compression_on_three_ranks(engine, tmp_path):
    assert_all_ok(run_cases("compression.py", engine, 3, tmp_path), CASES)


def test_codecs_as_ddp_comm_hooks(tmp_path):
    assert_all_ok(run_cases("ddp_hooks.py", "torch", 2, tmp_path), 6)
