"""Session 52's fixes on CUDA tensors, 2 ranks on one GPU (run by `gpurig run -n 2`): prints one line per check.

    PYTHONPATH=src python -m gpurig run -n 2 --engine torch -- python benchmarks/gpu_session52.py
"""

import torch

import gpurig

comm = gpurig.init()
R, P = comm.rank, comm.size
dev = comm.device
out = []


def check(name, ok, detail=""):
    out.append(f"rank {R} {comm.engine_name} {name}: {'ok' if ok else 'FAILED'} {detail}")


# fp16 average of CUDA tensors: divided before the sum (40000 each; the sum would overflow fp16)
t = torch.full((1024,), 40000.0, dtype=torch.float16, device=dev)
comm.allreduce(t)
check("fp16 average on CUDA", bool(torch.all(t == 40000.0)), f"{t[0].item()}")
# MixedPrecision without device or comm: autocasts on the GPU, skips together
mixed = gpurig.MixedPrecision("fp16")
check("MixedPrecision default device", mixed.device.type == dev.type, str(mixed.device))
model = gpurig.DataParallel(torch.nn.Linear(64, 8).to(dev), nonfinite="ignore")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with mixed.autocast():
    y = model(torch.ones(16, 64, device=dev))
check("autocast to fp16 on CUDA", y.dtype == torch.float16, str(y.dtype))
mixed.scale(y.float().mean()).backward()
if R == P - 1:
    model.module.weight.grad[0, 0] = float("inf")
stepped = mixed.step(opt, model)
check("an overflow on one rank skips on all", stepped is False, f"stepped={stepped}")
# a parameter frozen after wrapping is refused at the next forward
model.module.bias.requires_grad_(False)
try:
    model(torch.ones(2, 64, device=dev))
    check("frozen after wrapping refused", False)
except ValueError as e:
    check("frozen after wrapping refused", "'bias' was frozen" in str(e))
model.remove_hooks()
comm.barrier()
print("\n".join(out), flush=True)
