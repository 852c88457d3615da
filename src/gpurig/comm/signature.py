"""What a rank submits to a collective, as data: compared across ranks before any byte of it moves.

A :class:`Signature` holds the collective's kind, the tensor's name (when the
caller gives one), dtype and shape, and the reduction or root. Ranks compare
signatures through a *check block* (:func:`check_block`): 32 integers holding
the bits of a digest of the signature (or of a whole batch of signatures),
summed over all ranks by one tiny allreduce. Where every rank submitted the
same, each summed bit is 0 or the rank count; anything in between means some
ranks differ (:func:`agrees`). Only then do the ranks exchange the full
descriptions, and :func:`describe_difference` says which ranks differ and how.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

import numpy as np
import torch

COLLECTIVES = frozenset({"allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall"})  # Signature.kind
DIGEST_BITS = 32
CHECK_WORDS = DIGEST_BITS + 1  # the digest's bits, then a 1 from every rank (their count)
_DIGESTS: dict = {}  # a training loop submits the same few signatures over and over
_BATCH_DIGESTS: dict = {}  # ... and DataParallel announces the same batch of them at every step
_DTYPES = {dtype: str(dtype).removeprefix("torch.") for dtype in
           (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
            torch.int32, torch.int64, torch.bool)}
_ITEM_BYTES = {name: torch.empty(0, dtype=dtype).element_size() for dtype, name in _DTYPES.items()}


class Signature(NamedTuple):
    """One rank's side of one collective (a named tuple: made once per collective, so cheap).

    ``shape`` is the tensor's shape, with ``None`` for a dimension that may
    legitimately differ across ranks (an allgather's first one).

    >>> Signature("allreduce", "bucket 0", "float32", (1000,), "sum").describe()
    "allreduce 'bucket 0' float32[1000] sum"
    """

    kind: str
    name: str | None
    dtype: str
    shape: tuple
    detail: str = ""

    @classmethod
    def of(cls, kind: str, tensor: torch.Tensor, name: str | None = None, detail: str = "",
           vary_first: bool = False) -> "Signature":
        """The signature of ``tensor`` submitted to ``kind``.

        >>> Signature.of("allgather", torch.zeros(3, 2), vary_first=True).shape
        (None, 2)
        """
        shape = tuple(tensor.shape)
        if vary_first and shape:
            shape = (None, *shape[1:])
        dtype = _DTYPES.get(tensor.dtype) or str(tensor.dtype).removeprefix("torch.")
        return cls(kind, name, dtype, shape, detail)

    def describe(self) -> str:
        """How messages show it (the class example); ``*`` for a dimension that may differ."""
        dims = ",".join("*" if d is None else str(d) for d in self.shape)
        name = f" {self.name!r}" if self.name is not None else ""
        detail = f" {self.detail}" if self.detail else ""
        return f"{self.kind}{name} {self.dtype}[{dims}]{detail}"

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor (0 where a dimension may differ across ranks).

        >>> Signature("allreduce", None, "float32", (1000,)).nbytes
        4000
        """
        if any(d is None for d in self.shape):
            return 0
        n = _ITEM_BYTES.get(self.dtype, 0)
        for d in self.shape:
            n *= d
        return n

    def fields(self) -> list:
        """The signature as JSON-ready data, for the exchange after a mismatch."""
        return [self.kind, self.name, self.dtype, ["*" if d is None else d for d in self.shape], self.detail]

    @property
    def digest(self) -> int:
        """A 32-bit digest, the same in every process (unlike ``hash``).

        >>> Signature("barrier", None, "-", ()).digest == Signature("barrier", None, "-", ()).digest
        True
        """
        digest = _DIGESTS.get(self)
        if digest is None:
            if len(_DIGESTS) > 10_000:
                _DIGESTS.clear()
            digest = _DIGESTS[self] = zlib.crc32(self.describe().encode())
        return digest


def batch_digest(signatures: list[Signature]) -> int:
    """One digest for a sequence of signatures; order matters.

    >>> a, b = Signature("allreduce", "a", "float32", (1,)), Signature("allreduce", "b", "float32", (1,))
    >>> batch_digest([a, b]) != batch_digest([b, a])
    True
    """
    if len(signatures) == 1:
        return signatures[0].digest
    key = tuple(signatures)
    digest = _BATCH_DIGESTS.get(key)
    if digest is None:
        if len(_BATCH_DIGESTS) > 1000:
            _BATCH_DIGESTS.clear()
        digest = _BATCH_DIGESTS[key] = zlib.crc32("\n".join(s.describe() for s in signatures).encode())
    return digest


def check_block(digest: int) -> np.ndarray:
    """The int64 block a rank contributes to the check allreduce: the digest's bits, then a 1.

    >>> check_block(5)[:4].tolist(), int(check_block(5)[-1])
    ([1, 0, 1, 0], 1)
    """
    return np.append((digest >> np.arange(DIGEST_BITS, dtype=np.int64)) & 1, 1)


def agrees(summed: np.ndarray, ranks: int) -> bool:
    """Whether a check block summed over ``ranks`` ranks came from identical digests.

    >>> agrees(check_block(5) * 3, 3), agrees(check_block(5) * 2 + check_block(6), 3)
    (True, False)
    """
    bits, count = summed[:DIGEST_BITS], summed[DIGEST_BITS]
    return int(count) == ranks and bool(((bits == 0) | (bits == ranks)).all())


class CheckBuffer:
    """One reusable check block: filled for a digest, summed in place by the engine, judged.

    Collectives repeat, so each digest's block and its all-agree sum are kept;
    filling and judging are then a copy and a comparison of 33 integers in numpy
    (microseconds; the same in torch ops costs tens of them).

    >>> buf = CheckBuffer(ranks=1); tensor = buf.fill(5); buf.agreed()
    True
    """

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.tensor = torch.zeros(CHECK_WORDS, dtype=torch.int64)
        self._array = self.tensor.numpy()
        self._blocks: dict[int, tuple[np.ndarray, bytes]] = {}
        self._expected = b""

    def fill(self, digest: int) -> torch.Tensor:
        """The tensor to allreduce for ``digest`` (the same tensor every time)."""
        found = self._blocks.get(digest)
        if found is None:
            if len(self._blocks) > 10_000:
                self._blocks.clear()
            block = check_block(digest)
            found = self._blocks[digest] = (block, (block * self.ranks).tobytes())
        np.copyto(self._array, found[0])
        self._expected = found[1]
        return self.tensor

    def agreed(self, summed: torch.Tensor | None = None) -> bool:
        """Whether the summed block (this buffer, or ``summed`` when the engine worked on a copy) says all agree."""
        array = self._array if summed is None else summed.cpu().numpy()
        return array.tobytes() == self._expected


def describe_difference(first_seq: int, per_rank: list[list]) -> str:
    """Which ranks differ and how, from every rank's list of :meth:`Signature.fields` (rank order).

    ``first_seq`` numbers the first collective of the lists (the job's collectives count from 1).

    >>> a = [["allreduce", "w", "float32", [3], "sum"]]
    >>> b = [["allreduce", "w", "float32", [4], "sum"]]
    >>> describe_difference(7, [a, a, b])
    "collective #7 differs across ranks: ranks 0, 1 submitted allreduce 'w' float32[3] sum; rank 2 allreduce 'w' float32[4] sum (the shape differs)"
    """
    length = max(len(fields) for fields in per_rank)
    for index in range(length):
        row = [fields[index] if index < len(fields) else None for fields in per_rank]
        if all(r == row[0] for r in row):
            continue
        groups: dict = {}
        for rank, fields in enumerate(row):
            groups.setdefault(_text(fields), []).append(rank)
        parts = [f"{_ranks(ranks)} {'submitted ' if i == 0 else ''}{text}" for i, (text, ranks) in
                 enumerate(groups.items())]
        return (f"collective #{first_seq + index} differs across ranks: {'; '.join(parts)} "
                f"({_how(row)})")
    return f"collective #{first_seq} differs across ranks, but no difference was found in their descriptions"


def _text(fields: list | None) -> str:
    if fields is None:
        return "nothing (it has no such collective)"
    kind, name, dtype, shape, detail = fields
    return Signature(kind, name, dtype, tuple(None if d == "*" else d for d in shape), detail).describe()


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _how(row: list) -> str:
    """What differs between the first rank's fields and the first that differ from them."""
    base = row[0]
    other = next(r for r in row if r != base)
    if base is None or other is None:
        return "some ranks submitted fewer collectives"
    if base[0] != other[0]:
        return "a different collective: the ranks call them in another order, or not all of them"
    differs = [what for what, i in (("name", 1), ("dtype", 2), ("shape", 3), ("reduction or root", 4))
               if base[i] != other[i]]
    text = " and ".join(differs)
    if differs == ["name"]:
        return "the name differs: other tensors, or the same ones in another order"
    return f"the {text} differ{'s' if len(differs) == 1 else ''}"
