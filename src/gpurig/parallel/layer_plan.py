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

:func:`krizhevsky_plan` writes the plan of Krizhevsky's scheme for any model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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


def _next_layer(leaves: list[str], modules: dict[str, nn.Module], name: str) -> str | None:
    """The first module after ``name`` (registration order) that is not elementwise, or None."""
    for following in leaves[leaves.index(name) + 1:]:
        if not isinstance(modules[following], ELEMENTWISE):
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

    Every ``nn.Linear``, in registration order, paired column → row (one
    exchange per pair and direction); an odd last one stays whole: usually the
    small classifier, cheaper to repeat than to split. Convolutions are never
    split: with ``gpurig.parallelize(..., hybrid=True)`` they run data-parallel.

    >>> from gpurig import models
    >>> krizhevsky_plan(models.mlp())          # 784-1200-1200-10: the 10-way classifier stays whole
    {'1': 'column', '3': 'row'}
    >>> krizhevsky_plan(models.cnn())          # the convolutions are left to data parallelism
    {'8': 'column', '10': 'row'}
    """
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    pairs = len(linears) // 2
    return {name: SPLITS[i % 2] for i, name in enumerate(linears[: 2 * pairs])}
