"""Let a ``TorchFunctionMode`` see inside PyTorch's own Python functions, as a GPU runs what they call.

A ``TorchFunctionMode`` sees a torch function only where the call begins:
while its ``__torch_function__`` runs, the mode is off, so whatever that
function calls in turn goes by unseen. Most torch functions are C++ and call
nothing a mode would want, but some of ``torch.nn.functional`` are Python
that calls other torch functions. The one that matters is
``F.multi_head_attention_forward``, the body of every ``nn.MultiheadAttention``
and so of every ``nn.TransformerEncoderLayer`` and torchvision's ViT: its
projections (linear layers autocast runs in 16 bits) and its
``scaled_dot_product_attention`` (the fused kernel a GPU runs) were invisible
to gpurig's modes, and a ViT-B/16's step was priced with FP32 projections and
a tokens × tokens score matrix (8.2 GiB at 64 in bf16; an H100 measured 5.1).

:func:`call_inside` runs such a function with the mode on inside it. Only the
functions in :data:`INSIDE`: any other passes down the stack whole, as
before, since a mode below may want it so (``gpurig.models.trace`` charges
``F.dropout`` as the one kernel a GPU runs; looking inside it would hand the
modes below its decomposition instead).
"""

from __future__ import annotations

import threading

import torch.nn.functional as F

# PyTorch's Python functions that run products or attention inside, which the modes price or type
INSIDE = frozenset({F.multi_head_attention_forward})
# the checks a Python torch function makes before handing itself to the modes
_CHECKS = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")
_patching = threading.RLock()


def _never(*args) -> bool:
    return False


def call_inside(mode, func, args: tuple, kwargs: dict):
    """``func(*args, **kwargs)``, called from ``mode``'s ``__torch_function__``; where ``func`` is one of
    :data:`INSIDE`, ``mode`` sees the torch functions it calls (and the modes below it see them too).

    Its module's torch-function checks are switched off while it runs (so it does not hand itself back to the
    mode), and the mode is on again; the checks come back when it returns. Any other function is called as it
    is.

    >>> import torch
    >>> from torch.overrides import TorchFunctionMode
    >>> class Seen(TorchFunctionMode):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.names = set()
    ...     def __torch_function__(self, func, types, args=(), kwargs=None):
    ...         self.names.add(getattr(func, "__name__", ""))
    ...         return call_inside(self, func, args, kwargs or {})
    >>> attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    >>> x = torch.ones(1, 3, 8)
    >>> with Seen() as seen:
    ...     _ = attention(x, x, x, need_weights=False)
    >>> sorted({"multi_head_attention_forward", "linear", "scaled_dot_product_attention"} & seen.names)
    ['linear', 'multi_head_attention_forward', 'scaled_dot_product_attention']
    """
    if not any(func is f for f in INSIDE):
        return func(*args, **kwargs)
    names = func.__globals__
    with _patching:
        saved = {name: names[name] for name in _CHECKS if name in names}
        names.update(dict.fromkeys(saved, _never))
        try:
            with mode:
                return func(*args, **kwargs)
        finally:
            names.update(saved)
