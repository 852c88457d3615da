"""DataParallel on real ranks equals single-process training on the whole global batch.

The comparisons themselves run inside the ranks (tests/workers/data_parallel.py):
SGD with momentum and Adam, one bucket and many, no_sync accumulation, unused
parameters, BatchNorm buffers, mismatched models, and shard's coverage.
Tolerance: rtol 1e-5, atol 1e-6 on the weights after 6 steps.
"""

from conftest import assert_all_ok, run_cases

CASES = 23


def test_data_parallel_matches_single_process(engine, tmp_path):
    assert_all_ok(run_cases("data_parallel.py", engine, 3, tmp_path), CASES)


def test_data_parallel_on_two_ranks_over_mpi(tmp_path):
    assert_all_ok(run_cases("data_parallel.py", "mpi", 2, tmp_path), CASES)
