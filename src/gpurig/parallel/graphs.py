"""A codec's many small GPU kernels, replayed as one CUDA graph.

On a GPU, a codec's encode with error feedback is a dozen small kernels (int8)
to some thirty (int8-dynamic's nearest code), each dispatched from Python: for a
bucket of a few MB the dispatch, not the arithmetic, is what it costs
(docs/benchmarks.md, "Codecs on the GPU"). The buffers a bucket is encoded from
and into are the same step after step, so :func:`run` captures the second call
with the same buffers into a CUDA graph and replays it from then on: one launch,
the same kernels, the same bits. A call that cannot be captured (one that waits
on the host, say) stays eager. On a CPU, or with ``GPURIG_CUDA_GRAPHS=0``, every
call is the plain function.

Graphs share one memory pool per device: they are replayed one at a time on
the caller's stream, and each one's temporaries are dead when it ends.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from typing import Callable

import torch

CAPACITY = 256  # graphs kept (LRU): a bucket's pieces × the calls per piece, for a model's buckets
_lock = threading.Lock()
_graphs: OrderedDict = OrderedDict()  # key → CUDAGraph, or None: seen once (warm-up) / cannot be captured
_uncapturable: set = set()
_pools: dict = {}
_enabled = os.environ.get("GPURIG_CUDA_GRAPHS", "1") != "0"


def enabled() -> bool:
    """Whether CUDA tensors' codec calls are replayed as graphs (``GPURIG_CUDA_GRAPHS=0`` turns it off).

    >>> isinstance(enabled(), bool)
    True
    """
    return _enabled


@contextlib.contextmanager
def eager():
    """Within the block, every call runs as plain kernels (to time against the graphs).

    >>> with eager():
    ...     enabled()
    False
    """
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


def _key(fn: Callable, args: tuple):
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append((a.data_ptr(), a.shape, a.stride(), a.dtype))
        elif isinstance(a, (tuple, list)):
            parts.append(_key(None, tuple(a)))
        else:
            parts.append(a)
    return fn, threading.get_ident(), tuple(parts)


def _device(args: tuple) -> torch.device | None:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device if a.is_cuda else None
        if isinstance(a, (tuple, list)):
            return _device(tuple(a))
    return None


def run(fn: Callable, *args) -> None:
    """``fn(*args)``; on CUDA tensors seen before with the same buffers, as a replayed graph.

    ``fn`` must return nothing and touch only its arguments' buffers (and caches
    that stay put), as the codecs' in-place kernels do. The first call runs
    eagerly (it also warms up what ``fn`` allocates once), the second is
    captured and replayed, later ones replayed.

    >>> x = torch.ones(4)
    >>> run(torch.Tensor.mul_, x, 2.0); x     # a CPU tensor: just the call
    tensor([2., 2., 2., 2.])
    """
    device = _device(args) if _enabled else None
    if device is None:
        fn(*args)
        return
    key = _key(fn, args)
    with _lock:
        graph = _graphs.get(key)
        seen = key in _graphs
        if seen:
            _graphs.move_to_end(key)
    if graph is not None:
        graph.replay()
        return
    if not seen or key in _uncapturable:
        fn(*args)
        _remember(key, None)
        return
    graph = _capture(fn, args, device)
    if graph is None:
        _uncapturable.add(key)
        fn(*args)
        return
    _remember(key, graph)
    graph.replay()  # capturing records the kernels, it does not run them


def _remember(key, graph) -> None:
    with _lock:
        _graphs[key] = graph
        while len(_graphs) > CAPACITY:
            _graphs.popitem(last=False)


def _capture(fn: Callable, args: tuple, device: torch.device):
    """A graph of ``fn(*args)``'s kernels, or None where they cannot be captured."""
    if device not in _pools:
        _pools[device] = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    try:
        with torch.cuda.stream(side):
            # thread_local: another thread's CUDA calls (a communication thread's copies) do not break the capture
            with torch.cuda.graph(graph, pool=_pools[device], stream=side, capture_error_mode="thread_local"):
                fn(*args)
    except RuntimeError:
        return None
    torch.cuda.current_stream(device).wait_stream(side)
    return graph


def clear() -> None:
    """Forget every graph (their memory goes back to the pool when nothing else holds it).

    >>> clear()
    """
    with _lock:
        _graphs.clear()
        _uncapturable.clear()
