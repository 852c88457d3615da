"""PyTorch's DDP tutorial script, unmodified but for the backend: the elastic (torchrun) version of "Getting Started
with Distributed Data Parallel" (https://pytorch.org/tutorials/intermediate/ddp_tutorial.html), with "gloo" for
"nccl" and no .to(device), so that it runs on CPU.

    gpurig run -n 2 --engine torch -- python examples/ddp_tutorial.py
    gpurig run -n 2 --engine mpi -- python examples/ddp_tutorial.py
    torchrun --nproc-per-node 2 examples/ddp_tutorial.py

benchmarks/ddp_tutorial.py runs it many times under each launcher and counts the runs that fail.
"""
import os
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"Start running basic DDP example on rank {rank}.")
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)
    loss_fn(outputs, labels).backward()
    optimizer.step()
    dist.destroy_process_group()
    print(f"Finished running basic DDP example on rank {rank}.")


if __name__ == "__main__":
    demo_basic()
