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

:func:`call_inside` runs such a function with the mode on inside it.
"""

from __future__ import annotations

import inspect
import threading

import torch.functional
import torch.nn.functional as F

# the modules whose Python functions hand themselves to torch function modes, and the checks they make first
_PYTHON_LEVEL = (vars(F), vars(torch.functional))
_CHECKS = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")
_patching = threading.RLock()


def _never(*args) -> bool:
    return False


def call_inside(mode, func, args: tuple, kwargs: dict):
    """``func(*args, **kwargs)``, called from ``mode``'s ``__torch_function__``; where ``func`` is Python of
    ``torch.nn.functional`` or ``torch.functional``, ``mode`` sees the torch functions it calls.

    Its own module's torch-function checks are switched off while it runs (so it does not hand itself back to
    the mode), and the mode is on again; the checks come back when it returns. Torch functions that are
    C++ (most of them) are called as they are.

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
    names = getattr(func, "__globals__", None) if inspect.isfunction(func) else None
    if not any(names is module for module in _PYTHON_LEVEL):
        return func(*args, **kwargs)
    with _patching:
        saved = {name: names[name] for name in _CHECKS if name in names}
        names.update(dict.fromkeys(saved, _never))
        try:
            with mode:
                return func(*args, **kwargs)
        finally:
            names.update(saved)
