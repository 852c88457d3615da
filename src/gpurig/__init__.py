"""gpurig: build, measure, predict and run multi-GPU deep learning.

The library is what ``gpurig train`` itself uses::

    import gpurig
    comm = gpurig.init()                       # engine + rank from the launcher's environment
    model = gpurig.DataParallel(model)         # gradients averaged over all ranks during backward
    for x, y in gpurig.shard((X, Y), global_batch=256):   # each rank its part of every global batch
        ...
    model = gpurig.parallelize(model, {"fc1": "column", "fc2": "row"})   # or split layers over the ranks
    with gpurig.timeline("trace.json"): ...   # a Chrome trace of every rank's steps (Perfetto opens it)

Heavy imports (torch, mpi4py) happen on first use, so ``gpurig --help`` stays fast.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "init": "gpurig.comm",
    "shutdown": "gpurig.comm",
    "Communicator": "gpurig.comm",
    "Handle": "gpurig.comm",
    "CollectiveMismatchError": "gpurig.comm",
    "DataParallel": "gpurig.parallel",
    "ModelMismatchError": "gpurig.parallel",
    "NonFiniteGradientError": "gpurig.parallel",
    "BatchSizeWarning": "gpurig.parallel",
    "shard": "gpurig.parallel",
    "parallelize": "gpurig.parallel",
    "krizhevsky_plan": "gpurig.parallel",
    "ColumnParallelLinear": "gpurig.parallel",
    "RowParallelLinear": "gpurig.parallel",
    "PlanError": "gpurig.parallel",
    "parameter_bytes": "gpurig.parallel",
    "MixedPrecision": "gpurig.parallel",
    "ZeroRedundancyOptimizer": "gpurig.parallel",
    "timeline": "gpurig.parallel.timeline",
    "Timeline": "gpurig.parallel.timeline",
    # Horovod's names, so that a Horovod script runs with `import gpurig as hvd`
    "DistributedOptimizer": "gpurig.parallel.horovod",
    "broadcast_parameters": "gpurig.parallel.horovod",
    "broadcast_optimizer_state": "gpurig.parallel.horovod",
    "allreduce": "gpurig.parallel.horovod",
    "broadcast": "gpurig.parallel.horovod",
    "Compression": "gpurig.parallel.horovod",
    "Average": "gpurig.parallel.horovod",
    "Sum": "gpurig.parallel.horovod",
    "Adasum": "gpurig.parallel.horovod",
}


# Modules of the API under a short name: gpurig.hooks.int8 is PyTorch DDP's communication hook with int8 gradients.
_LAZY_MODULES = {"hooks": "gpurig.parallel.ddp_hooks"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(_LAZY_MODULES[name])
    raise AttributeError(f"module 'gpurig' has no attribute {name!r}")


def rank() -> int:
    """This process's rank in the job (Horovod's ``hvd.rank()``).

    >>> import gpurig; gpurig.rank()
    0
    """
    return importlib.import_module("gpurig.comm").current().rank


def size() -> int:
    """Number of ranks in the job (``hvd.size()``)."""
    return importlib.import_module("gpurig.comm").current().size


def local_rank() -> int:
    """This process's rank among the ranks on its machine (``hvd.local_rank()``)."""
    return importlib.import_module("gpurig.comm").current().local_rank


def local_size() -> int:
    """Number of ranks on this machine (``hvd.local_size()``)."""
    return importlib.import_module("gpurig.comm").current().local_size


__all__ = sorted([*_LAZY, *_LAZY_MODULES, "rank", "size", "local_rank", "local_size", "__version__"])
