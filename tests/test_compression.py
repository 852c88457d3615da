"""Gradient compression on real ranks (both engines): close to the true average, error feedback, training."""

from conftest import assert_all_ok, run_cases

CASES = 4 * 3 + 1


def test_compression_on_three_ranks(engine, tmp_path):
    assert_all_ok(run_cases("compression.py", engine, 3, tmp_path), CASES)
