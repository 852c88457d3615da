"""Collectives over both real engines, 3 ranks: every dtype, uneven and empty sizes, async forms."""

from conftest import assert_all_ok, run_cases

# 5 dtypes x 4 sizes x 6 collectives + 5 x 3 async forms + 15 single cases (see workers/collectives.py)
CASES = 5 * 4 * 6 + 5 * 3 + 15


def test_collectives_on_three_ranks(engine, tmp_path):
    assert_all_ok(run_cases("collectives.py", engine, 3, tmp_path), CASES)


def test_collectives_on_one_rank(tmp_path):
    assert_all_ok(run_cases("collectives.py", "mpi", 1, tmp_path), CASES)
