"""Latency and bandwidth fitted to measured times: ``time = alpha + bytes × beta`` (least squares)."""

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


def fit_alpha_beta(nbytes: list[float], seconds: list[float]) -> AlphaBeta:
    """Least-squares line through (bytes, seconds), each point weighted by 1 / seconds².

    Weighting by the inverse square of the time minimises *relative* errors, so
    the small messages (which set alpha) count as much as the large ones (which
    set beta), even when the times span orders of magnitude. When the best line
    would have a negative latency, alpha is 0 and beta is refitted through the origin.

    >>> fit = fit_alpha_beta([0, 1e6, 2e6], [1e-5, 1e-5 + 1e-3, 1e-5 + 2e-3])
    >>> round(fit.alpha * 1e6, 3), round(fit.bytes_per_s / 1e9, 3)
    (10.0, 1.0)
    """
    if len(nbytes) != len(seconds) or len(nbytes) < 2:
        raise ValueError("need at least two (bytes, seconds) points")
    if any(t <= 0 for t in seconds):
        raise ValueError("times must be positive")
    weights = [1 / t ** 2 for t in seconds]
    total = sum(weights)
    mean_x = sum(w * x for w, x in zip(weights, nbytes)) / total
    mean_y = sum(w * y for w, y in zip(weights, seconds)) / total
    sxx = sum(w * (x - mean_x) ** 2 for w, x in zip(weights, nbytes))
    if sxx == 0:
        raise ValueError("need at least two different message sizes")
    beta = sum(w * (x - mean_x) * (y - mean_y) for w, x, y in zip(weights, nbytes, seconds)) / sxx
    alpha = mean_y - beta * mean_x
    if alpha < 0:
        alpha = 0.0
        beta = sum(w * x * y for w, x, y in zip(weights, nbytes, seconds)) / sum(w * x * x for w, x in zip(weights, nbytes))
    return AlphaBeta(alpha=alpha, beta=beta)
