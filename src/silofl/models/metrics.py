"""Evaluation metrics. Scores come from `Model.predict`.

Pooled metrics follow appendix B.4 of the thesis: the average of per-silo test metrics
weighted by test counts, so every test example (person) counts equally.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

from silofl.errors import ConfigError


def _diverged(scores) -> bool:
    return not np.all(np.isfinite(scores))


def accuracy(y, scores) -> float:
    """NaN when the scores are not finite (a diverged model has no accuracy)."""
    if _diverged(scores):
        return float("nan")
    pred = np.argmax(scores, axis=1) if scores.ndim == 2 else (scores >= 0.5).astype(float)
    return float(np.mean(pred == y))


def margin_accuracy(y, scores) -> float:
    """Accuracy for margin outputs (SVM): positive margin ⇒ class 1."""
    if _diverged(scores):
        return float("nan")
    return float(np.mean((scores > 0) == (y > 0.5)))


def mse(y, scores) -> float:
    """inf when the scores are not finite or the error overflows (a diverged model)."""
    if _diverged(scores):
        return float("inf")
    with np.errstate(over="ignore"):
        return float(np.mean((scores - y) ** 2))


def precision_recall_curve(y, scores) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision and recall at every distinct score, thresholds decreasing.

    Tied scores form one threshold (no interpolation), as in scikit-learn's
    ``precision_recall_curve``.

    Parameters
    ----------
    y : array_like, shape (n,)
        Binary labels (positive: > 0.5).
    scores : ndarray, shape (n,)
        Higher means more likely positive.

    Returns
    -------
    precision, recall, thresholds : ndarray, each shape (m,)
        m distinct scores in decreasing order; recall is NaN when y has no positives.
    """
    y = np.asarray(y) > 0.5
    order = np.argsort(-scores, kind="mergesort")
    s, yy = scores[order], y[order]
    last = np.r_[np.nonzero(np.diff(s))[0], len(s) - 1]  # end of each tie group
    tp = np.cumsum(yy)[last]
    pos = y.sum()
    recall = tp / pos if pos > 0 else np.full(tp.shape, np.nan)
    return tp / (last + 1), recall, s[last]


def auprc(y, scores) -> float:
    """Average precision: the area under the step-wise precision-recall curve.

    AP = Σ_k (R_k − R_{k−1}) · P_k over the distinct thresholds, R_0 = 0 — scikit-learn's
    ``average_precision_score`` for binary labels (tested against it), except that without
    positives AP is undefined and this returns NaN (scikit-learn warns and returns 0).

    Parameters
    ----------
    y : array_like, shape (n,)
        Binary labels (positive: > 0.5).
    scores : ndarray, shape (n,) or (n, 2)
        Scores of the positive class (column 1 of a two-column array).

    Returns
    -------
    float
        AP in [0, 1]; NaN without positives or with non-finite scores (a diverged model).
    """
    y = np.asarray(y) > 0.5
    if scores.ndim == 2:
        scores = scores[:, 1]
    if not y.any() or _diverged(scores):
        return float("nan")
    precision, recall, _ = precision_recall_curve(y, scores)
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def roc_auc(y, scores) -> float:
    """Area under the ROC curve (Mann–Whitney U); NaN when y has one class."""
    y = np.asarray(y) > 0.5
    if scores.ndim == 2:
        scores = scores[:, 1]
    npos, nneg = int(y.sum()), int((~y).sum())
    if npos == 0 or nneg == 0 or _diverged(scores):
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[y].sum() - npos * (npos + 1) / 2) / (npos * nneg))


METRICS = {"accuracy": accuracy, "mse": mse, "auprc": auprc, "roc_auc": roc_auc}
#: True when larger is better
HIGHER_IS_BETTER = {"accuracy": True, "mse": False, "auprc": True, "roc_auc": True}


def default_metric(task: str) -> str:
    return "mse" if task == "regression" else "accuracy"


def metric_fn(name: str, model_name: str):
    if name not in METRICS:
        raise ConfigError(f"unknown metric {name!r}; choose one of {', '.join(METRICS)}")
    if name == "accuracy" and model_name == "svm":
        return margin_accuracy
    if name in ("auprc", "roc_auc") and model_name == "svm":
        return METRICS[name]  # ranking metrics work on margins as they are
    return METRICS[name]


def predicted_classes(scores, model_name: str = "") -> np.ndarray:
    """Class ids a model's scores stand for: argmax of (n, C) probabilities, a positive
    margin for the SVM, probability ≥ 0.5 for (n,) binary scores."""
    scores = np.asarray(scores)
    if scores.ndim == 2:
        return np.argmax(scores, axis=1)
    if model_name == "svm":
        return (scores > 0).astype(np.int64)
    return (scores >= 0.5).astype(np.int64)


def balanced_accuracy(y, pred) -> float:
    """Mean recall over the classes present in `y` (scikit-learn's
    `balanced_accuracy_score`); `pred` are class ids (`predicted_classes`). A model that
    predicts one class scores 1/C here whatever the class balance; NaN for no rows."""
    y, pred = np.asarray(y).astype(np.int64), np.asarray(pred).astype(np.int64)
    if y.size == 0:
        return float("nan")
    return float(np.mean([np.mean(pred[y == c] == c) for c in np.unique(y)]))


def majority_rate(y) -> float:
    """Share of the most frequent class among the labels `y`: the best accuracy a model
    that always predicts one class can reach on these rows (NaN for no rows)."""
    y = np.asarray(y)
    if y.size == 0:
        return float("nan")
    _, counts = np.unique(y, return_counts=True)
    return float(counts.max() / y.size)


def constant_mse(y) -> float:
    """MSE of predicting the mean of `y` itself (their variance): the best any constant
    prediction can do on these rows (NaN for no rows)."""
    y = np.asarray(y, float)
    return float(np.mean((y - y.mean()) ** 2)) if y.size else float("nan")


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054
                    ) -> tuple[float, float]:
    """Wilson score interval of a proportion `successes`/`n` (default: 95%); (NaN, NaN)
    for n = 0. Unlike the normal interval it stays inside [0, 1] and is not zero-width
    at 0/n or n/n, which matters for the small test sets of small silos."""
    if n <= 0:
        return float("nan"), float("nan")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def pooled(values: np.ndarray, weights: np.ndarray) -> float:
    """Test-count-weighted mean over silos, ignoring silos where the metric is undefined
    (NaN). A silo at ±inf (a diverged model) makes the pooled figure inf: never hidden."""
    values, weights = np.asarray(values, float), np.asarray(weights, float)
    inf = np.isinf(values) & (weights > 0)
    if inf.any():
        return float(values[inf][0]) if len(set(values[inf].tolist())) == 1 else float("nan")
    ok = np.isfinite(values) & (weights > 0)
    return float(np.sum(values[ok] * weights[ok]) / np.sum(weights[ok])) if ok.any() else float("nan")
