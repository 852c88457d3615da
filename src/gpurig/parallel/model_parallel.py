"""Model parallelism: linear layers whose weights are split over the ranks, as in Megatron-LM.

The source's second way to parallelise — "the weights of a layer are split
equally among GPUs, all work on the same mini-batch" — splits a fully connected
layer ``y = x Wᵀ + b`` in one of two ways:

- :class:`ColumnParallelLinear` splits it by **output** features: rank r holds k
  rows of W (k = out_features / ranks) and computes those k outputs for the whole
  batch; the pieces are **stacked** (an allgather) when the next layer needs the
  whole output (``gather_output=True``).
- :class:`RowParallelLinear` splits it by **input** features: rank r holds k
  columns of W and multiplies its k inputs; the partial products are **added**
  (an allreduce), then the bias once.

A column layer feeding a row layer needs no exchange between them: its k outputs
are the row layer's k inputs (``gather_output=False``, ``input_is_parallel=True``;
an activation between them acts on each feature alone). The pair costs one
allreduce forward (the row layer's sum) and one backward (the column layer's
input gradient).

Every exchange is an autograd Function whose backward is its transpose:

=============================  ==========================  =================================
forward                        backward                    used for
=============================  ==========================  =================================
identity                       allreduce (sum)             input of a column layer
allreduce (sum)                identity                    output of a row layer
allgather along features       take my slice               ``gather_output=True``
take my slice of features      allgather along features    ``input_is_parallel=False``
allgather along the batch      reduce-scatter, × ranks     ``input_is_batch_part=True``
take my rows of the batch      allgather, ÷ ranks          ``output_is_batch_part=True``
=============================  ==========================  =================================

The last two rows are Krizhevsky's hybrid scheme (:func:`gpurig.parallelize` with
``hybrid=True``): the layers before the split ones run data-parallel on each
rank's part of the batch, the split layers on the whole batch. The factors keep
data parallelism's convention — each rank's loss is the mean over its own part,
the replicated gradients are averaged — so N ranks compute the same gradients as
one process on the whole batch.

Splits must divide evenly (a ValueError otherwise), as in Megatron-LM: every rank
then holds exactly 1/N of the layer and its optimizer state, and every exchange
moves equal pieces.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gpurig import comm as comm_mod
from gpurig.comm import split_sizes


@dataclass
class ExchangeStats:
    """What the model-parallel exchanges cost so far: calls, bytes this rank sent, seconds spent."""

    calls: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0


class Exchanges:
    """The collectives of model-parallel layers on one communicator, timed and counted.

    ``stats.bytes_sent`` counts what this rank sends with ring algorithms (the
    predictor's terms): an allreduce 2(P−1)/P of the tensor, an allgather or a
    reduce-scatter (P−1)/P of the whole (gathered, or reduced) tensor.

    >>> ex = Exchanges()                           # the job's communicator (here: one rank)
    >>> ex.allreduce_sum(torch.ones(3))
    tensor([1., 1., 1.])
    >>> ex.stats.calls
    1
    """

    def __init__(self, comm: comm_mod.Communicator | None = None):
        self.comm = comm or comm_mod.current()
        self.stats = ExchangeStats()
        # a parallel.timeline.Timeline, or None: an exchange blocks the forward or backward around it, a wait it
        # records (cut out of that phase, named communication as the printed split names it)
        self.timeline = None
        self.in_step = True   # False outside a training step (an evaluation's forward): the timeline keeps steps only

    @property
    def ranks(self) -> int:
        return self.comm.size

    def _count(self, started: float, nbytes: float) -> None:
        ended = time.perf_counter()
        self.stats.calls += 1
        self.stats.bytes_sent += int(nbytes)
        self.stats.seconds += ended - started
        if self.timeline is not None and self.in_step:
            self.timeline.exposed(started, ended)

    def _share(self, tensor: torch.Tensor) -> float:
        """(P−1)/P of the tensor's bytes: what one rank sends in a ring allgather or reduce-scatter."""
        return tensor.numel() * tensor.element_size() * (self.ranks - 1) / self.ranks

    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """A new tensor: the sum of ``tensor`` over all ranks."""
        started, out = time.perf_counter(), tensor.contiguous().clone()
        self.comm.allreduce(out, op="sum")
        self._count(started, 2 * self._share(out))
        return out

    def gather_features(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` stacked along the last dimension (rank order)."""
        started = time.perf_counter()
        out = self.comm.allgather(tensor.movedim(-1, 0).contiguous()).movedim(0, -1)
        self._count(started, self._share(out))
        return out

    def my_features(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's equal slice of the last dimension (no communication)."""
        return tensor.chunk(self.ranks, dim=-1)[self.comm.rank].contiguous()

    def gather_batch(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's part of the batch, concatenated along dim 0 (parts as ``torch.tensor_split`` cuts them)."""
        started = time.perf_counter()
        out = self.comm.allgather(tensor.contiguous())
        self._count(started, self._share(out))
        mine = split_sizes(out.shape[0], self.ranks)[self.comm.rank]
        if tensor.shape[0] != mine:
            raise ValueError(f"rank {self.comm.rank} holds {tensor.shape[0]} rows of a batch of {out.shape[0]}: "
                             f"the parts must be cut as torch.tensor_split cuts them ({mine} here), "
                             "as gpurig.shard does")
        return out

    def reduce_scatter_batch(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of ``tensor``, of which this rank gets its rows (``torch.tensor_split``'s cut)."""
        started = time.perf_counter()
        out = self.comm.reduce_scatter(tensor.contiguous(), op="sum")
        self._count(started, self._share(tensor))
        return out

    def my_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of the batch (``torch.tensor_split``'s cut; no communication)."""
        return torch.tensor_split(tensor, self.ranks)[self.comm.rank].contiguous()


# -- the exchanges as autograd Functions: forward and its transpose -------------------------------------------------

def _exchange(name: str, forward, backward, doc: str) -> type[torch.autograd.Function]:
    """An autograd Function computing ``forward(exchanges, x)``, whose backward is ``backward(exchanges, grad)``."""

    def forward_(ctx, x, ex: Exchanges):
        ctx.ex = ex
        return forward(ex, x)

    def backward_(ctx, grad):
        return backward(ctx.ex, grad), None

    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward_), "backward": staticmethod(backward_), "__doc__": doc})


_CopyToRanks = _exchange(
    "_CopyToRanks", lambda ex, x: x.view_as(x), Exchanges.allreduce_sum,
    "Forward: identity (every rank holds the whole input). Backward: add every rank's partial input gradient.")
_SumOverRanks = _exchange(
    "_SumOverRanks", Exchanges.allreduce_sum, lambda ex, grad: grad,
    "Forward: add the partial products. Backward: identity (each rank's partial gets the whole gradient).")
_GatherFeatures = _exchange(
    "_GatherFeatures", Exchanges.gather_features, Exchanges.my_features,
    "Forward: stack every rank's output features. Backward: keep the gradient of my features.")
_ScatterFeatures = _exchange(
    "_ScatterFeatures", Exchanges.my_features, Exchanges.gather_features,
    "Forward: take my slice of the input features. Backward: stack every rank's slice of the gradient.")
# Each rank's gradient for the whole batch is partial (its share of the split layer): the reduce-scatter adds
# them and hands each rank its rows. The factor P turns "gradient of the mean loss over the whole batch" into
# data parallelism's "gradient of the mean loss over my part", which the data-parallel average divides again.
_GatherBatch = _exchange(
    "_GatherBatch", Exchanges.gather_batch, lambda ex, grad: ex.reduce_scatter_batch(grad).mul_(ex.ranks),
    "Forward: every rank's part of the batch, concatenated. Backward: reduce-scatter, times the rank count.")
# Each rank's loss is the mean over its own rows; the whole batch's loss is their mean, hence the ÷ P.
_ScatterBatch = _exchange(
    "_ScatterBatch", Exchanges.my_rows, lambda ex, grad: ex.gather_batch(grad).div_(ex.ranks),
    "Forward: my rows of the whole batch. Backward: every rank's rows of the gradient, stacked, ÷ rank count.")
_SumAndScatterBatch = _exchange(
    "_SumAndScatterBatch", Exchanges.reduce_scatter_batch, lambda ex, grad: ex.gather_batch(grad).div_(ex.ranks),
    "Forward: the sum of the partial products, my rows only (one reduce-scatter). Backward as _ScatterBatch.")


# -- the layers ------------------------------------------------------------------------------------------------------

class _SplitLinear(nn.Module):
    """What both split layers share: the slice shapes, initialisation, copying from an ``nn.Linear``."""

    split = ""                 # "column" or "row"
    weight_dim = 0             # the weight's dimension that is split
    bias_is_split = True

    def __init__(self, in_features: int, out_features: int, bias: bool, comm, exchanges, device, dtype):
        super().__init__()
        self.exchanges = exchanges or Exchanges(comm)
        ranks = self.exchanges.ranks
        split_features = out_features if self.weight_dim == 0 else in_features
        if split_features % ranks:
            what = "output" if self.weight_dim == 0 else "input"
            raise ValueError(f"{type(self).__name__}: {split_features} {what} features do not split evenly "
                             f"over {ranks} ranks")
        self.in_features, self.out_features = in_features, out_features
        shape = [out_features, in_features]
        shape[self.weight_dim] //= ranks
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(shape, **factory))
        bias_size = out_features // ranks if self.bias_is_split else out_features
        self.bias = nn.Parameter(torch.empty(bias_size, **factory)) if bias else None
        self.reset_parameters()

    @property
    def rank(self) -> int:
        return self.exchanges.comm.rank

    def split_dims(self) -> dict[str, int]:
        """Which dimension of each split parameter is cut over the ranks (the others are whole on every rank).

        >>> ColumnParallelLinear(4, 2 * gpurig.size()).split_dims()
        {'weight': 0, 'bias': 0}
        """
        dims = {"weight": self.weight_dim}
        if self.bias is not None and self.bias_is_split:
            dims["bias"] = 0
        return dims

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation, U(−1/√in, 1/√in) with ``in`` the whole layer's input width.

        Each rank draws its own slice (seeded from torch's generator and the rank,
        so a seeded run repeats itself); a bias that every rank holds whole is the
        same draw on every rank.

        >>> fc = RowParallelLinear(100, 10)
        >>> fc.reset_parameters()
        >>> bool(fc.weight.abs().max() <= 0.1)          # 1/√100: the whole layer's input width
        True
        """
        bound = 1 / math.sqrt(self.in_features)
        seed = int(torch.randint(2**62, (1,)))
        with torch.no_grad():
            _fill_uniform(self.weight, bound, seed + 1 + self.rank)
            if self.bias is not None:
                _fill_uniform(self.bias, bound, seed + (1 + self.rank if self.bias_is_split else 0))

    def copy_slice_from(self, linear: nn.Linear) -> None:
        """Take this rank's slice of an unsplit ``nn.Linear``'s weights.

        >>> fc, row = torch.nn.Linear(4 * gpurig.size(), 3), RowParallelLinear(4 * gpurig.size(), 3)
        >>> row.copy_slice_from(fc)
        >>> torch.equal(row.weight, fc.weight[:, 4 * gpurig.rank(): 4 * gpurig.rank() + 4])
        True
        """
        ranks = self.exchanges.ranks
        with torch.no_grad():
            self.weight.copy_(linear.weight.chunk(ranks, dim=self.weight_dim)[self.rank])
            if self.bias is not None:
                self.bias.copy_(linear.bias.chunk(ranks)[self.rank] if self.bias_is_split else linear.bias)
        self.weight.requires_grad_(linear.weight.requires_grad)
        if self.bias is not None:
            self.bias.requires_grad_(linear.bias.requires_grad)

    @classmethod
    def from_linear(cls, linear: nn.Linear, comm=None, exchanges=None, device=None, **options):
        """The split version of ``linear``, holding this rank's slice of its weights.

        A layer on the meta device (a model too big to build whole) is not copied:
        each rank initialises only its slice, on ``device``.

        >>> fc = torch.nn.Linear(6, 4 * gpurig.size())
        >>> split = ColumnParallelLinear.from_linear(fc)
        >>> torch.equal(split.weight, fc.weight.chunk(gpurig.size())[gpurig.rank()])
        True
        """
        meta = linear.weight.is_meta
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, comm=comm,
                     exchanges=exchanges, device=device if meta else linear.weight.device,
                     dtype=linear.weight.dtype, **options)
        if not meta:
            layer.copy_slice_from(linear)
        return layer

    def _check_width(self, x: torch.Tensor, expected: int, what: str) -> None:
        if x.shape[-1] != expected:
            raise ValueError(f"{type(self).__name__} expects {expected} input features ({what}), got {x.shape[-1]}")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, ranks={self.exchanges.ranks}, this rank's weight {list(self.weight.shape)}")


def _fill_uniform(tensor: torch.Tensor, bound: float, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    if tensor.device.type == "cpu":
        tensor.uniform_(-bound, bound, generator=generator)
    else:  # the generator draws on the CPU; the same numbers whatever the device
        tensor.copy_(torch.empty(tensor.shape, dtype=tensor.dtype).uniform_(-bound, bound, generator=generator))


class ColumnParallelLinear(_SplitLinear):
    """A linear layer split by output features: this rank holds ``out_features / ranks`` rows of the weight.

    ``gather_output=True`` stacks every rank's outputs (an allgather) so the layer
    returns the whole output; ``False`` returns this rank's slice, for a
    :class:`RowParallelLinear` with ``input_is_parallel=True`` to consume. The
    input must be the same on every rank; its gradient is summed over the ranks
    in backward. ``input_is_batch_part=True`` (hybrid) takes each rank's part of the
    batch instead and gathers the whole batch first; ``output_is_batch_part=True``
    returns only this rank's rows of the (gathered) output.

    >>> fc = ColumnParallelLinear(784, 1200)             # 1200 / ranks outputs computed here
    >>> fc(torch.zeros(8, 784)).shape                    # stacked: every rank gets all 1200
    torch.Size([8, 1200])
    """

    split = "column"
    weight_dim = 0
    bias_is_split = True

    def __init__(self, in_features: int, out_features: int, bias: bool = True, gather_output: bool = True,
                 input_is_batch_part: bool = False, output_is_batch_part: bool = False,
                 comm: comm_mod.Communicator | None = None, exchanges: Exchanges | None = None,
                 device=None, dtype=None):
        if output_is_batch_part and not gather_output:
            raise ValueError("ColumnParallelLinear: output_is_batch_part needs gather_output=True")
        super().__init__(in_features, out_features, bias, comm, exchanges, device, dtype)
        self.gather_output = gather_output
        self.input_is_batch_part, self.output_is_batch_part = input_is_batch_part, output_is_batch_part

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_width(x, self.in_features, "the whole input")
        entry = _GatherBatch if self.input_is_batch_part else _CopyToRanks
        y = F.linear(entry.apply(x, self.exchanges), self.weight, self.bias)
        if self.gather_output:
            y = _GatherFeatures.apply(y, self.exchanges)
        if self.output_is_batch_part:
            y = _ScatterBatch.apply(y, self.exchanges)
        return y


class RowParallelLinear(_SplitLinear):
    """A linear layer split by input features: this rank holds ``in_features / ranks`` columns of the weight.

    The partial products of all ranks are added (an allreduce), then the bias
    (whole on every rank) once. ``input_is_parallel=True`` takes this rank's slice
    of the input (a :class:`ColumnParallelLinear`'s ``gather_output=False``
    output); ``False`` takes the whole input and keeps its slice.
    ``output_is_batch_part=True`` (hybrid) adds the partial products with a
    reduce-scatter that hands each rank only its rows of the batch.

    >>> fc = RowParallelLinear(1200, 10)
    >>> fc(torch.zeros(8, 1200)).shape
    torch.Size([8, 10])
    """

    split = "row"
    weight_dim = 1
    bias_is_split = False

    def __init__(self, in_features: int, out_features: int, bias: bool = True, input_is_parallel: bool = False,
                 output_is_batch_part: bool = False, comm: comm_mod.Communicator | None = None,
                 exchanges: Exchanges | None = None, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, comm, exchanges, device, dtype)
        self.input_is_parallel, self.output_is_batch_part = input_is_parallel, output_is_batch_part

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_is_parallel:
            self._check_width(x, self.weight.shape[1], "this rank's slice, from the column layer before it")
        else:
            self._check_width(x, self.in_features, "the whole input")
            x = _ScatterFeatures.apply(x, self.exchanges)
        partial = F.linear(x, self.weight)
        exit_ = _SumAndScatterBatch if self.output_is_batch_part else _SumOverRanks
        y = exit_.apply(partial, self.exchanges)
        return y + self.bias if self.bias is not None else y


SPLIT_LAYERS = {"column": ColumnParallelLinear, "row": RowParallelLinear}
