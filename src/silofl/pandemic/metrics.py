"""Ranking metrics for infection-risk scores (NumPy only).

`average_precision` (AUPRC) checks its inputs and calls the core's one AUPRC
(`silofl.models.metrics.auprc`), defined exactly like scikit-learn's
``average_precision_score`` for binary labels:

    AP = Σ_k (R_k − R_{k−1}) · P_k

over the distinct score thresholds in decreasing order (tied scores form one threshold,
no interpolation), with ``R_0 = 0``; ``P_k``/``R_k`` are the precision/recall of
predicting positive every example scoring ≥ the k-th threshold.  One deliberate
difference: with no positive labels AP is undefined and we return NaN (scikit-learn warns
and returns 0), so that a region without positives does not drag an average down.

A random scorer's expected AP is the positive rate (`positive_rate`), the baseline the
seed compares against (≈ 0.002 on the challenge data).
"""

from __future__ import annotations

import numpy as np

from silofl.errors import ConfigError, DataError
from silofl.models.metrics import auprc


def _check(y_true, scores) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y_true)
    s = np.asarray(scores, dtype=np.float64)
    if y.ndim != 1 or s.ndim != 1 or y.shape != s.shape:
        raise DataError(f"y_true and scores must be 1-D arrays of equal length, got "
                        f"{y.shape} and {s.shape}")
    if y.size and not np.all((y == 0) | (y == 1)):
        raise DataError("y_true must contain only 0/1 labels")
    if not np.all(np.isfinite(s)):
        raise DataError("scores contain NaN or infinite values")
    return y.astype(bool), s


def positive_rate(y_true) -> float:
    """Fraction of positives: the expected AP of random scores."""
    y = np.asarray(y_true)
    if y.size == 0:
        raise DataError("cannot compute a positive rate of zero examples")
    return float(np.mean(y != 0))


def average_precision(y_true, scores) -> float:
    """AUPRC of checked 0/1 labels and finite scores: `silofl.models.metrics.auprc`, the one
    implementation (scikit-learn's definition; NaN without positives)."""
    y, s = _check(y_true, scores)
    return auprc(y, s)


def per_region_average_precision(y_true, scores, region) -> dict:
    """{region label: AP} for every region (NaN where a region has no positives)."""
    y, s = _check(y_true, scores)
    r = np.asarray(region)
    if r.shape != y.shape:
        raise DataError(f"region must have one label per example, got {r.shape} for "
                        f"{y.shape}")
    return {k.item() if hasattr(k, "item") else k: average_precision(y[r == k], s[r == k])
            for k in np.unique(r)}


def recall_at_k(y_true, scores, k: int) -> float:
    """Fraction of all positives among the ``k`` highest scores (ties: lower index first)."""
    y, s = _check(y_true, scores)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 < k <= y.size:
        raise ConfigError(f"k must be an integer in 1..{y.size}, got {k!r}")
    pos = int(y.sum())
    if pos == 0:
        return float("nan")
    top = np.argsort(-s, kind="stable")[:k]
    return float(y[top].sum() / pos)


def precision_at_k(y_true, scores, k: int) -> float:
    """Fraction of positives among the ``k`` highest scores."""
    y, s = _check(y_true, scores)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 < k <= y.size:
        raise ConfigError(f"k must be an integer in 1..{y.size}, got {k!r}")
    top = np.argsort(-s, kind="stable")[:k]
    return float(y[top].mean())


def recall_at_threshold(y_true, scores, threshold: float) -> float:
    """Fraction of positives scored ≥ ``threshold``."""
    y, s = _check(y_true, scores)
    pos = int(y.sum())
    if pos == 0:
        return float("nan")
    return float((y & (s >= threshold)).sum() / pos)
