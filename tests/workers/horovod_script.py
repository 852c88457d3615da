"""A Horovod PyTorch script as its docs write it, run with `import gpurig as hvd`: 2 ranks on halves of each
global batch end at the weights one process reaches on the whole batches (checked on rank 0)."""
import copy, sys
import torch
import gpurig as hvd

hvd.init()
torch.manual_seed(1234 + hvd.rank())             # different initial weights: broadcast_parameters must fix them
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
if hvd.rank() == 1:
    optimizer.param_groups[0]["lr"] = 7.0        # broadcast_optimizer_state must give rank 0's
compression = sys.argv[1] if len(sys.argv) > 1 else "none"
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=getattr(hvd.Compression, compression))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
assert optimizer.param_groups[0]["lr"] == 0.1 and isinstance(optimizer, torch.optim.SGD)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)   # takes it: still an SGD

reference = copy.deepcopy(model)   # rank 0's weights, trained on the whole batches in this process
plain = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
plain_scheduler = torch.optim.lr_scheduler.StepLR(plain, step_size=2, gamma=0.5)
data = torch.Generator().manual_seed(7)
for step in range(4):
    x, y = torch.randn(32, 8, generator=data), torch.randint(0, 3, (32,), generator=data)
    mine = slice(16 * hvd.rank(), 16 * (hvd.rank() + 1))
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x[mine]), y[mine]).backward()
    optimizer.synchronize()                       # Horovod's clipping idiom: averaged already
    torch.nn.utils.clip_grad_norm_(model.parameters(), 100.0)
    with optimizer.skip_synchronize():
        optimizer.step()
    scheduler.step()
    plain.zero_grad()
    torch.nn.functional.cross_entropy(reference(x), y).backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 100.0)
    plain.step()
    plain_scheduler.step()
mean = hvd.allreduce(torch.tensor([float(hvd.rank())]))
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)
assert mean.item() == 0.5 and total.item() == 1.0, (mean, total)
gap = max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
same = hvd.broadcast(torch.cat([p.detach().flatten() for p in model.parameters()]), root_rank=0)
spread = (same - torch.cat([p.detach().flatten() for p in model.parameters()])).abs().max().item()
tolerance = 1e-5 if compression == "none" else 2e-2
print(f"rank {hvd.rank()} gap {gap:.2e} spread {spread:.2e}", "OK" if gap < tolerance and spread == 0 else "BAD")
