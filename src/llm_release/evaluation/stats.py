"""Bootstrap intervals for eval scores and for paired candidate-vs-baseline differences."""

from __future__ import annotations

import functools

import numpy as np

SEED = 20261130


def bootstrap_mean_ci(
    values: list[float], *, confidence: float = 0.95, iters: int = 2000
) -> tuple[float, float, float, float]:
    """Mean, CI low, CI high, and bootstrap standard error of the mean."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return 0.0, 0.0, 0.0, 0.0
    rng = np.random.default_rng(SEED)
    means = data[rng.integers(0, data.size, size=(iters, data.size))].mean(axis=1)
    tail = (1 - confidence) / 2
    return (
        float(data.mean()),
        float(np.quantile(means, tail)),
        float(np.quantile(means, 1 - tail)),
        float(means.std(ddof=1)),
    )


def paired_drop_ci(
    baseline: list[float],
    candidate: list[float],
    *,
    higher_is_better: bool,
    confidence: float = 0.95,
    iters: int = 2000,
) -> tuple[float, float, float]:
    """Mean drop of ``candidate`` versus ``baseline`` over the same items, with its CI.

    Items are resampled together, so the interval reflects the per-item differences,
    not the spread of two independent scores.
    """
    base = np.asarray(baseline, dtype=float)
    cand = np.asarray(candidate, dtype=float)
    if base.shape != cand.shape:
        raise ValueError("paired comparison needs the same items on both sides")
    drop = (base - cand) if higher_is_better else (cand - base)
    if drop.size == 0:
        return 0.0, 0.0, 0.0
    rng = np.random.default_rng(SEED)
    means = drop[rng.integers(0, drop.size, size=(iters, drop.size))].mean(axis=1)
    tail = (1 - confidence) / 2
    return float(drop.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


@functools.cache
def detectable_drop(n: int, *, confidence: float = 0.95, iters: int = 2000) -> float | None:
    """The smallest drop a paired comparison on ``n`` items can tell from no drop at all.

    It is k/n for the smallest k such that k items flipped right→wrong (and none the other
    way) give a paired bootstrap interval, computed exactly as the gates compute it, whose
    lower end lies above zero. Fewer flips than that are indistinguishable from noise at
    this confidence: 4 of 40 items (0.10) at 95%, 4 of 14 (0.29) for a 14-item slice.
    None when even every item flipping cannot be resolved (n of 0).
    """
    for k in range(1, n + 1):
        base = [1.0] * n
        cand = [0.0] * k + [1.0] * (n - k)
        _, low, _ = paired_drop_ci(
            base, cand, higher_is_better=True, confidence=confidence, iters=iters
        )
        if low > 0:
            return k / n
    return None
