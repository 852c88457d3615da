"""ZeRO stages 1 and 2 on real ranks over MPI and Gloo (tests/workers/zero.py): sharded equals unsharded and the
1-rank reference to 1e-5 (Adam, SGD, groups, --accumulate with fp16), the whole-format state dict, 1/N of Adam's
state per rank, compression, the agreed skip."""

import pytest

from conftest import assert_all_ok, run_cases

CASES = 4 * 2 + 7


@pytest.mark.parametrize("nprocs", [2, 3])
def test_zero_equals_unsharded(engine, nprocs, tmp_path):
    assert_all_ok(run_cases("zero.py", engine, nprocs, tmp_path), CASES)


def test_zero_on_one_rank(tmp_path):
    assert_all_ok(run_cases("zero.py", "mpi", 1, tmp_path), CASES)
