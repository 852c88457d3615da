"""Horovod's PyTorch API on gpurig: a Horovod script runs with ``import gpurig as hvd``, under ``gpurig run``.

    import gpurig as hvd
    hvd.init()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()       # gradients averaged in buckets while backward runs
        optimizer.step()

``DistributedOptimizer`` wraps the optimizer's parameters in a :class:`~gpurig.parallel.DataParallel` (the
same buckets, overlap, compression, collective and numerical checks) and keeps the optimizer the user made, of
its own class (a learning-rate scheduler still takes it): when ``backward()`` returns, every gradient is the
ranks' average. So ``synchronize()`` has nothing left to wait for and ``skip_synchronize()`` nothing to skip; both
are there for scripts that clip gradients between backward and step, as Horovod's documentation shows.

What Horovod has and this does not: ``op=hvd.Sum`` or ``hvd.Adasum``, ``backward_passes_per_step`` above 1 (use
``gpurig.DataParallel`` and its ``no_sync()`` to accumulate), process sets; each is refused in one line.
"""

from __future__ import annotations

import contextlib
import io
import re

import torch

from gpurig import comm as comm_mod

Average, Sum, Adasum = "average", "sum", "adasum"   # hvd.Average, hvd.Sum, hvd.Adasum


class Compression:
    """Horovod's gradient compression names: ``hvd.Compression.none`` and ``hvd.Compression.fp16`` (gpurig's
    ``int8``, ``int8-dynamic``, ``powersgd`` and ``auto`` may be given as strings too).

    >>> Compression.fp16
    'fp16'
    """

    none = "none"
    fp16 = "fp16"


class _Parameters(torch.nn.Module):
    """The optimizer's parameters as a module for DataParallel to wrap, named as the script named them."""

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]]):
        super().__init__()
        for name, parameter in named:
            self.register_parameter(re.sub(r"\W", "_", name) or "_", parameter)


class _Synchronized:
    """Mixed into the optimizer's own class: :func:`DistributedOptimizer`'s methods beside the optimizer's."""

    def synchronize(self) -> None:
        """Horovod waits here for the gradients' allreduce; gpurig's is done when ``backward()`` returns."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's ``with optimizer.skip_synchronize(): optimizer.step()`` after a :meth:`synchronize`."""
        yield


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None, compression: str = Compression.none,
                         backward_passes_per_step: int = 1, op: str = Average, comm=None,
                         bucket_cap_mb: float | None = None) -> torch.optim.Optimizer:
    """``optimizer``, its parameters' gradients averaged over the ranks during each backward (Horovod's
    ``hvd.DistributedOptimizer``). Every rank must call it, with the same parameters in the same order.

    >>> optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
    ...                                  named_parameters=model.named_parameters())   # doctest: +SKIP
    """
    from gpurig.parallel.data_parallel import DataParallel

    if op != Average:
        raise ValueError(f"DistributedOptimizer: op={op!r}: gpurig averages gradients (hvd.Average); for a sum, "
                         "scale the loss by the number of ranks")
    if backward_passes_per_step != 1:
        raise ValueError(f"DistributedOptimizer: backward_passes_per_step={backward_passes_per_step}: to accumulate "
                         "gradients, wrap the model in gpurig.DataParallel and run the first passes under no_sync()")
    if isinstance(optimizer, _Synchronized):
        raise ValueError("DistributedOptimizer: this optimizer is a DistributedOptimizer already")
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if named_parameters is None:
        named = [(f"param_{i}", p) for i, p in enumerate(params)]
    else:
        names = {id(p): name for name, p in named_parameters}
        unnamed = sum(id(p) not in names for p in params)
        if unnamed:
            raise ValueError(f"DistributedOptimizer: named_parameters names {len(names)} tensors but {unnamed} of the "
                             "optimizer's parameters are not among them: give model.named_parameters() of the model "
                             "the optimizer trains")
        named = [(names[id(p)], p) for p in params]
    model = DataParallel(_Parameters(named), comm=comm, compression=compression, broadcast_buffers=False,
                         bucket_cap_mb=bucket_cap_mb)
    base = type(optimizer)
    optimizer.__class__ = type(base.__name__, (_Synchronized, base), {"__module__": base.__module__})
    optimizer.gpurig_model = model   # the DataParallel doing the averaging (its stats, compression choice)
    return optimizer


def broadcast_parameters(params, root_rank: int = 0, comm=None) -> None:
    """Overwrite every tensor of ``params`` (a ``state_dict()``, or ``named_parameters()``' pairs) with rank
    ``root_rank``'s, in place (Horovod's ``hvd.broadcast_parameters``). Every rank must call it.

    >>> broadcast_parameters(model.state_dict(), root_rank=0)   # doctest: +SKIP
    """
    comm = comm or comm_mod.current()
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    with torch.no_grad():
        for name, tensor in items:
            if not isinstance(tensor, torch.Tensor):
                continue
            whole = tensor.data if tensor.is_contiguous() else tensor.contiguous()
            comm.broadcast(whole, root=root_rank, name=f"broadcast_parameters {name}")
            if whole.data_ptr() != tensor.data_ptr():
                tensor.copy_(whole)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0, comm=None) -> None:
    """Give every rank rank ``root_rank``'s optimizer state and hyperparameters (learning rates, momenta,
    step counts), as Horovod's ``hvd.broadcast_optimizer_state``. Every rank must call it.

    >>> broadcast_optimizer_state(optimizer, root_rank=0)   # doctest: +SKIP
    """
    comm = comm or comm_mod.current()
    data = b""
    if comm.rank == root_rank:
        buffer = io.BytesIO()
        torch.save(optimizer.state_dict(), buffer)
        data = buffer.getvalue()
    state = comm.allgather_bytes(data, name="broadcast_optimizer_state")[root_rank]
    if comm.rank != root_rank:
        optimizer.load_state_dict(torch.load(io.BytesIO(state), weights_only=True))


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: str | None = None,
              comm=None) -> torch.Tensor:
    """The ranks' average (or, ``op=Sum`` / ``average=False``, sum) of ``tensor`` as a new tensor; ``tensor`` is
    left as it was (Horovod's ``hvd.allreduce``; ``gpurig.init().allreduce`` works in place).

    >>> allreduce(torch.tensor([float(rank())]))   # doctest: +SKIP
    tensor([0.5000])
    """
    if op is None:
        op = Sum if average is False else Average
    if op not in (Average, Sum):
        raise ValueError(f"allreduce: op={op!r}: gpurig has hvd.Average and hvd.Sum")
    return (comm or comm_mod.current()).allreduce(tensor.detach().clone(), op=op, name=name)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None, comm=None) -> torch.Tensor:
    """Rank ``root_rank``'s ``tensor`` as a new tensor on every rank (Horovod's ``hvd.broadcast``).

    >>> broadcast(torch.tensor([rank()]), root_rank=0)   # doctest: +SKIP
    tensor([0])
    """
    return (comm or comm_mod.current()).broadcast(tensor.detach().clone(), root=root_rank, name=name)
