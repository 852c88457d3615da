"""Horovod's PyTorch API (``import gpurig as hvd``): a Horovod script as its documentation writes it, on 2 real
ranks over MPI and Gloo, reaches the weights of one process on the whole batches; what gpurig does not do of
Horovod's is refused in one line."""

from pathlib import Path

import pytest
import torch

import gpurig
from conftest import gpurig as gpurig_cli

SCRIPT = Path(__file__).parent / "workers" / "horovod_script.py"


@pytest.mark.parametrize("engine,compression", [("mpi", "none"), ("torch", "fp16")])
def test_a_horovod_script_trains_as_one_process_on_the_whole_batch(engine, compression):
    done = gpurig_cli("run", "-n", 2, "--engine", engine, "--", "python", SCRIPT, compression, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(done.stdout.split("rank ")[1:])
    assert len(lines) == 2 and all(line.strip().endswith("OK") for line in lines), done.stdout


def test_what_horovod_has_and_gpurig_does_not_is_refused():
    gpurig.init()
    model = torch.nn.Linear(4, 2)
    for kwargs, said in [({"op": gpurig.Sum}, "gpurig averages gradients"),
                         ({"op": gpurig.Adasum}, "gpurig averages gradients"),
                         ({"backward_passes_per_step": 2}, "under no_sync()"),
                         ({"named_parameters": [("weight", model.weight)]}, "are not among them")]:
        with pytest.raises(ValueError, match=said):
            gpurig.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)
    optimizer = gpurig.DistributedOptimizer(torch.optim.Adam(model.parameters()), named_parameters=model.named_parameters())
    assert isinstance(optimizer, torch.optim.Adam) and type(optimizer).__name__ == "Adam"
    with pytest.raises(ValueError, match="a DistributedOptimizer already"):
        gpurig.DistributedOptimizer(optimizer)
    with pytest.raises(ValueError, match="hvd.Average and hvd.Sum"):
        gpurig.allreduce(torch.ones(2), op=gpurig.Adasum)
