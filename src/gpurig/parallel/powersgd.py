"""PowerSGD: average each gradient matrix as a rank-R product P·Qᵀ (Vogels et al., NeurIPS 2019).

For a gradient matrix M (n × m; a convolution's weight is viewed as
out × in·kh·kw) and the previous step's Q (m × R, the *warm start*):

1. P = M·Q on every rank; allreduce P (sum); orthonormalise its columns → P̂.
2. Q = Mᵀ·P̂ on every rank (computed as Qᵀ = P̂ᵀ·M); allreduce Q (sum).
3. The average gradient is approximated by P̂·Qᵀ / ranks, the same on every rank.

Compression is linear, so the allreduces add the ranks' factors directly: a
plain ring allreduce of (n + m)·R values instead of n·m, each rank sending
2(P−1)/P of that. Vectors (biases, norms) and matrices too small to gain (less
than :data:`MIN_COMPRESSION` x) travel uncompressed in the first allreduce.
Error feedback keeps what the projection lost on this rank, M − P̂·(P̂ᵀ·M), and
adds it to the next step's gradient; with warm start this is one step of power
iteration per training step, so the factors track the gradient's top subspace.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from gpurig.comm.signature import Signature
from gpurig.parallel.feedback import FeedbackState

DEFAULT_RANK = 4
MIN_COMPRESSION = 2.0  # compress a matrix only if its factors are at most half its size (as PyTorch's hook)
SEED = 20191  # warm-start factors start from the same random values on every rank


def split(shapes: list[torch.Size], rank: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """Which tensors of a bucket are compressed: ([(offset, n, m)] matrices, [(offset, numel)] the rest).

    >>> split([torch.Size([8]), torch.Size([100, 50]), torch.Size([4, 3])], rank=2)
    ([(8, 100, 50)], [(0, 8), (5008, 12)])
    """
    matrices, rest, offset = [], [], 0
    for shape in shapes:
        numel = math.prod(shape)
        n, m = (shape[0], numel // shape[0]) if len(shape) >= 2 and numel else (0, 0)
        if n and (n + m) * rank * MIN_COMPRESSION <= n * m:
            matrices.append((offset, n, m))
        else:
            rest.append((offset, numel))
        offset += numel
    return matrices, rest


def factor_values(shapes: list[torch.Size], rank: int) -> int:
    """Float32 values the two allreduces carry for a bucket of ``shapes`` (the compressed size).

    >>> factor_values([torch.Size([1200, 1200]), torch.Size([1200])], rank=4)
    10800
    """
    return sum(allreduce_values(*split(shapes, rank), rank))


def allreduce_values(matrices: list[tuple[int, int, int]], rest: list[tuple[int, int]], rank: int) -> tuple[int, int]:
    """Values of a bucket's two allreduces, from its :func:`split`: the Ps with the uncompressed tensors, then
    the Qs.

    >>> allreduce_values(*split([torch.Size([8]), torch.Size([100, 50])], rank=2), rank=2)
    (208, 100)
    """
    return (sum(n * rank for _, n, _ in matrices) + sum(numel for _, numel in rest),
            sum(m * rank for _, _, m in matrices))


def _initial_q(m: int, rank: int, index: int, device) -> torch.Tensor:
    """The first warm-start factor, kept as Qᵀ (rank × m), the same on every rank."""
    generator = torch.Generator().manual_seed(SEED + index)
    return torch.randn(m, rank, generator=generator).T.contiguous().to(device)


def orthonormalize(p: torch.Tensor) -> torch.Tensor:
    """Columns of ``p`` made orthonormal (reduced QR), in place; a zero matrix stays zero.

    >>> q = orthonormalize(torch.randn(50, 3))
    >>> torch.allclose(q.T @ q, torch.eye(3), atol=1e-5)
    True
    """
    if not torch.any(p):
        return p
    q, r = torch.linalg.qr(p)
    # Fix QR's sign freedom (and rank deficiency: zero columns stay zero) so P̂ is a function of P alone.
    signs = torch.sign(torch.diagonal(r))
    return p.copy_(q * signs)


def collectives(shapes: list[torch.Size], rank: int, name: str | None = None) -> tuple[list, list]:
    """The allreduces a bucket of ``shapes`` submits: ([P and the uncompressed rest] when it begins, [Q] when
    it finishes); DataParallel announces them, so the guard checks a whole step with one exchange.

    >>> begun, finished = collectives([torch.Size([8]), torch.Size([100, 50])], 2, "bucket 0")
    >>> [s.describe() for s in begun + finished]
    ["allreduce 'bucket 0 P' float32[208] sum", "allreduce 'bucket 0 Q' float32[100] sum"]
    """
    first, second = allreduce_values(*split(shapes, rank), rank)
    return ([Signature("allreduce", _label(name, "P"), "float32", (first,), "sum")],
            [Signature("allreduce", _label(name, "Q"), "float32", (second,), "sum")])


def _label(name: str | None, factor: str) -> str:
    return f"{name} {factor}" if name else factor


class LowRankAverage:
    """One bucket's rank-``rank`` PowerSGD average in flight: begun, then finished, possibly with other work
    between.

    Beginning it computes P = M·Q for every matrix and starts the allreduce
    of the Ps (with the uncompressed tensors) without waiting; :meth:`finish`
    orthonormalises, computes and allreduces Q and writes the average into
    ``flat`` (tensors of ``shapes`` back to back), in place. DataParallel
    begins the next bucket before finishing this one, as it does the
    element-wise codecs: no rank waits for the others in the middle of
    backward (on CPU ranks such waits cost more than the transfers).

    ``state`` is the bucket's :class:`~gpurig.parallel.feedback.FeedbackState`:
    ``state.sent`` holds this rank's residual, ``state.lowrank`` the warm-start
    factors (each Qᵀ, rank × m).

    >>> average = LowRankAverage(comm, bucket, [p.shape for p in params], 4, FeedbackState())   # doctest: +SKIP
    >>> sent = average.finish()                                                              # doctest: +SKIP
    """

    def __init__(self, comm, flat: torch.Tensor, shapes: list[torch.Size], rank: int, state,
                 name: str | None = None):
        self.comm, self.flat, self.rank, self.state, self.name = comm, flat, rank, state, name
        self.matrices, self.rest = matrices, rest = split(shapes, rank)
        if state.sent is None:
            state.sent = torch.zeros_like(flat)
        else:
            flat.add_(state.sent)
        if state.lowrank is None:
            state.lowrank = [_initial_q(m, rank, i, flat.device) for i, (_, n, m) in enumerate(matrices)]
        # Checkpoints written before the factors were kept transposed hold Q (m × rank); m ≠ rank for every
        # compressed matrix, so the shape tells.
        state.lowrank = [q.T.contiguous() if q.shape == (m, rank) else q
                         for q, (_, n, m) in zip(state.lowrank, matrices)]
        # Every product here reads the n × m matrix row by row (M·Q with Q small, P̂ᵀ·M rather than Mᵀ·P̂): on a
        # CPU the transposed product took 7x as long, and PowerSGD's arithmetic twice as long in all.
        self.p_values = sum(n * rank for _, n, _ in matrices)
        first_values, self.second_values = allreduce_values(matrices, rest, rank)
        self.first = first = state.buffer("p", first_values, device=flat.device)
        self.ps, start = [], 0
        for (offset, n, m), q_t in zip(matrices, state.lowrank):
            self.ps.append(torch.matmul(self._matrix(flat, offset, n, m), q_t.T,
                                        out=first[start: start + n * rank].view(n, rank)))
            start += n * rank
        for offset, numel in rest:
            first[start: start + numel].copy_(flat[offset: offset + numel])
            start += numel
        self.handle = comm.allreduce_async(first, op="sum", name=_label(name, "P"))

    @staticmethod
    def _matrix(tensor, offset, n, m):
        return tensor[offset: offset + n * m].view(n, m)

    def finish(self) -> int:
        """Wait for the Ps, then the second half: Q's products and allreduce, the average; the bytes sent."""
        comm, flat, state, rank, first = self.comm, self.flat, self.state, self.rank, self.first
        ranks = comm.size
        self.handle.wait()
        start = self.p_values
        for offset, numel in self.rest:  # uncompressed: exact, nothing owed
            flat[offset: offset + numel].copy_(first[start: start + numel]).div_(ranks)
            state.sent[offset: offset + numel].zero_()
            start += numel

        second = state.buffer("q", self.second_values, device=flat.device)
        qs, start = [], 0
        for (offset, n, m), p in zip(self.matrices, self.ps):
            orthonormalize(p)
            mine = self._matrix(flat, offset, n, m)
            q_t = torch.matmul(p.T, mine, out=second[start: start + m * rank].view(rank, m))
            # What the projection loses on this rank: M − P̂·(P̂ᵀ·M), kept for the next step.
            torch.addmm(mine, p, q_t, alpha=-1, out=self._matrix(state.sent, offset, n, m))
            qs.append(q_t)
            start += m * rank
        comm.allreduce(second, op="sum", name=_label(self.name, "Q"))

        for (offset, n, m), p, q_t, warm in zip(self.matrices, self.ps, qs, state.lowrank):
            warm.copy_(q_t)
            torch.matmul(p, q_t.div_(ranks), out=self._matrix(flat, offset, n, m))  # the small factor scaled
        return 2 * (ranks - 1) * 4 * (first.numel() + second.numel()) // ranks


def local_seconds(shapes: list[torch.Size], rank: int, device=None) -> float:
    """Seconds of arithmetic a :class:`LowRankAverage` spends on a bucket of ``shapes`` here (timed, best of 3).

    >>> local_seconds([torch.Size([256, 256])], rank=4) > 0
    True
    """
    from gpurig.timing import device_sync, timed

    flat, state = torch.randn(sum(math.prod(s) for s in shapes), device=device), FeedbackState()
    return timed(lambda: LowRankAverage(_Alone(), flat, shapes, rank, state).finish(),
                 sync=device_sync(torch.device(device or "cpu")))


class _Alone:
    """One rank on its own: a :class:`LowRankAverage`'s arithmetic without the collectives, to time it."""

    size = 1

    def allreduce(self, tensor: torch.Tensor, op: str = "sum", name: str | None = None) -> torch.Tensor:
        return tensor

    def allreduce_async(self, tensor: torch.Tensor, op: str = "sum", name: str | None = None):
        return SimpleNamespace(wait=lambda: tensor)
