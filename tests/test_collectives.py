"""Collectives over both real engines, 3 ranks: every dtype, uneven and empty sizes, async forms."""

import sys

from conftest import assert_all_ok, gpurig, run_cases

# 5 dtypes x 4 sizes x 6 collectives + 5 x 3 async forms + 18 single cases (see workers/collectives.py)
CASES = 5 * 4 * 6 + 5 * 3 + 18


def test_collectives_on_three_ranks(engine, tmp_path):
    assert_all_ok(run_cases("collectives.py", engine, 3, tmp_path), CASES)


def test_collectives_on_one_rank(tmp_path):
    assert_all_ok(run_cases("collectives.py", "mpi", 1, tmp_path), CASES)


def test_init_again_after_shutdown_on_the_torch_engine(tmp_path):
    """The rendezvous store is closed with the engine: a second init serves a new one on the same port."""
    script = tmp_path / "again.py"
    script.write_text("import torch, gpurig\n"
                      "for attempt in range(2):\n"
                      "    comm = gpurig.init()\n"
                      "    assert comm.allreduce(torch.ones(2), op='sum').tolist() == [2.0, 2.0]\n"
                      "    gpurig.shutdown()\n"
                      "print('ok', flush=True)\n")
    done = gpurig("run", "-n", "2", "--engine", "torch", "--", sys.executable, script, timeout=120)
    assert done.returncode == 0 and done.stdout.count("ok") == 2, done.stderr
