"""Each rank's part of every global batch.

Data parallelism splits the global mini-batch over the ranks (128 on 4 GPUs →
32 each, in the source). All ranks draw the same shuffled order from the same
seed and epoch, then each takes its slice, so together they see every sample of
the global batch exactly once.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping, Sequence

import torch

from gpurig import comm as comm_mod


def _users_level() -> int:
    """The ``stacklevel`` that makes a warning name the user's line: the first caller outside gpurig's package.

    >>> _users_level()      # called from outside gpurig: the line that called it
    1
    """
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


class BatchSizeWarning(UserWarning):
    """The per-rank batch is too small or oddly sized for the GPU's matrix tiles."""


def per_rank_batches(global_batch: int, size: int) -> list[int]:
    """How a global batch splits over ``size`` ranks; an error if a rank would get nothing.

    >>> per_rank_batches(128, 4)
    [32, 32, 32, 32]
    >>> per_rank_batches(3, 4)
    Traceback (most recent call last):
    ...
    ValueError: a global batch of 3 over 4 ranks leaves 1 rank(s) with no samples: use a global batch of at least 4
    """
    if global_batch < 1:
        raise ValueError(f"the global batch must be at least 1, got {global_batch}")
    sizes = comm_mod.split_sizes(global_batch, size)
    empty = sizes.count(0)
    if empty:
        raise ValueError(f"a global batch of {global_batch} over {size} ranks leaves {empty} rank(s) with no samples: "
                         f"use a global batch of at least {size}")
    return sizes


def tile_advice(per_rank: int) -> str | None:
    """The source's rule for a per-GPU batch, or None when the batch follows it.

    cuBLAS computes in 64×128 tiles and threads start in warps of 32: per-GPU
    batches should be multiples of 32 (better 64) and not below 64.

    >>> tile_advice(64) is None
    True
    >>> tile_advice(16)
    'per-rank batch 16 is below 64: each GPU gets too little work per step (a global batch of 128 over 8 GPUs leaves them idle)'
    """
    if per_rank < 64:
        return (f"per-rank batch {per_rank} is below 64: each GPU gets too little work per step "
                f"(a global batch of 128 over 8 GPUs leaves them idle)")
    if per_rank % 32:
        return f"per-rank batch {per_rank} is not a multiple of 32: the matrix tiles (a GPU's 64 × 128) run partly empty"
    return None


def _slice(batch, rank: int, size: int):
    if isinstance(batch, torch.Tensor):
        if not batch.dim():
            raise ValueError("shard(): a batch holds a 0-dim tensor, so it is one sample, not a batch: give the "
                             "samples with global_batch= to batch them")
        return torch.tensor_split(batch, size)[rank]
    if isinstance(batch, Mapping):
        return type(batch)({k: _slice(v, rank, size) for k, v in batch.items()})
    if isinstance(batch, (tuple, list)):
        return type(batch)(_slice(v, rank, size) for v in batch)
    raise TypeError(f"cannot split a batch of type {type(batch).__name__}: use tensors, tuples, lists or dicts")


def _batch_len(batch) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else 1
    if isinstance(batch, Mapping) and batch:
        return _batch_len(next(iter(batch.values())))
    if isinstance(batch, (tuple, list)) and batch:
        return _batch_len(batch[0])
    raise TypeError(f"cannot split a batch of type {type(batch).__name__}: use tensors, tuples, lists or dicts")


def _tensor_mapping(data) -> bool:
    return isinstance(data, Mapping) and bool(data) and all(isinstance(v, torch.Tensor) for v in data.values())


def _samples(data) -> bool:
    """Whether ``data`` is a map-style dataset of samples (indexable, with a length): a list of (x, y) pairs, a
    torchvision dataset; not a DataLoader (which makes its own batches)."""
    if isinstance(data, (str, bytes, Mapping, torch.utils.data.DataLoader)):
        return False
    return hasattr(data, "__getitem__") and hasattr(data, "__len__") and len(data) > 0


class Shard:
    """This rank's batches; see :func:`shard`."""

    def __init__(self, data, global_batch: int | None, comm: comm_mod.Communicator | None,
                 shuffle: bool, seed: int, drop_last: bool, split: bool = True):
        self.comm = comm or comm_mod.current()
        # (which part, of how many): every rank the whole batch when not split
        self.part, self.parts = (self.comm.rank, self.comm.size) if split else (0, 1)
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self.keys = list(data) if _tensor_mapping(data) else None  # a dict of tensors: batches are dicts too
        self.tensors = self._as_tensors(data)
        # samples: a map-style dataset (a list of (x, y) pairs, a torchvision dataset), collated per rank
        self.samples = data if self.tensors is None and global_batch is not None and _samples(data) else None
        self.batches = None if self.tensors is not None or self.samples is not None else data
        self.global_batch = global_batch
        if self.tensors is not None or self.samples is not None:
            if global_batch is None:
                raise ValueError("shard() of tensors needs global_batch=")
            sizes = per_rank_batches(global_batch, self.parts)
            self.per_rank = sizes[self.part]
            if not len(self):
                raise ValueError(f"shard(): {self._count()} samples make no global batch of {global_batch}"
                                 f"{' with a sample for each rank' if not drop_last else ''}: use a smaller "
                                 f"global_batch{', or drop_last=False' if drop_last else ''}")
            self._warn(sizes)
            self._warn_last()
        elif isinstance(data, (str, bytes, torch.Tensor)) or not hasattr(data, "__iter__"):
            raise TypeError(f"shard() takes tensors, a dict of tensors, a dataset of samples with global_batch=, or "
                            f"an iterable of batches (a DataLoader), not {type(data).__name__}")
        elif isinstance(data, Sequence) and not data:
            raise ValueError("shard() got no data (an empty sequence)")
        elif global_batch is not None:
            raise ValueError(f"shard(): a {type(data).__name__} of batches is already batched: leave out "
                             f"global_batch= (each batch is split over the ranks)")
        self._warned = self.batches is None

    @staticmethod
    def _as_tensors(data):
        if isinstance(data, torch.utils.data.TensorDataset):
            return tuple(data.tensors)
        if isinstance(data, torch.Tensor):
            return (data,)
        if _tensor_mapping(data):
            data = list(data.values())
        if isinstance(data, Sequence) and data and all(isinstance(t, torch.Tensor) for t in data):
            if len({t.shape[0] for t in data}) != 1:
                raise ValueError("shard(): all tensors must have the same number of samples (first dimension)")
            return tuple(data)
        return None

    def _warn(self, sizes: list[int]) -> None:
        # the tile rule is a GPU's: CPU ranks (a small experiment, a test) are not told it at every run
        advice = tile_advice(min(sizes)) if torch.cuda.is_available() else None
        if len(set(sizes)) > 1:
            # DataParallel averages the ranks' gradients with equal weights, as DDP and Horovod do: with unequal
            # parts that is not the mean over the global batch
            advice = (f"a global batch of {sum(sizes)} splits unevenly over {len(sizes)} ranks ({max(sizes)} and "
                      f"{min(sizes)} samples): the ranks' gradients are averaged with equal weights, so a step is not "
                      f"the global batch's mean; use a multiple of {len(sizes)}")
        if advice and self.comm.rank == 0:
            warnings.warn(advice, BatchSizeWarning, stacklevel=_users_level())

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shuffled order to use (as ``DistributedSampler.set_epoch``)."""
        self.epoch = epoch

    def _count(self) -> int:
        return self.tensors[0].shape[0] if self.tensors is not None else len(self.samples)

    def _warn_last(self) -> None:
        """drop_last=False: say what happens to the samples after the last whole global batch."""
        left = self._count() % self.global_batch
        if self.drop_last or not left or self.comm.rank != 0:
            return
        if left < self.parts:
            warnings.warn(f"the last {left} sample(s) make fewer than one per rank: they are left out",
                          BatchSizeWarning, stacklevel=_users_level())
        elif left % self.parts:
            warnings.warn(f"the last global batch of {left} splits unevenly over {self.parts} ranks: its ranks' "
                          f"gradients are averaged with equal weights, so that step is not its mean",
                          BatchSizeWarning, stacklevel=_users_level())

    def __len__(self) -> int:
        if self.batches is not None:
            return len(self.batches)
        n = self._count()
        whole = n // self.global_batch
        # a last, partial batch only where every rank gets a sample of it
        return whole if self.drop_last else whole + (n % self.global_batch >= self.parts)

    def order(self) -> torch.Tensor:
        """The global sample order of the current epoch, identical on every rank."""
        n = self._count()
        if not self.shuffle:
            return torch.arange(n)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=generator)

    def __iter__(self):
        rank, size = self.part, self.parts
        if self.batches is not None:
            for batch in self.batches:
                if _batch_len(batch) < size:
                    continue  # some rank would get an empty batch
                if not self._warned:
                    self._warn(per_rank_batches(_batch_len(batch), size))
                    self._warned = True
                yield _slice(batch, rank, size)
            return
        order = self.order()
        for step in range(len(self)):
            indices = order[step * self.global_batch: (step + 1) * self.global_batch]
            mine = torch.tensor_split(indices, size)[rank]
            if self.samples is not None:
                yield torch.utils.data.default_collate([self.samples[i] for i in mine.tolist()])
                continue
            batch = tuple(t[mine] for t in self.tensors)
            if self.keys is not None:
                yield dict(zip(self.keys, batch))
            else:
                yield batch if len(batch) > 1 else batch[0]


def shard(data, global_batch: int | None = None, comm: comm_mod.Communicator | None = None,
          shuffle: bool = True, seed: int = 0, drop_last: bool = True, split: bool = True) -> Shard:
    """Give this rank its disjoint part of every global batch.

    ``data`` is either tensors (a tuple of equally long tensors, or a
    ``TensorDataset``), batched here into global batches of ``global_batch`` in a
    shuffled order that depends only on ``seed`` and the epoch; or any iterable of
    global batches (a ``DataLoader``), each batch of which is split along its
    first dimension. Warns (rank 0) when the per-rank batch breaks the source's
    tile rule: below 64 or not a multiple of 32. ``split=False`` gives every rank
    the whole of every global batch, in the same order (model parallelism: all
    ranks work on the same batch).

    >>> import gpurig, torch
    >>> X, y = torch.randn(1024, 784), torch.randint(0, 10, (1024,))
    >>> batches = gpurig.shard((X, y), global_batch=256)    # 128 each on 2 ranks
    >>> for epoch in range(2):
    ...     batches.set_epoch(epoch)
    ...     for x, t in batches:
    ...         pass
    """
    return Shard(data, global_batch, comm, shuffle, seed, drop_last, split)
