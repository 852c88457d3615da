"""How long a device takes for a matrix multiply, and for work that only moves memory.

A GEMM of (M × K) · (K × N) does 2·M·N·K floating-point operations and moves
at least (M·K + K·N + M·N) elements. Its time is modelled as

    seconds = overhead + max(2·M'·N'·K / flops_per_s, bytes / bytes_per_s) + unhidden · min(…)

where M' and N' are M and N rounded up to whole tiles, and the tiles to whole
waves over the device's compute units: the source's point that cuBLAS works
in 64×128 tiles and warps of 32, so a batch of 65 costs nearly what 128 does,
and that a GPU wants enough tiles to fill all its multiprocessors. On a CPU
(no tiles) the three constants are fitted to ``gpurig bench``'s GEMM
measurements (:func:`fit_gemm_model`); on a catalog GPU they come from its
datasheet, derated by measured efficiency where there is a profile.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

DTYPE_BYTES = 4  # float32 throughout the reference models
SPLIT_K_MIN = 256  # the least K one unit works on when a GEMM's K is split over units
SPLIT_WAVES = 4    # a GEMM of more tiles than units splits K in up to this many parts where its last wave is short


@dataclass(frozen=True)
class GemmModel:
    """Constants of the GEMM time model for one device and thread count.

    >>> one_unit = GemmModel(overhead_s=0.0, flops_per_s=1e12, bytes_per_s=1e12, tile=(64, 128), units=1)
    >>> one_unit.seconds(65, 128, 1000) / one_unit.seconds(64, 128, 1000)     # one row more: a second tile
    2.0
    >>> four_units = GemmModel(0.0, 1e12, 1e12, tile=(64, 128), units=4)
    >>> four_units.seconds(256, 128, 200) == four_units.seconds(1, 1, 200)   # 4 tiles on 4 units: one wave
    True
    >>> choice = GemmModel(0.0, 1e12, 1e12, tile=((128, 128), (128, 64)), units=1)
    >>> choice.computed_flops(128, 64, 100) == 2 * 128 * 64 * 100       # the narrow tile fits a 64-wide output
    True
    """

    overhead_s: float
    flops_per_s: float
    bytes_per_s: float
    tile: tuple | None = None   # (rows, columns) of the output tile, or a tuple of such the library chooses from
    units: int | None = None
    # How much of the shorter of a GEMM's arithmetic and memory time its kernel fails to hide under the longer
    # one: 0 for a perfect roofline (the longer alone counts), 1 for none hidden (the two add up).
    unhidden: float = 0.0

    def computed_flops(self, m: int, n: int, k: int, batch: int = 1) -> float:
        """FLOPs the device spends: whole tiles, and whole waves of tiles over its compute units.

        A batched GEMM (``batch`` independent products, as attention runs per
        head) spreads all its tiles over the units at once. With fewer tiles
        than units and a long K (a weight gradient: small output, the batch as
        K), libraries split K over several units ("split-K") so the device
        fills up; so does the model. A GEMM whose last wave of tiles would
        leave units idle is split too, in up to :data:`SPLIT_WAVES` parts
        (cuBLAS's split-K and stream-K kernels): BERT-base's weight gradient at
        64 × 384 tokens, 288 tiles on an H100's 132 SMs, is not 3 waves for 2.2.

        >>> h100 = GemmModel(0.0, 1e12, 1e12, tile=(64, 128), units=132)
        >>> round(h100.computed_flops(768, 3072, 24576) / (2 * 768 * 3072 * 24576), 2)
        1.03
        """
        if self.tile is None:
            return 2.0 * m * n * k * batch
        return _tiled_flops(m, n, k, batch, self.tile, self.units)

    def seconds(self, m: int, n: int, k: int, batch: int = 1, dtype_bytes: int = DTYPE_BYTES) -> float:
        """Seconds for ``batch`` (m × k)·(k × n) products run as one (batched) GEMM."""
        moved = (m * k + k * n + m * n) * dtype_bytes * batch
        arithmetic, memory = self.computed_flops(m, n, k, batch) / self.flops_per_s, moved / self.bytes_per_s
        return self.overhead_s + max(arithmetic, memory) + self.unhidden * min(arithmetic, memory)

    def rate(self, m: int, n: int, k: int) -> float:
        """Achieved FLOP/s on this shape (useful FLOPs over time)."""
        return 2.0 * m * n * k / self.seconds(m, n, k)


@dataclass(frozen=True)
class FastestGemm:
    """Several ways to run a GEMM (tensor cores, or the CUDA cores with Winograd's 3×3 saving): the fastest
    counts, as cuDNN's algorithm search and cuBLAS's heuristics pick it.

    >>> slow, fast = GemmModel(0, 1e12, 1e12), GemmModel(0, 2e12, 1e12)
    >>> FastestGemm((slow, fast)).seconds(1000, 1000, 1000) == fast.seconds(1000, 1000, 1000)
    True
    """

    options: tuple[GemmModel, ...]

    @property
    def flops_per_s(self) -> float:
        return max(o.flops_per_s for o in self.options)

    def seconds(self, m: int, n: int, k: int, batch: int = 1, dtype_bytes: int = DTYPE_BYTES) -> float:
        return min(o.seconds(m, n, k, batch, dtype_bytes) for o in self.options)


@functools.lru_cache(maxsize=1 << 16)
def _tiled_flops(m: int, n: int, k: int, batch: int, tile: tuple, units: int | None) -> float:
    """Whole tiles in whole waves (:meth:`GemmModel.computed_flops`), for the tile shape that wastes least; pure
    in its arguments, so cached: a fit prices the same products thousands of times."""
    # one tile shape, or several a library picks from
    shapes = tile if isinstance(tile[0], tuple) else (tile,)
    best = math.inf
    for tm, tn in shapes:
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * batch
        if not units:
            best = min(best, 2.0 * tiles * tm * tn * k)
            continue
        for split in range(1, max(1, min(max(units // tiles, SPLIT_WAVES), k // SPLIT_K_MIN)) + 1):
            waves = math.ceil(tiles * split / units)
            best = min(best, 2.0 * waves * units * tm * tn * math.ceil(k / split))
    return best


def memory_seconds(nbytes: float, bytes_per_s: float, overhead_s: float = 0.0) -> float:
    """Seconds for work that only streams memory (activations, norms, optimizer updates).

    >>> memory_seconds(1e9, 100e9)
    0.01
    """
    return overhead_s + nbytes / bytes_per_s


def fit_gemm_model(rows: list[dict], tile=None, units=None) -> GemmModel:
    """Fit overhead, FLOP rate and memory rate to measured GEMMs (rows with m, n, k, seconds).

    Least squares on relative error over a grid of candidate rates (the model is
    a max of two terms, so a plain linear fit does not apply); the overhead is
    what the smallest products take beyond their arithmetic.

    >>> truth = GemmModel(2e-6, 50e9, 10e9)
    >>> rows = [{"m": m, "n": n, "k": k, "seconds": truth.seconds(m, n, k)}
    ...         for m in (16, 64, 256) for n in (128, 1024) for k in (4, 128, 1024)]
    >>> fitted = fit_gemm_model(rows)
    >>> round(fitted.flops_per_s / 1e9), round(fitted.bytes_per_s / 1e9)
    (50, 10)
    """
    if not rows:
        raise ValueError("no GEMM measurements to fit")

    def error(model):
        return sum(((model.seconds(r["m"], r["n"], r["k"]) - r["seconds"]) / r["seconds"]) ** 2 for r in rows)

    # Coarse-to-fine search on a log grid: three parameters, a smooth error surface.
    best = GemmModel(0.0, max(2.0 * r["m"] * r["n"] * r["k"] / r["seconds"] for r in rows),
                     max((r["m"] * r["k"] + r["k"] * r["n"] + r["m"] * r["n"]) * DTYPE_BYTES / r["seconds"]
                         for r in rows), tile, units)
    smallest = min(r["seconds"] for r in rows)
    best_err = error(best)
    for scale in (4.0, 2.0, 1.4, 1.15, 1.05, 1.01):
        improved = True
        while improved:
            improved = False
            for field, factor in (("flops_per_s", scale), ("flops_per_s", 1 / scale), ("bytes_per_s", scale),
                                  ("bytes_per_s", 1 / scale)):
                trial = GemmModel(best.overhead_s, best.flops_per_s, best.bytes_per_s, tile, units)
                trial = _replace(trial, field, getattr(trial, field) * factor)
                if error(trial) < best_err:
                    best, best_err, improved = trial, error(trial), True
            for overhead in (best.overhead_s * scale, best.overhead_s / scale, smallest * 0.5 / scale):
                trial = _replace(best, "overhead_s", min(overhead, smallest))
                if error(trial) < best_err:
                    best, best_err, improved = trial, error(trial), True
    return best


def _replace(model: GemmModel, field: str, value: float) -> GemmModel:
    from dataclasses import replace

    return replace(model, **{field: value})
