"""A useless model never looks fine (issue 19, part 4): every classification result stands
beside the majority-class rate of the same test rows, a model that does not beat it is
warned about (terminal and JSON), binary tasks report balanced accuracy, AUROC and AUPRC,
and per-silo figures carry their test size and a 95% interval; tiny test sets are never
shown as a "best silo". Metrics are checked against scikit-learn and SciPy."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest
from sklearn.metrics import average_precision_score, balanced_accuracy_score, roc_auc_score
from typer.testing import CliRunner

from silofl.cli import app
from silofl.data.federation import Federation, Silo
from silofl.experiments.quality import TINY_TEST, assess
from silofl.models import metrics as M


def _flat(text: str) -> str:
    return " ".join(text.split())


def _table(path: Path, *, informative: bool, sizes=(400, 400, 400), seed=0) -> Path:
    """Three hospitals, two numeric features, a binary label with ~16% positives that the
    features predict (`informative`) or not at all."""
    rng = np.random.default_rng(seed)
    parts = []
    for h, n in zip(("A", "B", "C"), sizes):
        x1, x2 = rng.normal(size=n), rng.normal(size=n)
        y = (x1 > 1.0) if informative else (rng.random(n) < 0.16)
        parts.append(pd.DataFrame({"hospital": h, "x1": x1.round(4), "x2": x2.round(4),
                                   "y": y.astype(int)}))
    pd.concat(parts, ignore_index=True).to_csv(path, index=False)
    return path


SCHEMA = """source = "test: public facts"
silo_column = "hospital"
[label]
name = "y"
kind = "binary"
classes = [0, 1]
[[columns]]
name = "x1"
kind = "numeric"
lower = -6
upper = 6
mean = 0
scale = 1
[[columns]]
name = "x2"
kind = "numeric"
lower = -6
upper = 6
mean = 0
scale = 1
"""


def _config(d: Path, table: Path, extra: str = "") -> Path:
    (d / "schema.toml").write_text(SCHEMA)
    cfg = d / "run.toml"
    cfg.write_text(f"""[data]
source = "table"
path = "{table}"
silo_column = "hospital"
label_column = "y"
schema = "{d / 'schema.toml'}"
[output]
dir = "{d / 'runs'}"
name = "r"
[budget]
scratch = true
[privacy]
noise = "seeded"
{extra}""")
    return cfg


def _run(args) -> tuple[int, str]:
    res = CliRunner().invoke(app, args)
    return res.exit_code, res.output


def test_majority_class_model_is_flagged_in_terminal_and_json(tmp_path):
    """16% positives, features carry nothing: every method predicts the majority class;
    the run says so, beside the majority rate, in the terminal, summary.json and
    history.json."""
    csv = _table(tmp_path / "imb.csv", informative=False)
    cfg = _config(tmp_path, csv, "[training]\nrounds = 3\n")
    code, out = _run(["run", "-c", str(cfg), "-q"])
    assert code == 0, out
    flat = _flat(out)
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    hist = json.loads((tmp_path / "runs" / "r" / "history.json").read_text())
    assert len(summary["methods"]) == 3
    for m in summary["methods"]:
        q = m["quality"]
        # the majority rate, independently: each silo's most frequent class on its test rows
        n = np.array([e["n_test"] for e in q["per_silo"]], float)
        assert q["baseline"]["name"] == "majority-class rate"
        assert 0.75 < q["baseline"]["value"] < 0.92
        assert q["beats_baseline"] is False and q["predicts_one_class"] is True
        assert q["pooled"] == pytest.approx(q["baseline"]["value"], abs=1e-12)
        assert q["all_test_rows"]["balanced_accuracy"] == pytest.approx(0.5)
        assert int(n.sum()) == q["all_test_rows"]["n_test"]
        label = m["method"]
        assert q["warning"].startswith(f"{label} does not beat the majority-class rate")
        assert "predicts one class" in q["warning"]
        assert q["warning"] in summary["quality_warnings"]
        assert f"warning: {q['warning']}" in flat  # printed in the terminal
        assert f"{q['baseline']['value']:.4f}" in flat  # the rate beside the result
        assert hist[label]["final_quality"]["warning"] == q["warning"]
        for e in q["per_silo"]:  # test size and a Wilson interval, checked with SciPy
            k = round(e["value"] * e["n_test"])
            want = binomtest(k, e["n_test"]).proportion_ci(method="wilson")
            assert e["ci95"] == pytest.approx([want.low, want.high], abs=1e-9)
            assert e["baseline"] == pytest.approx(e["value"])  # one class, per silo too
    assert "NOT" in flat and "BEATEN" in flat  # marked in the table (a wrapped cell)
    assert "balanced" in flat and "AUROC" in flat and "AUPRC" in flat
    assert "not privatized" in summary["quality_note"]


def test_no_warning_when_the_model_clearly_beats_the_majority_rate(tmp_path):
    """The same shape of table with an informative feature: no warning anywhere."""
    csv = _table(tmp_path / "inf.csv", informative=True)
    cfg = _config(tmp_path, csv, "[training]\nrounds = 15\nlr = 0.5\n")
    code, out = _run(["run", "-c", str(cfg), "-q", "--no-privacy"])
    assert code == 0, out
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert summary["quality_warnings"] == []
    for m in summary["methods"]:
        q = m["quality"]
        assert q["beats_baseline"] is True and q["warning"] is None
        assert q["pooled"] > q["baseline"]["value"] + 0.03
        assert q["all_test_rows"]["roc_auc"] > 0.9
        assert q["all_test_rows"]["balanced_accuracy"] > 0.7
    assert "does not beat" not in out and "NOT BEATEN" not in out


def test_a_tiny_test_set_is_never_the_best_silo(tmp_path):
    """A silo with a handful of test rows scoring 1.0 is flagged and not ranked."""
    csv = _table(tmp_path / "t.csv", informative=True, sizes=(400, 400, 30), seed=3)
    cfg = _config(tmp_path, csv, "[training]\nrounds = 3\n")
    code, out = _run(["run", "-c", str(cfg), "-q", "--no-privacy"])
    assert code == 0, out
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    for m in summary["methods"]:
        per = {e["silo"]: e for e in m["quality"]["per_silo"]}
        assert per["C"]["n_test"] == 6 and per["C"]["tiny"] is True
        assert per["A"]["tiny"] is False and m["quality"]["tiny_silos"] == ["C"]
        lo, hi = per["C"]["ci95"]
        assert hi - lo > 0.3  # six rows say little, and the interval shows it
    flat = _flat(out)
    assert f"fewer than {TINY_TEST} test rows are not ranked: C (n=6)" in flat
    silo_rows = flat.split("per silo")[1].split("fewer than")[0]
    assert " C n=" not in silo_rows  # never shown as worst or best
    assert "n=80" in silo_rows  # the ranked silos carry their test size


@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (3, 6), (0, 25), (25, 25), (50, 61),
                                 (412, 500)])
def test_wilson_interval_matches_scipy(k, n):
    want = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = M.wilson_interval(k, n)
    assert lo == pytest.approx(want.low, abs=1e-9) and hi == pytest.approx(want.high, abs=1e-9)


def test_ranking_metrics_and_balanced_accuracy_match_sklearn():
    rng = np.random.default_rng(7)
    for _trial in range(20):
        n = int(rng.integers(5, 300))
        y = (rng.random(n) < rng.uniform(0.05, 0.5)).astype(int)
        if y.min() == y.max():
            y[0] = 1 - y[0]
        s = rng.random(n).round(int(rng.integers(1, 4)))  # rounding makes ties
        assert M.roc_auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
        assert M.auprc(y, s) == pytest.approx(average_precision_score(y, s), abs=1e-12)
        pred = M.predicted_classes(s)
        assert M.balanced_accuracy(y, pred) == pytest.approx(
            balanced_accuracy_score(y, pred), abs=1e-12)
    y3 = rng.integers(0, 3, 200)
    p3 = rng.integers(0, 3, 200)
    assert M.balanced_accuracy(y3, p3) == pytest.approx(balanced_accuracy_score(y3, p3))
    assert M.balanced_accuracy(y3, np.zeros(200, int)) == pytest.approx(1 / 3)


def test_majority_rate_and_constant_mse():
    assert M.majority_rate(np.array([0, 0, 1, 0, 2])) == pytest.approx(0.6)
    y = np.array([1.0, 2.0, 4.0, 9.0])
    assert M.constant_mse(y) == pytest.approx(np.var(y))
    assert np.isnan(M.majority_rate(np.array([]))) and np.isnan(M.constant_mse([]))


class _Mean:
    """A regression 'model' whose parameters are its constant prediction."""
    name = "linear"

    def predict(self, w, X):
        return np.full(len(X), float(w[0])) + X[:, 0] * float(w[1])


def _regression_fed(rng) -> Federation:
    silos = []
    for name, n in (("a", 50), ("b", 40)):
        X = rng.normal(size=(n, 1))
        y = 3 * X[:, 0] + rng.normal(0.0, 0.1, n) + (5 if name == "b" else 0)
        silos.append(Silo(name, X[:40], y[:40], X[40:] if n > 40 else X[:10],
                          y[40:] if n > 40 else y[:10]))
    return Federation(silos, ["x"], "regression")


def test_regression_baseline_is_predicting_the_test_mean():
    rng = np.random.default_rng(0)
    fed = _regression_fed(rng)
    n = np.array([s.n_test for s in fed.silos], float)
    var = np.array([np.var(s.y_test) for s in fed.silos])
    want = float(np.sum(var * n) / n.sum())

    def result(params):
        per = [float(np.mean((_Mean().predict(params[k], s.X_test) - s.y_test) ** 2))
               for k, s in enumerate(fed.silos)]
        return SimpleNamespace(metric="mse", params=params, final_per_silo=per,
                               final_pooled=M.pooled(per, n))
    useless = np.array([[0.0, 0.0], [0.0, 0.0]])  # predicts 0 everywhere
    q = assess(result(useless), _Mean(), fed, "local")
    assert q["baseline"]["value"] == pytest.approx(want)
    assert q["beats_baseline"] is False and "does not beat the MSE" in q["warning"]
    good = np.array([[0.0, 3.0], [5.0, 3.0]])
    q = assess(result(good), _Mean(), fed, "local")
    assert q["beats_baseline"] is True and q["warning"] is None
    for e in q["per_silo"]:  # the interval holds the silo's own MSE
        assert e["ci95"][0] <= e["value"] <= e["ci95"][1]
    diverged = np.array([[np.inf, 0.0], [0.0, 0.0]])
    q = assess(result(diverged), _Mean(), fed, "local")
    assert q["beats_baseline"] is False  # an inf MSE never beats anything
