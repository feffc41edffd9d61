"""Is a result better than a model that learned nothing? Every run's final models are
judged against the best *constant* prediction on the same test rows, so a model that
predicts the majority class (or the mean) can never look fine.

The baseline a result must beat, per metric:

- accuracy: the **majority-class rate** -- the share of each silo's most frequent class
  among its own test rows, pooled like the metric (weighted by test counts). A model that
  predicts one class per silo scores at most this.
- auprc: the positive rate of the test rows (the AUPRC of an uninformative score).
- roc_auc: 0.5 (an uninformative score).
- mse: the MSE of predicting the mean of each silo's own test labels (their variance),
  pooled by test counts: no constant prediction does better.

For binary tasks the assessment also carries accuracy, balanced accuracy (mean recall per
class), AUROC and AUPRC over all test rows together (each row scored by its silo's personal
model), so a skewed table cannot hide behind accuracy. Per silo it carries the test size,
a 95% interval (Wilson for accuracy, normal approximation for MSE; none for the ranking
metrics) and a flag for tiny test sets (fewer than `TINY_TEST` rows), which are never
ranked as a "best" or "worst" silo.

Like every test metric of a run these are computed on held-out test rows for the
researcher and are not privatized (README "What is not counted").
"""

from __future__ import annotations

import numpy as np

from silofl.models import metrics as M

#: a silo with fewer test rows than this is flagged "tiny" and never ranked best/worst
TINY_TEST = 20

BASELINE_NAMES = {
    "accuracy": "majority-class rate",
    "auprc": "positive rate",
    "roc_auc": "uninformative AUROC",
    "mse": "MSE of predicting the test mean",
}

QUALITY_NOTE = (
    "Baselines are test-set statistics for the researcher, like every test metric (not "
    "privatized): the majority-class rate is the share of each silo's most frequent class "
    "among its own test rows, pooled by test counts (a model that predicts one class "
    "scores at most this); for MSE the baseline is predicting the mean of each silo's test "
    "labels; for AUPRC the positive rate, for AUROC 0.5. Balanced accuracy, AUROC and "
    "AUPRC are over all test rows together. Per-silo 95% intervals: Wilson (accuracy), "
    f"normal approximation (MSE); silos with fewer than {TINY_TEST} test rows are flagged "
    "tiny and not ranked.")


def assess(r, model, fed, label: str) -> dict:
    """The quality of one method's final personal models `r.params` (a `RunResult`) on the
    test rows of `fed` (the federation it trained on).

    Returns a JSON-ready dict: ``metric``, ``pooled``, ``baseline`` {name, value},
    ``beats_baseline`` (None when undefined), ``warning`` (None when it beats it),
    ``predicts_one_class``, ``per_silo`` [{silo, n_test, value, baseline, ci95, tiny,
    beats_baseline}],
    ``tiny_silos`` and, for classification, ``all_test_rows`` {accuracy, majority_rate,
    balanced_accuracy, and for binary tasks roc_auc, auprc, positive_rate}."""
    metric = r.metric
    classify = fed.task != "regression"
    per, ys, scores, preds = [], [], [], []
    one_class = []
    for k, s in enumerate(fed.silos):
        y = np.asarray(s.y_test)
        sc = np.asarray(model.predict(r.params[k], s.X_test)) if len(y) else None
        finite = sc is not None and bool(np.all(np.isfinite(sc)))
        value = float(r.final_per_silo[k])
        entry = {"silo": s.name, "n_test": int(len(y)), "value": value,
                 "baseline": _baseline(metric, y), "ci95": None,
                 "tiny": bool(len(y) < TINY_TEST)}
        if finite:
            entry["ci95"] = _interval(metric, y, sc, model.name)
            if classify:
                p = M.predicted_classes(sc, model.name)
                one_class.append(len(np.unique(p)) == 1)
                ys.append(y), scores.append(sc), preds.append(p)
        entry["beats_baseline"] = _beats(metric, value, entry["baseline"])
        per.append(entry)
    n = np.array([e["n_test"] for e in per], float)
    vals = np.array([e["value"] for e in per], float)
    base = np.array([e["baseline"] for e in per], float)
    base[np.isnan(vals)] = np.nan  # pooled over the silos the metric is pooled over
    pooled_base = M.pooled(base, n)
    pooled = float(r.final_pooled)
    beats = _beats(metric, pooled, pooled_base)
    all_one = bool(one_class) and all(one_class) and len(one_class) == int((n > 0).sum())
    out = {"metric": metric, "pooled": pooled,
           "baseline": {"name": BASELINE_NAMES[metric], "value": pooled_base},
           "beats_baseline": beats, "predicts_one_class": all_one,
           "per_silo": per, "tiny_silos": [e["silo"] for e in per if e["tiny"]],
           "warning": None}
    if classify and ys:
        out["all_test_rows"] = _all_rows(fed, ys, scores, preds)
    if beats is False or all_one:
        out["warning"] = (
            f"{label} does not beat the {BASELINE_NAMES[metric]} "
            f"{_fmt(pooled_base)} on the same test rows (pooled {metric} {_fmt(pooled)})"
            + (": it predicts one class in every silo" if all_one else ""))
    return out


def _baseline(metric: str, y: np.ndarray) -> float:
    if not len(y):
        return float("nan")
    if metric == "accuracy":
        return M.majority_rate(y)
    if metric == "auprc":
        return float(np.mean(y > 0.5))
    if metric == "roc_auc":
        return 0.5
    return M.constant_mse(y)


def _beats(metric: str, value: float, baseline: float) -> bool | None:
    """True/False; None where either side is undefined (NaN). A diverged model (inf MSE,
    NaN accuracy with a defined baseline) does not beat it."""
    if np.isnan(baseline):
        return None
    if metric == "mse":
        return bool(value < baseline)  # inf (diverged) < baseline is False
    if np.isnan(value):
        return False if metric == "accuracy" else None  # NaN accuracy: diverged
    return bool(value > baseline)


def _interval(metric: str, y: np.ndarray, scores: np.ndarray, model_name: str):
    """A 95% interval of one silo's metric, or None where none is computed."""
    n = len(y)
    if metric == "accuracy":
        correct = int(np.sum(M.predicted_classes(scores, model_name) == y.astype(np.int64)))
        return list(M.wilson_interval(correct, n))
    if metric == "mse" and n >= 2:
        with np.errstate(over="ignore"):
            se = (np.asarray(scores, float).reshape(n) - y) ** 2
            half = 1.959963984540054 * np.std(se, ddof=1) / np.sqrt(n)
        if np.isfinite(half):
            return [float(max(0.0, se.mean() - half)), float(se.mean() + half)]
    return None


def _all_rows(fed, ys, scores, preds) -> dict:
    y, p = np.concatenate(ys).astype(np.int64), np.concatenate(preds)
    out = {"n_test": int(len(y)), "accuracy": float(np.mean(p == y)),
           "majority_rate": M.majority_rate(y),
           "balanced_accuracy": M.balanced_accuracy(y, p)}
    if fed.task == "binary":
        s = np.concatenate([sc[:, 1] if sc.ndim == 2 else sc for sc in scores])
        out.update(roc_auc=M.roc_auc(y, s), auprc=M.auprc(y, s),
                   positive_rate=float(np.mean(y == 1)))
    return out


def _fmt(x: float) -> str:
    if x is None or np.isnan(x):
        return "n/a"
    return "inf" if not np.isfinite(x) else f"{x:.4f}" if abs(x) < 1e6 else f"{x:.4g}"


def warnings_of(quality: dict) -> list[str]:
    """The warning lines of a run's assessments (label → `assess`), in method order."""
    return [q["warning"] for q in quality.values() if q.get("warning")]


def silo_line(metric: str, value: float, y_test: np.ndarray) -> str:
    """One networked silo's test figure beside its baseline, e.g. ``0.8919 (maj. 0.8919,
    n=37, NOT BEATEN, TINY)``: a silo's own terminal must not make a one-class model look
    fine any more than `silofl run` does."""
    y = np.asarray(y_test)
    base = _baseline(metric, y)
    short = {"accuracy": "maj.", "auprc": "pos. rate", "roc_auc": "baseline",
             "mse": "const."}[metric]
    parts = [f"{short} {_fmt(base)}", f"n={len(y)}"]
    if _beats(metric, value, base) is False:
        parts.append("NOT BEATEN")
    if len(y) < TINY_TEST:
        parts.append("TINY")
    return f"{_fmt(value)} {metric} ({', '.join(parts)})"
