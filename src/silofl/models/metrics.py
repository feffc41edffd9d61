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


def auprc(y, scores) -> float:
    """Average precision (area under the precision-recall curve, step-wise);
    NaN when y has no positives."""
    y = np.asarray(y) > 0.5
    if scores.ndim == 2:
        scores = scores[:, 1]
    if not y.any() or _diverged(scores):
        return float("nan")
    order = np.argsort(-scores, kind="mergesort")
    s, yy = scores[order], y[order]
    # group ties: precision/recall evaluated at the last index of each distinct score
    last = np.r_[np.nonzero(np.diff(s))[0], len(s) - 1]
    tp = np.cumsum(yy)[last]
    precision = tp / (last + 1)
    recall = tp / y.sum()
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


def pooled(values: np.ndarray, weights: np.ndarray) -> float:
    """Test-count-weighted mean over silos, ignoring silos where the metric is undefined
    (NaN). A silo at ±inf (a diverged model) makes the pooled figure inf: never hidden."""
    values, weights = np.asarray(values, float), np.asarray(weights, float)
    inf = np.isinf(values) & (weights > 0)
    if inf.any():
        return float(values[inf][0]) if len(set(values[inf].tolist())) == 1 else float("nan")
    ok = np.isfinite(values) & (weights > 0)
    return float(np.sum(values[ok] * weights[ok]) / np.sum(weights[ok])) if ok.any() else float("nan")
