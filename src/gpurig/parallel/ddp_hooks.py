"""gpurig's gradient compression as PyTorch DDP communication hooks: adopt it in one line.

>>> import gpurig
>>> ddp_model.register_comm_hook(gpurig.hooks.State(), gpurig.hooks.int8)    # doctest: +SKIP
>>> ddp_model.register_comm_hook(gpurig.hooks.State(), gpurig.hooks.powersgd)  # rank 4; powersgd_hook(2) for rank 2  # doctest: +SKIP

Each hook averages DDP's gradient bucket as gpurig's DataParallel does (a
reduce-scatter and allgather of compressed chunks, or PowerSGD's two small
allreduces), with error feedback kept per bucket in the state. The work runs on
gpurig's communication thread, so DDP goes on with the backward pass while a
bucket travels.
"""

import torch
import torch.distributed as dist

from gpurig import comm as comm_mod
from gpurig.parallel import compression


class State:
    """What the hooks keep between steps: the communicator and each bucket's residuals.

    ``state_dict()`` / ``load_state_dict()`` save and restore the residuals (per rank) with a checkpoint.

    >>> state = State()                  # doctest: +SKIP
    """

    def __init__(self, comm=None):
        self.comm = comm or comm_mod.current()
        self.feedback: dict[int, compression.FeedbackState] = {}
        # each bucket's gradient shapes when its residuals were made: DDP rebuilds its buckets after the first
        # step (another order, other sizes), and residuals of the old layout then start again from zero
        self.layouts: dict[int, list] = {}

    def state_dict(self) -> dict:
        return {index: f.saved() for index, f in self.feedback.items()}

    def load_state_dict(self, saved: dict) -> None:
        for index, tensors in saved.items():
            self.feedback.setdefault(int(index), compression.FeedbackState()).restore(tensors)


def _hook(method: str):
    compression.parse_method(method)

    def hook(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        shapes = [g.shape for g in bucket.gradients()]
        index = bucket.index()
        if state.layouts.setdefault(index, shapes) != shapes:  # restored residuals: taken as this layout's
            state.feedback[index], state.layouts[index] = compression.FeedbackState(), shapes
        feedback = state.feedback.setdefault(index, compression.FeedbackState())
        future = torch.futures.Future()

        def job():
            try:
                compression.average(state.comm, buffer.view(-1), method, feedback, shapes)
                future.set_result(buffer)
            except Exception as e:  # handed to DDP, which raises it from backward
                future.set_exception(e)

        state.comm.run_async(job)
        return future

    hook.__name__ = hook.__qualname__ = method.replace("-", "_").replace(":", "_rank")
    hook.__doc__ = f"DDP communication hook: average the bucket with gpurig's {method} compression."
    return hook


def powersgd_hook(rank: int):
    """A DDP communication hook for PowerSGD of the given rank.

    >>> powersgd_hook(2).__name__
    'powersgd_rank2'
    """
    return _hook(f"powersgd:{rank}")


fp16 = _hook("fp16")
bf16 = _hook("bf16")
int8 = _hook("int8")
int8_dynamic = _hook("int8-dynamic")
powersgd = _hook("powersgd")

__all__ = ["State", "fp16", "bf16", "int8", "int8_dynamic", "powersgd", "powersgd_hook"]
