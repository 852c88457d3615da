"""Which linear layers to split, and how: checking a plan against a model.

A plan names ``nn.Linear`` layers of a model (as ``model.named_modules()`` names
them) and how to split each: ``{"fc1": "column", "fc2": "row"}``.
:func:`resolve_plan` checks it against the model and the rank count and decides
each layer's exchanges:

- a column layer whose next module (in registration order, past activations and
  dropout) is a planned row layer feeds it directly: no gather between them, one
  exchange per direction for the pair, as in Megatron-LM;
- any other column layer gathers its output, any other row layer takes its slice
  of a whole input;
- in a hybrid model the first split layer gathers the batch from all ranks and the
  last one hands each rank its rows back.

Registration order stands for the order of the forward pass (it is, for
``nn.Sequential``). If a custom ``forward`` puts something that mixes features
(a normalisation, a reshape) between a column layer and the row layer registered
after it, register that as a module, or split only one of the two.

:func:`krizhevsky_plan` writes the plan of Krizhevsky's scheme for a model, splitting only
pairs it knows are chained (neighbours in an ``nn.Sequential``); :func:`left_whole`
says why it leaves the other ``nn.Linear`` layers whole, and :func:`check_forward`
runs the model once to confirm that its forward pass calls the split layers that way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

SPLITS = ("column", "row")

# Modules that act on each feature alone: a column layer's slice of outputs may
# pass through them to its row partner without being gathered first.
ELEMENTWISE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish,
               nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Softplus, nn.Dropout, nn.Identity)


class PlanError(ValueError):
    """A plan that cannot be applied to the model: one line, naming the layer and the problem."""


@dataclass(frozen=True)
class SplitLayer:
    """One layer of a checked plan: how it is split and which exchanges it makes (the layer's options)."""

    name: str
    split: str
    gather_output: bool = False         # column: stack the outputs (no row partner follows)
    input_is_parallel: bool = False     # row: the input is its column partner's slice
    input_is_batch_part: bool = False   # hybrid: the first split layer gathers the batch
    output_is_batch_part: bool = False  # hybrid: the last split layer hands each rank its rows

    def options(self) -> dict:
        """Keyword arguments for :class:`ColumnParallelLinear` or :class:`RowParallelLinear`.

        >>> SplitLayer("fc2", "row", input_is_parallel=True).options()
        {'input_is_parallel': True, 'output_is_batch_part': False}
        """
        if self.split == "column":
            return {"gather_output": self.gather_output, "input_is_batch_part": self.input_is_batch_part,
                    "output_is_batch_part": self.output_is_batch_part}
        return {"input_is_parallel": self.input_is_parallel, "output_is_batch_part": self.output_is_batch_part}


def _check_layer(modules: dict[str, nn.Module], name, split, ranks: int) -> None:
    if name not in modules:
        linears = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
        raise PlanError(f"plan: the model has no layer {name!r}; its nn.Linear layers are "
                        f"{', '.join(map(repr, linears)) or 'none'}")
    module = modules[name]
    if not isinstance(module, nn.Linear):
        raise PlanError(f"plan: {name!r} is a {type(module).__name__}, not an nn.Linear: only linear layers can be split")
    if split not in SPLITS:
        raise PlanError(f"plan: {name!r}: unknown split {split!r}; use 'column' (by output features) "
                        f"or 'row' (by input features)")
    features, what = (module.out_features, "output") if split == "column" else (module.in_features, "input")
    if features % ranks:
        raise PlanError(f"plan: {name!r} ({split}) has {features} {what} features, which do not split evenly "
                        f"over {ranks} ranks")


def _is_elementwise(module: nn.Module) -> bool:
    """Whether ``module`` acts on each feature alone (torch's own modules only: a subclass may do anything).

    >>> _is_elementwise(nn.ReLU()), _is_elementwise(nn.LayerNorm(4)), _is_elementwise(nn.PReLU(4))
    (True, False, False)
    """
    if type(module) is nn.PReLU:  # one slope per channel would not fit a slice of the channels
        return module.num_parameters == 1
    return type(module) in ELEMENTWISE


def _next_layer(leaves: list[str], modules: dict[str, nn.Module], name: str) -> str | None:
    """The first module after ``name`` (registration order) that is not elementwise, or None."""
    for following in leaves[leaves.index(name) + 1:]:
        if not _is_elementwise(modules[following]):
            return following
    return None


def resolve_plan(model: nn.Module, plan: Mapping[str, str], ranks: int, hybrid: bool = False) -> list[SplitLayer]:
    """Check ``plan`` against ``model`` and ``ranks``; return its layers, in registration order.

    Raises :class:`PlanError` for a layer that does not exist, is not an
    ``nn.Linear``, has an unknown split or features that do not divide over the
    ranks, a column layer that cannot feed its row partner, or a hybrid plan whose
    first split layer is not a column layer (it must gather the batch).

    >>> net = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 4))
    >>> [(l.name, l.split, l.gather_output, l.input_is_parallel) for l in resolve_plan(net, {"0": "column", "2": "row"}, 2)]
    [('0', 'column', False, False), ('2', 'row', False, True)]
    >>> resolve_plan(net, {"2": "column"}, 3)
    Traceback (most recent call last):
    ...
    gpurig.parallel.layer_plan.PlanError: plan: '2' (column) has 4 output features, which do not split evenly over 3 ranks
    """
    if not isinstance(plan, Mapping) or not plan:
        raise PlanError("plan: empty; name the nn.Linear layers to split, e.g. {'fc1': 'column', 'fc2': 'row'}")
    modules = dict(model.named_modules())
    for name, split in plan.items():
        _check_layer(modules, name, split, ranks)
    leaves = [n for n, m in modules.items() if not any(True for _ in m.children())]
    order = [n for n in modules if n in plan]

    partner: dict[str, str] = {}  # column layer -> the row layer it feeds directly
    for name in order:
        following = _next_layer(leaves, modules, name) if plan[name] == "column" else None
        if following is not None and plan.get(following) == "row":
            column, row = modules[name], modules[following]
            if column.out_features != row.in_features:
                raise PlanError(f"plan: {name!r} (column, {column.out_features} outputs) cannot feed {following!r} "
                                f"(row, {row.in_features} inputs), the layer after it")
            partner[name] = following
    if hybrid and plan[order[0]] != "column":
        raise PlanError(f"plan: hybrid: the first split layer {order[0]!r} is 'row'; it must be 'column' "
                        "(it gathers the batch from all ranks)")

    fed = set(partner.values())
    return [SplitLayer(name, plan[name],
                       gather_output=plan[name] == "column" and name not in partner,
                       input_is_parallel=name in fed,
                       input_is_batch_part=hybrid and name == order[0],
                       output_is_batch_part=hybrid and name == order[-1])
            for name in order]


def krizhevsky_plan(model: nn.Module) -> dict[str, str]:
    """Krizhevsky's "one weird trick": the fully connected layers model-parallel, the rest data-parallel.

    Each ``nn.Linear`` followed in the same ``nn.Sequential`` by another (only
    activations or dropout between them) is paired with it, column → row: one
    exchange per pair and direction. Every other layer stays whole (:func:`left_whole`
    says why): an odd last one, usually the small classifier, is cheaper to repeat
    than to split, and a layer called by a custom ``forward`` may have anything
    between it and the next (a normalisation, a residual add) or not be called as a
    module at all (``nn.MultiheadAttention.out_proj``). Convolutions are never split:
    with ``gpurig.parallelize(..., hybrid=True)`` they run data-parallel.

    >>> from gpurig import models
    >>> krizhevsky_plan(models.mlp())          # 784-1200-1200-10: the 10-way classifier stays whole
    {'1': 'column', '3': 'row'}
    >>> krizhevsky_plan(models.cnn())          # the convolutions are left to data parallelism
    {'8': 'column', '10': 'row'}
    >>> krizhevsky_plan(nn.TransformerEncoderLayer(8, 2))   # its forward calls its layers itself
    {}
    """
    paired = {name for pair in _pairs(model) for name in pair}
    return {name: SPLITS[i % 2] for i, name in enumerate(n for n, _ in model.named_modules() if n in paired)}


def left_whole(model: nn.Module) -> dict[str, str]:
    """The ``nn.Linear`` layers :func:`krizhevsky_plan` does not split, each with why, in registration order.

    >>> left_whole(nn.MultiheadAttention(8, 2))
    {'out_proj': "'out_proj' is used by MultiheadAttention's own forward, not run by an nn.Sequential"}
    >>> from gpurig import models
    >>> left_whole(models.mlp())
    {'5': "'5' has no nn.Linear next to it in its nn.Sequential (only activations or dropout between them)"}
    """
    paired, shared = {name for pair in _pairs(model) for name in pair}, _shared(model)
    return {name: _why_whole(model, name, shared) or (f"{name!r} has no nn.Linear next to it in its nn.Sequential "
                                                     "(only activations or dropout between them)")
            for name, module in model.named_modules() if isinstance(module, nn.Linear) and name not in paired}


def _shared(model: nn.Module) -> set[int]:
    """The ids of modules registered in more than one place, or holding a parameter another module holds too."""
    every = [m for _, m in model.named_modules(remove_duplicate=False)]
    uses = Counter(id(m) for m in every)
    owners = Counter(id(p) for m in every for p in m.parameters(recurse=False))
    return {id(m) for m in every if uses[id(m)] > 1 or any(owners[id(p)] > 1 for p in m.parameters(recurse=False))}


def _why_whole(model: nn.Module, name: str, shared: set[int]) -> str | None:
    """Why the layer ``name`` cannot be one of a pair whatever its neighbours, or None when it can."""
    module = model.get_submodule(name)
    parent = model.get_submodule(name.rpartition(".")[0]) if name else None
    if type(module).forward is not nn.Linear.forward:
        return f"{name!r} is a {type(module).__name__}, whose own forward is not nn.Linear's"
    if parent is None:
        return "the model is one nn.Linear: there is no second layer to pair it with"
    if not isinstance(parent, nn.Sequential) or type(parent).forward is not nn.Sequential.forward:
        return f"{name!r} is used by {type(parent).__name__}'s own forward, not run by an nn.Sequential"
    if id(module) in shared:
        return f"{name!r} shares its module or weights with another part of the model"
    return None


def _pairs(model: nn.Module) -> list[tuple[str, str]]:
    """(column, row) names: each ``nn.Linear`` that can be split, paired with the next one in its ``nn.Sequential``
    when only elementwise modules come between them."""
    pairs, shared = [], _shared(model)
    for prefix, parent in model.named_modules():
        if not isinstance(parent, nn.Sequential):
            continue
        waiting = None
        for child, module in parent.named_children():
            name = f"{prefix}.{child}" if prefix else child
            if isinstance(module, nn.Linear) and _why_whole(model, name, shared) is None:
                if waiting is None:
                    waiting = name
                else:
                    pairs.append((waiting, name))
                    waiting = None
            elif not _is_elementwise(module):
                waiting = None
    return pairs


def check_forward(model: nn.Module, plan: Mapping[str, str], example, hybrid: bool = False) -> None:
    """Run ``model`` on ``example`` once (no gradients) and raise :class:`PlanError` unless its forward pass runs every
    planned layer from the ``nn.Sequential`` holding it — a custom ``forward`` that calls a Sequential's layers
    one by one may put anything between them — and, for ``hybrid``, once each, in registration order (the first
    gathers the batch, the last hands it back).

    >>> class OneByOne(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.body = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4))
    ...     def forward(self, x):
    ...         return self.body[1](torch.layer_norm(self.body[0](x), (8,)))
    >>> check_forward(OneByOne(), {"body.0": "column", "body.1": "row"}, torch.zeros(2, 4))
    Traceback (most recent call last):
    ...
    gpurig.parallel.layer_plan.PlanError: plan: 'body.0' is called by OneByOne's forward, not run by its nn.Sequential 'body': only layers an nn.Sequential runs are split, as pairs
    """
    modules = dict(model.named_modules())
    planned = {id(modules[name]): name for name in plan}
    active, calls, strays = [], [], []

    def before(module, args):
        name = planned.get(id(module))
        if name is not None:
            calls.append(name)
            if not active or active[-1] is not modules[name.rpartition(".")[0]]:
                strays.append((name, f"{type(active[-1]).__name__}'s forward" if active else "code outside the model"))
        active.append(module)

    def after(module, args, output):
        active.pop()  # returns None: a forward hook's return value would replace the output

    handles = [hook for m in modules.values()
               for hook in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for hook in handles:
            hook.remove()
    if strays:
        name, caller = strays[0]
        raise PlanError(f"plan: {name!r} is called by {caller}, not run by its nn.Sequential "
                        f"{name.rpartition('.')[0]!r}: only layers an nn.Sequential runs are split, as pairs")
    order = [name for name in modules if name in plan]
    if set(calls) != set(order) or (hybrid and calls != order):
        missing = [name for name in order if name not in calls]
        raise PlanError(f"plan: the forward pass runs the split layers {calls} where {order} is expected"
                        + (f" ({missing[0]!r} is never called)" if missing else "")
                        + (": hybrid needs each once, in registration order" if hybrid else ""))
