"""Latency and bandwidth fitted to measured times: ``time = alpha + bytes × beta``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlphaBeta:
    """The Hockney model of a link or collective: ``alpha`` seconds of latency, ``beta`` seconds per byte.

    >>> AlphaBeta(alpha=1e-5, beta=1e-9).seconds(1e6)
    0.00101
    """

    alpha: float
    beta: float

    def seconds(self, nbytes: float) -> float:
        """Predicted time for ``nbytes``."""
        return self.alpha + nbytes * self.beta

    @property
    def bytes_per_s(self) -> float:
        """The asymptotic bandwidth 1 / beta (infinite when beta is 0)."""
        return float("inf") if self.beta <= 0 else 1 / self.beta


def fit_latency_bandwidth(nbytes: list[float], seconds: list[float]) -> AlphaBeta:
    """Alpha from the smallest messages, beta from the largest: each parameter where it dominates.

    A straight line through every size is pulled off by what happens in
    between (a rate limiter's burst lets 256 KB through at line rate, a
    protocol changes at 64 KB), and predictions of gradient buckets need the
    megabyte end right. So: beta is the least-squares slope over the sizes
    within 16x of the largest (at least the two largest); alpha what the
    smallest message took beyond its bytes at that rate.

    >>> sizes = [1e3, 1e4, 1e5, 1e6, 4e6, 16e6]
    >>> times = [2e-5, 2e-5, 1e-4, 8e-3, 3.2e-2, 0.128]          # fast bursts, then 125 MB/s
    >>> fit = fit_latency_bandwidth(sizes, times)
    >>> round(fit.alpha * 1e6), round(fit.bytes_per_s / 1e6)
    (12, 125)
    """
    if len(nbytes) != len(seconds) or len(nbytes) < 2:
        raise ValueError("need at least two (bytes, seconds) points")
    points = sorted(zip(nbytes, seconds))
    largest = points[-1][0]
    big = [p for p in points if p[0] * 16 >= largest] or points[-2:]
    if len(big) < 2:
        big = points[-2:]
    mean_x = sum(x for x, _ in big) / len(big)
    mean_y = sum(y for _, y in big) / len(big)
    sxx = sum((x - mean_x) ** 2 for x, _ in big)
    beta = sum((x - mean_x) * (y - mean_y) for x, y in big) / sxx if sxx else mean_y / mean_x
    if beta <= 0:  # noise swamped the slope: the largest message's average rate
        beta = points[-1][1] / points[-1][0]
    return AlphaBeta(alpha=max(0.0, points[0][1] - points[0][0] * beta), beta=beta)
