"""A torchrun-style DDP script with nothing of gpurig in it (PyTorch's DDP tutorial, shortened): env:// rendezvous,
LOCAL_RANK, one DistributedDataParallel step. Writes rank<r>.json to CASE_DIR with what it saw."""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
torch.manual_seed(rank)
model(torch.randn(8, 4)).sum().backward()
grads = [torch.zeros(1) for _ in range(size)]
dist.all_gather(grads, model.module.bias.grad.clone())
seen = {"rank": rank, "size": size, "local_rank": int(os.environ["LOCAL_RANK"]),
        "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]),
        "same_gradient": all(torch.equal(g, grads[0]) for g in grads)}
dist.destroy_process_group()
Path(os.environ["CASE_DIR"], f"rank{rank}.json").write_text(json.dumps(seen))
