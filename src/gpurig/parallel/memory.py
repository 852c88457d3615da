"""What a rank holds in memory for its model: parameters and optimizer state, in bytes."""

from __future__ import annotations

import torch


def parameter_bytes(module: torch.nn.Module) -> int:
    """Bytes of the parameters this rank holds (a split layer counts only its slice).

    >>> parameter_bytes(torch.nn.Linear(1000, 1000))      # 1000*1000 + 1000 float32 values
    4004000
    """
    return sum(p.numel() * p.element_size() for p in module.parameters())


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors an optimizer keeps per parameter (momentum, Adam's moments).

    >>> fc = torch.nn.Linear(1000, 1000)
    >>> opt = torch.optim.SGD(fc.parameters(), lr=0.1, momentum=0.9)
    >>> fc(torch.ones(1, 1000)).sum().backward(); opt.step()
    >>> optimizer_state_bytes(opt)                          # one momentum buffer per parameter
    4004000
    """
    return sum(t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
               if isinstance(t, torch.Tensor))
