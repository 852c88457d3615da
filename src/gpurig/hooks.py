"""gpurig's gradient codecs as PyTorch DDP communication hooks: adopt them in one line.

>>> import gpurig.hooks
>>> ddp_model.register_comm_hook(gpurig.hooks.State(), gpurig.hooks.int8)    # doctest: +SKIP

Each hook averages DDP's gradient bucket as gpurig's DataParallel does: a
reduce-scatter and allgather of compressed chunks, with error feedback kept per
bucket in the state. The work runs on gpurig's communication thread, so DDP
goes on with the backward pass while a bucket travels.
"""

import torch
import torch.distributed as dist

from gpurig import comm as comm_mod
from gpurig.parallel import codecs
from gpurig.parallel.compression import FeedbackState, compressed_average


class State:
    """What the hooks keep between steps: the communicator and each bucket's error-feedback residuals.

    >>> state = State()                  # doctest: +SKIP
    """

    def __init__(self, comm=None):
        self.comm = comm or comm_mod.current()
        self.feedback: dict[int, FeedbackState] = {}


def _hook(codec_name: str):
    codec = codecs.get(codec_name)

    def hook(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        feedback = state.feedback.setdefault(bucket.index(), FeedbackState())
        future = torch.futures.Future()

        def job():
            try:
                average, _ = compressed_average(state.comm, buffer.view(-1), codec, feedback)
                buffer.view(-1).copy_(average)
                future.set_result(buffer)
            except Exception as e:  # handed to DDP, which raises it from backward
                future.set_exception(e)

        state.comm.run_async(job)
        return future

    hook.__name__ = hook.__qualname__ = codec_name.replace("-", "_")
    hook.__doc__ = f"DDP communication hook: average the bucket through gpurig's {codec_name} codec."
    return hook


fp16 = _hook("fp16")
bf16 = _hook("bf16")
int8 = _hook("int8")
int8_dynamic = _hook("int8-dynamic")

__all__ = ["State", "fp16", "bf16", "int8", "int8_dynamic"]
