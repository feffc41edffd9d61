"""A newcomer's walk-through of issue 24 (trees) and 25 (lazy Parquet, Ray sweeps), from the
README and docs only, on a messy hospital CSV (text levels, blanks, a date, an id and a silo
column, four silos of uneven size). Each test is a step that failed or misled:

- `silofl audit` of a trees job whose `[data]` names a `person_column` stopped with
  "N person ids for M rows; give one person per row" (the tree canaries had no person id);
- `silofl sweep --engine ray` of a GLM grid on a lifetime store crashed in every worker with
  "unexpected AttributeError" (a detached job could not log a round's batched charges);
- `silofl predict --silo shared` on a `silofl run` directory, which the trees guide offered,
  answered "unknown silo 'shared'" without saying where the shared ensemble is;
- a job of fedavg + dp_gbdt was told to add "local" and "fedavg" (fedavg was there);
- `silofl audit`'s progress bar printed "0/None jobs";
- `[data] lazy = true` on a CSV said "ArrowInvalid; check it is Parquet" (now: lazy reads
  Parquet only: convert, or set lazy = false);
- the docs did not say that a lazy table refuses `person_column`, nor that sweeps refuse
  dp_gbdt (both errors are clear; the guides now say so up front).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

from silofl.cli import app

DOCS = Path(__file__).resolve().parents[1] / "docs" / "guides"
SIZES = {"St Mary": 260, "North General": 140, "Riverside": 90, "Hill": 60}


def _messy(n_seed: int = 0) -> pd.DataFrame:
    """Four hospitals of uneven size: text levels with stray spaces and case, blanks,
    a date and an id column, a binary text label."""
    rng = np.random.default_rng(n_seed)
    rows, pid = [], 0
    for h, n in SIZES.items():
        for _ in range(n):
            pid += 1
            age, smoker = int(rng.integers(18, 95)), str(rng.choice(["yes", "no", ""]))
            z = 0.05 * (age - 55) + (1.0 if smoker == "yes" else 0.0)
            rows.append({"patient_id": f"P{pid:05d}", "hospital": h,
                         "admit_date": f"2021-{int(rng.integers(1, 13)):02d}-01",
                         "age": age, "sex": str(rng.choice(["Male", "Female"])),
                         "smoker": smoker,
                         "bmi": "" if rng.random() < 0.05 else round(rng.normal(27, 5), 1),
                         "outcome": "readmitted" if rng.random() < 1 / (1 + np.exp(-z))
                         else "home"})
    return pd.DataFrame(rows)


SCHEMA = {
    "source": "test data dictionary", "silo_column": "hospital",
    "label": {"name": "outcome", "kind": "binary", "classes": ["home", "readmitted"]},
    "columns": [
        {"name": "age", "kind": "numeric", "lower": 18, "upper": 110, "nullable": False},
        {"name": "sex", "kind": "categorical", "levels": ["Female", "Male"],
         "nullable": False},
        {"name": "smoker", "kind": "categorical", "levels": ["no", "yes"], "nullable": True},
        {"name": "bmi", "kind": "numeric", "lower": 10, "upper": 60, "nullable": True},
    ],
}


def _job(tmp: Path, methods: list[str], **data) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    _messy().to_csv(tmp / "patients.csv", index=False)
    (tmp / "schema.toml").write_text(tomli_w.dumps(SCHEMA))
    raw = {"data": {"source": "table", "path": "patients.csv", "silo_column": "hospital",
                    "label_column": "outcome", "schema": "schema.toml", **data},
           "model": {"name": "logistic", "metric": "roc_auc"},
           "training": {"methods": methods, "rounds": 5},
           "trees": {"trees": 6},
           "privacy": {"epsilon": 1.0, "delta": 1e-4, "noise": "seeded"},
           "output": {"dir": str(tmp / "runs")}}
    (tmp / "job.toml").write_text(tomli_w.dumps(raw))
    return tmp / "job.toml"


@pytest.fixture(scope="module")
def trees_run(tmp_path_factory):
    """One scratch run of fedavg + dp_gbdt on the messy table: (its stdout, run dir)."""
    tmp = tmp_path_factory.mktemp("run")
    cfg = _job(tmp, ["fedavg", "dp_gbdt"])
    res = CliRunner().invoke(app, ["run", "--config", str(cfg), "--scratch"])
    assert res.exit_code == 0, res.output
    (run,) = [p for p in (tmp / "runs").iterdir() if p.is_dir()]
    return res.stdout, run


def test_the_trees_audit_of_a_job_with_a_person_column_runs(tmp_path):
    cfg = _job(tmp_path, ["dp_gbdt"], person_column="patient_id")
    res = CliRunner().invoke(app, ["audit", "--config", str(cfg), "--scratch",
                                   "--out", str(tmp_path / "audit")])
    assert res.exit_code == 0, res.output
    assert "person ids for" not in res.output
    assert "/None" not in res.output  # the progress bar: "0/?" until the total is known
    rep = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert rep  # the audit was written


def test_canaries_get_fresh_person_ids_of_the_silos_kind():
    from silofl.audit.gbdt import _canary_persons
    assert _canary_persons(None, 3) is None
    ints = _canary_persons(np.array([4, 9, 2]), 2)
    assert ints.tolist() == [4, 9, 2, 10, 11] and ints.dtype.kind == "i"
    text = _canary_persons(np.array(["P1", "P2"], dtype=object), 2)
    assert len(text) == 4 and len(set(text)) == 4 and list(text[:2]) == ["P1", "P2"]


def test_a_detached_job_logs_a_rounds_batched_charges(tmp_path):
    """What a Ray worker runs: the fused GLM path charges all silos' ledgers of a round
    through `charge_all`, whose one store transaction a detached job (no store) must log."""
    from silofl.experiments import sweep as S
    from silofl.experiments.sweep_config import load_sweep_config
    from silofl.privacy import events
    from silofl.privacy.ledger import charge_all
    from silofl.runtime.detached import detach
    raw = {"data": {"source": "heart", "test_fraction": 0.2},
           "model": {"name": "logistic", "metric": "accuracy"},
           "training": {"rounds": 2, "batch_size": 8, "clip": 1.0},
           "privacy": {"delta": 1e-4, "noise": "seeded"},
           "budget": {"store": str(tmp_path / "budget.sqlite"), "epsilon": 20.0},
           "sweep": {"methods": ["fedavg"], "epsilon": [1.0], "lr": [0.1], "seeds": [0],
                     "workers": 1, "results": "results.jsonl", "engine": "ray"}}
    (tmp_path / "sweep.toml").write_text(tomli_w.dumps(raw))
    sc = load_sweep_config(tmp_path / "sweep.toml")
    prep = S.prepare(sc)
    spec = next(s for s in S.expand(sc) if s.private)
    plans = S.calibrate_all(sc, prep, [spec])
    job = S.reserve_run(sc, spec, prep, plans, {})
    worker = detach(job)
    method, ps = next(iter(job.planned.items()))
    leds = worker.ledgers(method)
    charge_all(leds, [p.declared for p in ps], round=0, label="plan")
    assert sorted(worker.log) == sorted(
        (p.name, method, "plan", events.to_json(p.declared), 1) for p in ps)
    job.store.settle(job.run_id, [], status="failed")  # tidy: nothing was read


def test_predict_silo_shared_on_a_run_dir_says_where_the_shared_trees_are(trees_run,
                                                                          tmp_path):
    _, run = trees_run
    new = _messy(1).drop(columns=["outcome"]).head(10)
    new.to_csv(tmp_path / "new.csv", index=False)
    res = CliRunner().invoke(app, ["predict", "--run", str(run), "--silo", "shared",
                                   "--method", "dp_gbdt", "--data", str(tmp_path / "new.csv"),
                                   "--out", str(tmp_path / "p.csv")])
    assert res.exit_code == 2
    assert "shared.xgb.json" in res.output and "deployed silo" in res.output
    assert not (tmp_path / "p.csv").exists()


def test_the_trees_guides_xgboost_recipe_reproduces_silofls_scores(trees_run):
    xgb = pytest.importorskip("xgboost")
    import silofl
    _, run = trees_run
    p = silofl.load_run(run).predictor("Riverside", "dp_gbdt")
    man = json.loads((run / "models" / "dp_gbdt" / "manifest.json").read_text())
    entry = next(s for s in man["silos"] if s["name"] == "Riverside")
    b = xgb.Booster()
    b.load_model(str(run / "models" / "dp_gbdt" / entry["xgboost"]))
    new = _messy(2).drop(columns=["outcome"]).head(50).replace("", np.nan)  # as read_csv
    d = xgb.DMatrix(p.transform(new), feature_names=man["xgboost_feature_names"])
    np.testing.assert_allclose(b.predict(d), p.predict(new), atol=1e-5)  # float32 trees


def test_the_baseline_hint_names_only_the_missing_method(trees_run):
    out = " ".join(trees_run[0].split())  # rich wraps lines
    assert 'add "local" to training.methods' in out
    assert '"fedavg" to training.methods' not in out


def test_the_guides_say_what_lazy_tables_and_sweeps_refuse():
    own = " ".join((DOCS / "own-data.md").read_text().split())
    lazy = own[own.index("Not available lazily"):][:300]
    assert "person_column" in lazy
    sweeps = (DOCS / "sweeps.md").read_text()
    assert "not dp_gbdt" in sweeps


def test_a_lazy_config_on_a_csv_says_lazy_reads_parquet_only(tmp_path):
    cfg = _job(tmp_path, ["fedavg"], lazy=True)
    res = CliRunner().invoke(app, ["run", "--config", str(cfg), "--scratch"])
    assert res.exit_code == 2
    out = " ".join(res.output.split())
    assert "patients.csv" in out and "reads Parquet only" in out and "lazy = false" in out
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
