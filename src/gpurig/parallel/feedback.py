"""What a compressed bucket keeps between steps on one rank: error-feedback residuals, PowerSGD's warm start.

Every lossy method (:mod:`~gpurig.parallel.compression`'s element-wise codecs,
:mod:`~gpurig.parallel.powersgd`) adds back at the next step what it lost at this
one; the residuals are per rank and per bucket, and are saved with checkpoints.

>>> state = FeedbackState(sent=torch.zeros(3))
>>> sorted(state.saved())
['lowrank', 'owned', 'sent']
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class FeedbackState:
    """What one bucket keeps between steps on one rank: error-feedback residuals and scratch buffers.

    ``sent``: what this rank's compressed chunks lost (bucket length; PowerSGD's
    residual too). ``owned``: what the compressed average of the chunk this rank
    owns lost. ``lowrank``: PowerSGD's warm-start factors. Scratch buffers are
    not saved.
    """

    sent: torch.Tensor | None = None
    owned: torch.Tensor | None = None
    lowrank: list[torch.Tensor] | None = None
    scratch: dict = field(default_factory=dict, repr=False)

    def buffer(self, name: str, numel: int, dtype=torch.float32, device=None) -> torch.Tensor:
        """A scratch tensor kept between steps (allocated once per size)."""
        held = self.scratch.get(name)
        if held is None or held.numel() != numel or held.dtype != dtype or held.device != torch.device(device or "cpu"):
            held = self.scratch[name] = torch.empty(numel, dtype=dtype, device=device)
        return held

    def saved(self) -> dict:
        """The tensors a checkpoint keeps (residuals, warm start)."""
        return {"sent": self.sent, "owned": self.owned, "lowrank": self.lowrank}

    def restore(self, saved: dict) -> None:
        self.sent, self.owned, self.lowrank = saved.get("sent"), saved.get("owned"), saved.get("lowrank")
