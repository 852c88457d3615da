"""Collective mismatches over both real engines, 3 ranks: every kind of difference is an error on every rank.

The cases run inside the ranks (tests/workers/mismatch.py): different names,
shapes (a different size, which would otherwise crash the engines, and the same
size), dtypes, reductions, order, collective, broadcast root, an async
collective, DataParallel bucket layouts, a rank that calls another collective where the others
begin backward (their check already posted), or between its forward and backward; and the numerical
guard's stop and skip.
"""

from conftest import assert_all_ok, run_cases

CASES = 18


def test_mismatches_are_errors_on_every_rank(engine, tmp_path):
    assert_all_ok(run_cases("mismatch.py", engine, 3, tmp_path), CASES)
