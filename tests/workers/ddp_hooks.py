"""gpurig's codecs as DDP communication hooks: DDP with a hook trains like plain DDP, within the codec's error."""

import copy

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import gpurig
from casekit import case, write

comm = gpurig.init("torch")

for name in ("fp16", "bf16", "int8", "int8_dynamic", "powersgd"):
    @case(f"ddp_hook[{name}]")
    def _():
        torch.manual_seed(0)
        base = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
        plain, hooked = DDP(copy.deepcopy(base)), DDP(copy.deepcopy(base), bucket_cap_mb=0.004)
        state = gpurig.hooks.State()
        hooked.register_comm_hook(state, getattr(gpurig.hooks, name))
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, hooked)]
        g = torch.Generator().manual_seed(comm.rank)
        for _ in range(5):
            x, y = torch.randn(24, 20, generator=g), torch.randint(0, 5, (24,), generator=g)
            for model, opt in zip((plain, hooked), opts):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
        worst = max((p - q).abs().max().item() for p, q in zip(plain.parameters(), hooked.parameters()))
        assert worst < (0.05 if name == "powersgd" else 0.01), worst
        assert state.feedback and all(f.sent is not None for f in state.feedback.values())  # residuals kept
        restored = gpurig.hooks.State()
        restored.load_state_dict(state.state_dict())
        assert all(torch.equal(restored.feedback[i].sent, f.sent) for i, f in state.feedback.items())

@case("residuals_start_again_when_ddp_rebuilds_its_buckets")
def _():
    """DDP's default buckets are rebuilt after the first step, in the order gradients came: other sizes. The
    residuals of the old layout start again from zero (PowerSGD crashed at the second step, int8 added them to
    other gradients)."""
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 1000),
                                    torch.nn.ReLU(), torch.nn.Linear(1000, 4)))
    state = gpurig.hooks.State()
    model.register_comm_hook(state, gpurig.hooks.powersgd)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(comm.rank)
    layouts = []
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(model(torch.randn(8, 32, generator=g)), torch.randint(0, 4, (8,), generator=g)).backward()
        opt.step()
        layouts.append({i: [tuple(s) for s in shapes] for i, shapes in state.layouts.items()})
    assert layouts[0] != layouts[1] == layouts[2], layouts   # rebuilt once, after the first step
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = comm.allgather(flat.view(1, -1))
    assert all(torch.equal(everyone[0], row) for row in everyone)


write(comm.rank)
