"""The int8 codecs' encoders on a GPU: one Triton kernel each, where torch takes a dozen (int8) to thirty kernels.

Each program encodes one block of :data:`~gpurig.parallel.codecs.BLOCK` values
with error feedback, as the C kernels (``int8.c``) do on a CPU: add last step's
residual, take the block's absmax (as bits, so a NaN or an infinity becomes the
scale and the numerical guard sees it), write the codes and the scale, keep what
was lost. The arithmetic is the C kernels' (true divisions, the dynamic type's
slots and fused multiply-adds), so codes and scales are the torch encoders' bit
for bit (tests/test_gpu_codecs.py, on a GPU and in Triton's interpreter).

:func:`kernels` is None where Triton is missing (this CPU machine, CI); the
codecs then take their torch path.
"""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=None)
def kernels():
    """The module's Triton kernels, or None without Triton (or with ``GPURIG_TRITON=0``).

    >>> kernels() is None or hasattr(kernels(), "int8_encode_feedback")
    True
    """
    if os.environ.get("GPURIG_TRITON", "1") == "0":
        return None
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return None
    from gpurig.parallel.native import _triton_kernels
    return _triton_kernels
