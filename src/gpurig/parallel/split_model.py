"""``gpurig.parallelize``: make an existing torch model model-parallel or hybrid without rewriting it.

::

    model = gpurig.parallelize(model, {"fc1": "column", "fc2": "row"})              # model parallelism
    model = gpurig.parallelize(model, gpurig.krizhevsky_plan(model), hybrid=True)   # Krizhevsky's scheme

On every rank: the plan is checked (a :class:`PlanError` before any
communication); rank 0's weights are broadcast, so N ranks start where one
process would; every planned ``nn.Linear`` is replaced in place by its split
version (:mod:`gpurig.parallel.model_parallel`) holding this rank's slice.

- **Model parallelism** (``hybrid=False``): every rank feeds the same whole
  batch. Layers that are not split are computed by every rank alike and need no
  communication; the split ones exchange activations instead of gradients.
- **Hybrid** (``hybrid=True``): every rank feeds its own part of the batch (as
  with :class:`~gpurig.DataParallel`, e.g. from :func:`gpurig.shard`) and computes
  its loss on its own rows. The layers before the first split one (the
  convolutions) run data-parallel on that part; the first split layer gathers the
  whole batch's activations, the split layers run on the whole batch, and the
  last one hands each rank its rows back. The parameters that are not split are
  averaged over the ranks by ``gpurig.DataParallel``; a split layer's are not (each
  rank owns its slice).

Either way N ranks compute the gradients that one process computes on the whole
batch. A model too big for one device can be built on the meta device
(``with torch.device("meta"): model = ...``): split layers are then created at
their slice's size, so no rank ever holds them whole.
"""

from __future__ import annotations

import torch
from torch import nn

from gpurig import comm as comm_mod
from gpurig.parallel.data_parallel import CommStats, DataParallel, _broadcast_tensors, check_same_model
from gpurig.parallel.model_parallel import SPLIT_LAYERS, Exchanges
from gpurig.parallel.layer_plan import PlanError, resolve_plan


def _owner(parameter_name: str) -> str:
    return parameter_name.rpartition(".")[0]


def _materialize(model: nn.Module, skip: set[str], device: torch.device) -> None:
    """Allocate and initialise (``reset_parameters``) modules built on the meta device, except ``skip``."""
    for name, module in model.named_modules():
        if name in skip:
            continue
        own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        if any(t.is_meta for t in own):
            if not hasattr(module, "reset_parameters"):
                raise PlanError(f"cannot initialise {name!r} ({type(module).__name__}): it was built on the meta "
                                "device and has no reset_parameters()")
            module.to_empty(device=device, recurse=False)
            module.reset_parameters()


class _Replicated(nn.Module):
    """The parameters and buffers every rank holds whole, as one module for DataParallel to average.

    DataParallel averages the gradients of its module's parameters only, so a
    hybrid model's split slices (different on every rank) stay out of it. Its
    forward runs the whole model: DataParallel's forward first copies rank 0's
    buffers (BatchNorm statistics), as it does for any model.
    """

    def __init__(self, params: list[nn.Parameter], buffers: list[torch.Tensor]):
        super().__init__()
        self.params = nn.ParameterList(params)
        for i, buffer in enumerate(buffers):
            self.register_buffer(f"buffer{i}", buffer)

    def forward(self, model: nn.Module, *args, **kwargs):
        return model(*args, **kwargs)


class ModelParallel(nn.Module):
    """A model with some of its linear layers split over the ranks; made by :func:`parallelize`.

    Train it like any model: ``torch.optim.SGD(model.parameters(), ...)`` sees this
    rank's slices and the whole replicated layers. ``state_dict()`` is this rank's
    (slices); :meth:`full_state_dict` gathers the unsplit model's.

    >>> net = gpurig.parallelize(torch.nn.Sequential(torch.nn.Linear(4, 2 * gpurig.size())), {"0": "column"})
    >>> net.split_dims                                  # what is cut over the ranks, and along which dimension
    {'0.weight': 0, '0.bias': 0}
    """

    def __init__(self, module: nn.Module, split_dims: dict[str, int], exchanges: Exchanges, hybrid: bool,
                 data_parallel: DataParallel | None):
        super().__init__()
        self.module = module
        self.hybrid = hybrid
        self.data_parallel = data_parallel
        self.exchanges = exchanges
        self.split_dims = split_dims   # parameter name -> dimension cut over the ranks
        self._own = CommStats()
        self._inputs_checked = hybrid or exchanges.ranks == 1

    @property
    def comm(self) -> comm_mod.Communicator:
        return self.exchanges.comm

    def forward(self, *args, **kwargs):
        if not self._inputs_checked:
            self._check_same_input(args)
        before = (self.exchanges.stats.bytes_sent, self.exchanges.stats.seconds)
        self.exchanges.in_step = torch.is_grad_enabled()   # a step's exchanges: to its backward's end (below)
        if self.data_parallel is not None:
            out = self.data_parallel(self.module, *args, **kwargs)
        else:
            out = self.module(*args, **kwargs)
        if torch.is_grad_enabled() and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: self._on_backward_start(before))
        return out

    def _check_same_input(self, args) -> None:
        """Model parallelism needs the same batch on every rank: compare a fingerprint once."""
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if x is None:
            return
        mine = torch.tensor([[x.numel(), x.double().sum().item(), x.double().abs().sum().item()]], dtype=torch.float64)
        everyone = self.comm.allgather(mine)
        self._inputs_checked = True
        if not torch.equal(everyone, mine.expand_as(everyone)):
            raise ValueError("model parallelism needs the same input on every rank, and the ranks' inputs differ: "
                             "feed the whole batch everywhere, or use hybrid=True to feed each rank its part")

    def _on_backward_start(self, before) -> None:
        def finish_step():
            seconds = self.exchanges.stats.seconds - before[1]
            self._own.steps += 1
            self._own.bytes_sent += self.exchanges.stats.bytes_sent - before[0]
            self._own.exposed_s += seconds
            self._own.last_exposed_s = seconds
            self.exchanges.in_step = False

        torch.autograd.Variable._execution_engine.queue_callback(finish_step)

    @property
    def stats(self) -> CommStats:
        """Communication of the training steps so far, in DataParallel's terms (exchanges block, so all is exposed).

        >>> net = gpurig.parallelize(torch.nn.Sequential(torch.nn.Linear(4, 2 * gpurig.size())), {"0": "column"})
        >>> net(torch.ones(3, 4)).sum().backward()
        >>> net.stats.steps
        1
        """
        dp = self.data_parallel.stats if self.data_parallel is not None else CommStats()
        return CommStats(steps=self._own.steps, bytes_sent=self._own.bytes_sent + dp.bytes_sent,
                         exposed_s=self._own.exposed_s + dp.exposed_s,
                         last_exposed_s=self._own.last_exposed_s + dp.last_exposed_s)

    # -- state: this rank's slices, or the whole model ---------------------------------------------------------------
    def state_dict(self, *args, **kwargs):
        """This rank's state dict (split layers hold their slices), without a ``module.`` prefix."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load a state dict of this rank's slices, as :meth:`state_dict` returns it (for a whole one: load it
        into the unsplit model before :func:`parallelize`)."""
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def _gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        return self.comm.allgather(tensor.movedim(dim, 0).contiguous()).movedim(0, dim).contiguous()

    def _slice(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        return tensor.chunk(self.comm.size, dim=dim)[self.comm.rank].clone()

    def full_state_dict(self) -> dict:
        """The unsplit model's state dict, split weights gathered from all ranks (call on every rank).

        It loads into the original, unsplit model.

        >>> net = gpurig.parallelize(torch.nn.Sequential(torch.nn.Linear(3, 2 * gpurig.size())), {"0": "column"})
        >>> {k: list(v.shape) for k, v in net.full_state_dict().items()} == {"0.weight": [2 * gpurig.size(), 3], "0.bias": [2 * gpurig.size()]}
        True
        """
        state = self.module.state_dict()
        for name, dim in self.split_dims.items():
            state[name] = self._gather(state[name], dim)
        return state

    def _map_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict, convert) -> dict:
        names = {id(p): n for n, p in self.module.named_parameters()}
        state = {"state": dict(state["state"]), "param_groups": state["param_groups"]}
        for saved, live in zip(state["param_groups"], optimizer.param_groups):
            for index, param in zip(saved["params"], live["params"]):
                dim = self.split_dims.get(names.get(id(param)))
                if dim is not None and index in state["state"]:
                    state["state"][index] = {k: convert(v, dim) if isinstance(v, torch.Tensor) and v.dim() == param.dim() else v
                                             for k, v in state["state"][index].items()}
        return state

    def full_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """``optimizer.state_dict()`` with split parameters' state (momentum, ...) gathered whole (call on every rank).

        :meth:`local_optimizer_state` cuts it again, for any rank count that divides the layers.

        >>> net = gpurig.parallelize(torch.nn.Sequential(torch.nn.Linear(4, 2 * gpurig.size())), {"0": "column"})
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        >>> net(torch.ones(1, 4)).sum().backward(); opt.step()
        >>> full = net.full_optimizer_state(opt)
        >>> list(full["state"][0]["momentum_buffer"].shape) == [2 * gpurig.size(), 4]     # the whole weight's
        True
        >>> opt.load_state_dict(net.local_optimizer_state(opt, full))                    # this rank's part again
        """
        return self._map_optimizer_state(optimizer, optimizer.state_dict(), self._gather)

    def local_optimizer_state(self, optimizer: torch.optim.Optimizer, full_state: dict) -> dict:
        """This rank's part of a state from :meth:`full_optimizer_state`, for ``optimizer.load_state_dict``."""
        return self._map_optimizer_state(optimizer, full_state, self._slice)


def parallelize(model: nn.Module, plan: dict[str, str], comm: comm_mod.Communicator | None = None,
                hybrid: bool = False, bucket_cap_mb: float | None = None, compression: str = "none",
                nonfinite: str = "stop") -> ModelParallel:
    """Split the linear layers ``plan`` names over the ranks, in place; return the model, ready to train.

    ``plan`` maps layer names (``model.named_modules()``) to ``"column"`` (split by
    output features) or ``"row"`` (by input features); see
    :func:`gpurig.parallel.layer_plan.resolve_plan` for how neighbours are chained, and
    :func:`gpurig.krizhevsky_plan` for a plan made for you. ``hybrid=True`` runs the
    layers before the first split one data-parallel on each rank's part of the
    batch (``bucket_cap_mb``, ``compression`` and ``nonfinite`` go to its ``DataParallel``).
    A bad plan raises :class:`PlanError` on every rank, before any communication.

    >>> import gpurig, torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(784, 1200), torch.nn.ReLU(), torch.nn.Linear(1200, 10))
    >>> net = gpurig.parallelize(net, {"0": "column", "2": "row"})
    >>> net(torch.zeros(64, 784)).shape                   # every rank: the whole batch, the whole output
    torch.Size([64, 10])
    >>> gpurig.parallelize(torch.nn.Sequential(torch.nn.Linear(4, 4)), {"fc1": "column"})
    Traceback (most recent call last):
    ...
    gpurig.parallel.layer_plan.PlanError: plan: the model has no layer 'fc1'; its nn.Linear layers are '0'
    """
    comm = comm or comm_mod.current()
    layers = resolve_plan(model, plan, comm.size, hybrid=hybrid)
    split_names = {layer.name for layer in layers}
    if comm.size > 1:
        check_same_model(comm, model)
    _materialize(model, split_names, comm.device)

    # Rank 0's weights everywhere (a hybrid model's DataParallel broadcasts the layers that are not split).
    broadcast = [p for n, p in model.named_parameters() if (_owner(n) in split_names or not hybrid) and not p.is_meta]
    _broadcast_tensors(comm, [p.data for p in broadcast] + ([] if hybrid else list(model.buffers())))

    exchanges = Exchanges(comm)
    split_dims: dict[str, int] = {}
    for layer in layers:
        original = model.get_submodule(layer.name)
        split = SPLIT_LAYERS[layer.split].from_linear(original, exchanges=exchanges, device=comm.device,
                                                      **layer.options())
        if layer.name:
            model.set_submodule(layer.name, split)
        else:
            model = split
        prefix = f"{layer.name}." if layer.name else ""
        split_dims.update({prefix + param: dim for param, dim in split.split_dims().items()})

    data_parallel = None
    replicated = [p for n, p in model.named_parameters() if n not in split_dims]
    if hybrid and any(p.requires_grad for p in replicated):  # all not cut over the ranks is averaged (a row bias too)
        data_parallel = DataParallel(_Replicated(replicated, list(model.buffers())), comm,
                                     bucket_cap_mb=bucket_cap_mb, compression=compression, nonfinite=nonfinite)
    elif hybrid:  # every layer that trains is split (a LLaMA-style MLP without biases): nothing to average
        _broadcast_tensors(comm, [p.data for p in replicated] + list(model.buffers()))
    return ModelParallel(model, split_dims, exchanges, hybrid, data_parallel)
