"""Model and hybrid parallelism on real ranks (both engines): split layers, gpurig.parallelize, gpurig train --parallel.

The comparisons run inside the ranks (tests/workers/model_parallel.py, which
states the tolerances); here the jobs are launched and the command line is checked.
"""

import doctest

import pytest

import gpurig
import gpurig.parallel.memory
import gpurig.parallel.model_parallel
import gpurig.parallel.plan
import gpurig.parallel.split_model
from conftest import assert_all_ok, run_cases

CASES = 23


@pytest.mark.parametrize("module", [gpurig.parallel.model_parallel, gpurig.parallel.plan,
                                    gpurig.parallel.split_model, gpurig.parallel.memory])
def test_docstring_examples_on_one_rank(module):
    assert doctest.testmod(module, extraglobs={"gpurig": gpurig}, optionflags=doctest.ELLIPSIS).failed == 0


def test_split_layers_and_training_on_three_ranks(engine, tmp_path):
    assert_all_ok(run_cases("model_parallel.py", engine, 3, tmp_path), CASES)


def test_split_layers_and_training_on_two_ranks_over_mpi(tmp_path):
    assert_all_ok(run_cases("model_parallel.py", "mpi", 2, tmp_path), CASES)
