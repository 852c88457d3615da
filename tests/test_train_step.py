"""gpurig train's step on real ranks: --accumulate K equals the plain step and the 1-rank reference (to 1e-5), and
fp16's loss scaler skips a step on every rank when one rank alone overflows (tests/workers/train_step.py)."""

import pytest

from conftest import assert_all_ok, run_cases

CASES = 7


@pytest.mark.parametrize("nprocs", [2, 3])
def test_accumulation_and_agreed_skips(engine, nprocs, tmp_path):
    assert_all_ok(run_cases("train_step.py", engine, nprocs, tmp_path), CASES)
