"""The `silofl` command line: the default run, a configured run on a CSV, `account`, and
bad input — which must exit with code 2, say what is wrong, and leave nothing behind."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pandas as pd
import pytest
import tomli_w
from dp_accounting import pld, rdp
from typer.testing import CliRunner

from silofl.algorithms import make_algorithm
from silofl.cli import app
from silofl.config import config_from_dict, load_config
from silofl.data import linear_silos
from silofl.data.federation import Federation, Silo
from silofl.errors import ConfigError, DataError
from silofl.experiments.run import run as run_experiment
from silofl.privacy import accounting as A
from silofl.privacy.accounting import RDP_ORDERS
from silofl.privacy.ledger import silo_file_id
from silofl.privacy.store_paths import DEMO_NOTE
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import SEEDED_NOTE, TrainingConfig, plan_silos

logging.getLogger("absl").setLevel(logging.ERROR)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SILOS = ("north", "south", "east")


def _flat(text: str) -> str:
    """Rich wraps long lines; compare on single-spaced text."""
    return " ".join(text.split())


def _invoke(args):
    return CliRunner().invoke(app, args)


def _rdp_eps(q, sigma, steps, delta):
    acc = rdp.RdpAccountant(orders=list(RDP_ORDERS))
    acc.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)),
                                        steps))
    return acc.get_epsilon(delta)


def _pld_eps(q, sigma, steps, delta):
    acc = pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)),
                                        steps))
    return acc.get_epsilon(delta)


def _frame(sizes=(50, 60, 45), seed=0) -> pd.DataFrame:
    """Three hospitals: a numeric column with a missing value, a categorical column, a
    TRUE/FALSE column and a binary label 'outcome'."""
    rng = np.random.default_rng(seed)
    parts = []
    for h, m in zip(SILOS, sizes):
        x = rng.normal(size=m)
        colour = rng.choice(["red", "green", "blue"], m)
        logit = 1.5 * x + (colour == "red")
        y = (rng.random(m) < 1 / (1 + np.exp(-logit))).astype(int)
        y[:4] = [0, 1, 0, 1]
        parts.append(pd.DataFrame({"hospital": h, "age": rng.normal(50, 10, m).round(1),
                                   "x": x, "colour": colour,
                                   "smoker": rng.choice(["TRUE", "FALSE"], m), "outcome": y}))
    df = pd.concat(parts, ignore_index=True)
    df.loc[7, "age"] = np.nan
    df.loc[70, "colour"] = np.nan
    return df


#: the public facts about `_frame`'s columns (a data dictionary, not read from the rows)
SCHEMA = {"silo_column": "hospital",
          "label": {"name": "outcome", "kind": "binary", "classes": [0, 1]},
          "columns": [{"name": "age", "kind": "numeric", "lower": 18, "upper": 100,
                       "nullable": True},
                      {"name": "x", "kind": "numeric", "lower": -4, "upper": 4},
                      {"name": "colour", "kind": "categorical",
                       "levels": ["blue", "green", "red"], "nullable": True},
                      {"name": "smoker", "kind": "binary"}]}


def _config(path: Path, csv: Path, *, schema: bool = True, **sections) -> Path:
    raw = {"data": {"source": "table", "path": str(csv), "silo_column": "hospital",
                    "label_column": "outcome"},
           "training": {"rounds": 5, "batch_size": 8},
           "privacy": {"epsilon": 2.0, "delta": 1e-4}}
    if schema:
        (path.parent / "schema.toml").write_text(tomli_w.dumps(SCHEMA))
        raw["data"]["schema"] = str(path.parent / "schema.toml")
    else:  # the data module's own checks on a table without schema (opted-in, listed)
        raw["data"]["standardize"] = "uncharged"
    for sec, vals in sections.items():
        raw.setdefault(sec, {}).update(vals)
    path.write_text(tomli_w.dumps(raw))
    return path


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SILOFL_HOME", str(tmp_path / "home"))  # default stores live here
    return tmp_path


@pytest.fixture
def csv(workdir):
    p = workdir / "hospitals.csv"
    _frame().to_csv(p, index=False)
    return p


# --- successful runs -------------------------------------------------------------------------

def test_run_with_no_arguments_writes_run_directory(workdir):
    res = _invoke(["run", "-q"])
    assert res.exit_code == 0, res.output
    runs = [p for p in (workdir / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1
    # the built-in public data charges the labelled demo store in the silofl home, never a
    # store in the output folder (another folder would be another budget)
    assert (workdir / "home" / "stores" / "demo-heart.sqlite").is_file()
    assert not (workdir / "runs" / "budget.sqlite").exists()
    d = runs[0]
    for f in ("config.toml", "history.json", "privacy_report.json", "summary.json",
              "metric_over_rounds.png"):
        assert (d / f).is_file() and (d / f).stat().st_size > 0, f
    assert (d / "metric_over_rounds.png").read_bytes()[:8] == PNG_MAGIC
    out = res.stdout
    for m in ("local", "fedavg", "mrmtl"):
        assert m in out
    assert "Run directory" in _flat(out)
    silos = ["Cleveland", "Hungary", "Switzerland", "VA Long Beach"]
    for m in ("local", "fedavg", "mrmtl"):
        for s in silos:
            lines = (d / "ledgers" / m / f"{silo_file_id(s)}.jsonl").read_text().splitlines()
            assert len(lines) == 30  # default rounds
            assert [json.loads(x)["round"] for x in lines] == list(range(1, 31))
    hist = json.loads((d / "history.json").read_text())
    assert set(hist) == {"local", "fedavg", "mrmtl(λ=0.3)"}
    assert all(len(h["pooled"]) == 30 and h["metric"] == "accuracy" for h in hist.values())
    priv = json.loads((d / "privacy_report.json").read_text())
    for rows in priv["methods"].values():
        assert len(rows) == 4
        for r in rows:
            assert r["within_target"] and r["epsilon"] <= 1.0
            assert r["epsilon_pld"] <= r["epsilon_rdp"]
    # the default job fits its default budget honestly: all three methods composed
    assert len(priv["combined"]) == 4
    for c in priv["combined"]:
        assert c["within_target"] and c["epsilon"] <= 1.0 and c["methods"] == 3
    assert priv["noise"] == "secure" and priv["notes"] == [DEMO_NOTE]  # labelled
    assert priv["demo_store"] and priv["budget_store"].endswith("demo-heart.sqlite")
    assert [x["silo"] for x in priv["lifetime"]] == silos
    assert "add/remove one record" in priv["neighbouring_relation"]
    summary = json.loads((d / "summary.json").read_text())
    assert [m["name"] for m in summary["methods"]] == ["local", "fedavg", "mrmtl"]
    assert all(0.4 < m["pooled"] <= 1.0 for m in summary["methods"])
    assert load_config(d / "config.toml").to_dict() == load_config(None).to_dict()


@pytest.mark.slow
def test_run_with_config_on_csv(workdir, csv):
    cfg = _config(workdir / "small.toml", csv, output={"name": "small"})
    res = _invoke(["run", "--config", str(cfg), "-q"])
    assert res.exit_code == 0, res.output
    d = workdir / "runs" / "small"
    assert (d / "metric_over_rounds.png").read_bytes()[:8] == PNG_MAGIC
    assert load_config(d / "config.toml").to_dict() == load_config(cfg).to_dict()
    priv = json.loads((d / "privacy_report.json").read_text())
    for method in ("local", "fedavg", "mrmtl"):
        for s, row in zip(SILOS, priv["methods"][method if method != "mrmtl" else "mrmtl(λ=0.3)"]):
            assert row["silo"] == s
            lines = [json.loads(x) for x in
                     (d / "ledgers" / method / f"{silo_file_id(s)}.jsonl").read_text()
                     .splitlines()]
            assert len(lines) == 5
            steps = sum(x["event"]["count"] for x in lines)
            assert steps == 5 * row["steps_per_pass"]
            q, sigma = row["sampling_rate"], row["noise_multiplier"]
            assert q == pytest.approx(8 / row["n_train"])
            # the report's ε equals dp_accounting's for the steps the ledger recorded
            assert row["epsilon_rdp"] == pytest.approx(_rdp_eps(q, sigma, steps, 1e-4), rel=1e-9)
            assert row["epsilon_rdp"] <= 2.0 * (1 + 1e-9)
    # releasing all three methods composes their costs
    for c in priv["combined"]:
        row = next(r for r in priv["methods"]["local"] if r["silo"] == c["silo"])
        assert c["epsilon_rdp"] == pytest.approx(
            _rdp_eps(row["sampling_rate"], row["noise_multiplier"], 15 * row["steps_per_pass"],
                     1e-4), rel=1e-9)
    hist = json.loads((d / "history.json").read_text())
    assert hist["local"]["silos"] == list(SILOS) and hist["local"]["rounds"] == [1, 2, 3, 4, 5]
    # a second run with the same name gets a fresh directory; --out moves the base folder
    for out, expect in ((None, workdir / "runs" / "small-1"), ("elsewhere", workdir / "elsewhere" / "small")):
        extra = ["--out", out] if out else []
        res = _invoke(["run", "--config", str(cfg), "-q", "--no-privacy", *extra])
        assert res.exit_code == 0, res.output
        assert (expect / "summary.json").is_file()
        assert not (expect / "ledgers").exists()
        assert json.loads((expect / "summary.json").read_text())["private"] is False
        assert "No differential privacy" in _flat(res.stdout)


def test_run_api_is_deterministic_and_writes_nothing_without_output_dir(workdir, csv):
    (workdir / "schema.toml").write_text(tomli_w.dumps(SCHEMA))
    raw = {"data": {"source": "table", "path": str(csv), "silo_column": "hospital",
                    "label_column": "outcome", "schema": str(workdir / "schema.toml")},
           "training": {"rounds": 3, "batch_size": 8, "methods": ["mrmtl"], "lam": 1.0},
           "privacy": {"epsilon": 2.0, "delta": 1e-4, "noise": "seeded"},
           "budget": {"epsilon": 6.0},  # room for both runs
           "output": {"dir": ""}}
    a = run_experiment(config_from_dict(raw))
    b = run_experiment(config_from_dict(raw))
    assert a.run_dir is None and not (workdir / "runs").exists()
    assert a.results[0].history.to_dict() == b.results[0].history.to_dict()
    # no output directory is no escape: both runs are charged to the default store
    assert not a.scratch and a.store == b.store == str(workdir / "home" / "stores" /
                                                       "default.sqlite")
    assert a.summary()["budget_store"] == a.store
    assert a.summary()["notes"] == [SEEDED_NOTE]
    assert a.summary()["methods"][0]["method"] == "mrmtl(λ=1)"


# --- account ---------------------------------------------------------------------------------

def test_account_epsilon_matches_dp_accounting():
    res = _invoke(["account", "--n", "1000", "--batch", "64", "--epochs", "10", "--sigma", "1",
                   "--delta", "1e-5", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["steps"] == 156 and out["q"] == pytest.approx(0.064)
    assert out["epsilon_rdp"] == pytest.approx(_rdp_eps(0.064, 1.0, 156, 1e-5), rel=1e-9)
    # PLD at the grid silofl picked equals dp_accounting's own at that grid
    ev = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.064, dpa.GaussianDpEvent(1.0)), 156)
    acc = pld.PLDAccountant(value_discretization_interval=A.pld_grid(ev, 1e-5))
    acc.compose(ev)
    assert out["epsilon_pld"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)
    res = _invoke(["account", "--n", "1000", "--batch", "64", "--steps", "20", "--sigma", "2",
                   "--delta", "1e-5"])
    assert res.exit_code == 0 and "epsilon_rdp" in res.stdout


def test_account_calibrates_sigma():
    res = _invoke(["account", "--n", "1000", "--batch", "64", "--epochs", "10", "--epsilon", "1",
                   "--delta", "1e-5", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    s_rdp, s_pld = out["sigma_rdp"], out["sigma_pld"]
    assert _rdp_eps(0.064, s_rdp, 156, 1e-5) <= 1.0
    assert _rdp_eps(0.064, 0.99 * s_rdp, 156, 1e-5) > 1.0
    assert _pld_eps(0.064, s_pld, 156, 1e-5) <= 1.0
    assert _pld_eps(0.064, 0.99 * s_pld, 156, 1e-5) > 1.0
    assert s_pld < s_rdp  # PLD is the tighter accountant, so it needs less noise


@pytest.mark.parametrize("args,words", [
    (["--n", "1000", "--batch", "64", "--delta", "1e-5", "--sigma", "1"], "exactly one of --steps"),
    (["--n", "1000", "--batch", "64", "--delta", "1e-5", "--steps", "5"], "exactly one of --sigma"),
    (["--n", "1000", "--batch", "2000", "--delta", "1e-5", "--steps", "5", "--sigma", "1"], "batch < n"),
    (["--n", "1000", "--batch", "64", "--delta", "1", "--steps", "5", "--sigma", "1"], "delta must be in"),
    (["--n", "1000", "--batch", "64", "--delta", "1e-5", "--steps", "5", "--sigma", "0"],
     "sigma must be positive"),
    (["--n", "1000", "--batch", "64", "--delta", "1e-5", "--steps", "5", "--epsilon", "-1"],
     "epsilon must be positive"),
])
def test_account_bad_input(args, words):
    res = _invoke(["account", *args])
    assert res.exit_code == 2
    assert words in _flat(res.stderr)


# --- bad input ------------------------------------------------------------------------------

def _assert_refused(res, workdir, *words):
    assert res.exit_code == 2, res.output
    msg = _flat(res.stderr)
    assert msg.startswith("error:"), msg
    for w in words:
        assert w in msg, (w, msg)
    assert "Traceback" not in res.output
    # nothing written: no run directory, hence no ledger and no budget spent
    assert not (workdir / "runs").exists() or not any((workdir / "runs").iterdir())


def test_missing_config_file(workdir):
    _assert_refused(_invoke(["run", "--config", "nope.toml", "-q"]), workdir,
                    "config file", "nope.toml", "does not exist")


BAD_CONFIGS = [
    ({"data": {"path": "missing.csv"}}, ["data file not found", "missing.csv"]),
    ({"data": {"silo_column": "hospitl"}}, ["unknown silo column 'hospitl'", "Did you mean 'hospital'?"]),
    ({"data": {"label_column": "outcom"}}, ["unknown label column 'outcom'", "Did you mean 'outcome'?"]),
    ({"model": {"name": "logisitc"}}, ["unknown model 'logisitc'", "Did you mean 'logistic'?"]),
    ({"model": {"name": "linear"}}, ["model 'linear' needs regression labels", "binary task"]),
    ({"privacy": {"epsilon": 0.0}}, ["privacy.epsilon must be positive"]),
    ({"privacy": {"epsilon": -1.0}}, ["privacy.epsilon must be positive"]),
    ({"privacy": {"delta": 0.0}}, ["privacy.delta must be positive"]),
    ({"privacy": {"delta": -1e-5}}, ["privacy.delta must be positive"]),
    ({"privacy": {"delta": 1.0}}, ["privacy.delta must be in (0, 0.5)"]),
    # b ≥ n_k is allowed (full-batch steps, q = 1, with a notice: test_tuning.py)
    ({"training": {"batch_size": 0}}, ["batch_size must be a positive integer"]),
    ({"training": {"clip": 0.0}}, ["clip must be a positive number"]),
    ({"training": {"clip": -1.0}}, ["clip must be a positive number"]),
    ({"training": {"lam": -0.5}}, ["'training.lam' must be a number ≥ 0 or \"auto\""]),
    ({"training": {"lr": -0.1}}, ["learning rate lr must be a non-negative number"]),
    ({"training": {"methods": ["local", "fedprx"]}}, ["unknown method 'fedprx'",
                                                      "Did you mean 'fedprox'?"]),
    ({"training": {"methods": []}}, ["training.methods is empty"]),
    ({"training": {"rouns": 5}}, ["unknown config key 'training.rouns'", "did you mean 'training.rounds'?"]),
    ({"privacy": {"epsilon": 1e-4}, "training": {"rounds": 200}},
     ["no noise multiplier up to 1e4 reaches", "too strict"]),
    ({"privacy": {"silos": {"nrth": {"epsilon": 1.0}}}}, ["names no silo", "Did you mean 'north'?"]),
    ({"privacy": {"accountant": "moments"}}, ["accountant must be one of rdp, pld"]),
    ({"training": {"rounds": "ten"}}, ["'training.rounds' must be of type int"]),
]


@pytest.mark.parametrize("sections,words", BAD_CONFIGS,
                         ids=[str(i) for i in range(len(BAD_CONFIGS))])
def test_bad_config_refused(workdir, csv, sections, words):
    cfg = _config(workdir / "bad.toml", csv, **sections)
    _assert_refused(_invoke(["run", "--config", str(cfg), "-q"]), workdir, *words)


@pytest.mark.parametrize("sections,words", [
    ({"privacy": {"silos": {"nrth": {"epsilon": 1.0}}}}, ["[privacy.silos.nrth]"]),
    ({"trainig": {"rounds": 5}}, ["[trainig]", "[training]"]),
])
def test_error_messages_keep_bracketed_names(workdir, csv, sections, words):
    cfg = _config(workdir / "bad.toml", csv, **sections)
    _assert_refused(_invoke(["run", "--config", str(cfg), "-q"]), workdir, *words)


def _bad_table(workdir, mutate):
    df = _frame()
    df = mutate(df)
    p = workdir / "bad.csv"
    df.to_csv(p, index=False)
    return _config(workdir / "bad.toml", p, schema=False)


def _with_id(df):
    df["patient_id"] = [f"P{i:04d}" for i in range(len(df))]
    return df


def _with_inf(df):
    df["bad"] = np.inf
    return df


def _tiny_silo(df):
    return pd.concat([df, pd.DataFrame({"hospital": ["west"], "age": [40.0], "x": [0.1],
                                        "colour": ["red"], "smoker": ["TRUE"], "outcome": [1]})],
                     ignore_index=True)


def _single_class(df):
    df.loc[df["hospital"] == "south", "outcome"] = 0
    return df


def _regression_label(df):
    df["outcome"] = df["x"] * 3.7 + 0.123
    return df


BAD_TABLES = [
    (_with_id, ["non-numeric feature that cannot be encoded", "patient_id"]),
    (_with_inf, ["column 'bad'", "infinite"]),
    (_tiny_silo, ["silo 'west' has 1 training example(s)", "at least 2"]),
    (_single_class, ["silo 'south' has a single class"]),
    (_regression_label, ["model 'logistic' needs binary labels", "regression task"]),
]


@pytest.mark.parametrize("mutate,words", BAD_TABLES, ids=[m.__name__ for m, _ in BAD_TABLES])
def test_bad_table_refused(workdir, mutate, words):
    cfg = _bad_table(workdir, mutate)
    _assert_refused(_invoke(["run", "--config", str(cfg), "-q"]), workdir, *words)


def test_unknown_privacy_silo_via_api(workdir, csv):
    cfg = config_from_dict({"data": {"source": "table", "path": str(csv),
                                     "silo_column": "hospital", "label_column": "outcome",
                                     "standardize": "uncharged"},
                            "privacy": {"silos": {"nrth": {"epsilon": 1.0}}}})
    with pytest.raises(ConfigError, match=r"\[privacy\.silos\.nrth\] names no silo"):
        run_experiment(cfg, workdir / "out")
    assert not (workdir / "out").exists()


def test_differing_feature_schemas_rejected_by_federation():
    rng = np.random.default_rng(0)
    a = Silo("a", rng.normal(size=(10, 3)), rng.normal(size=10), rng.normal(size=(3, 3)),
             rng.normal(size=3))
    b = Silo("b", rng.normal(size=(10, 4)), rng.normal(size=10), rng.normal(size=(3, 4)),
             rng.normal(size=3))
    with pytest.raises(DataError, match="silo 'b' has 4 features .* schema has 3"):
        Federation([a, b], ["f0", "f1", "f2"], "regression")


def test_weak_delta_warns_but_runs(workdir, csv):
    """δ ≥ 1/n_k is accepted with a warning explaining the weakness (n_k ≈ 40 here); only
    the silo whose own δ is weak is named."""
    cfg = _config(workdir / "weak.toml", csv, privacy={"silos": {"east": {"delta": 0.05}}},
                  training={"rounds": 2, "methods": ["local"]}, output={"dir": ""})
    with warnings.catch_warnings():  # a fresh process shows it once; this worker may have
        warnings.simplefilter("always")  # seen the same warning in an earlier test
        res = _invoke(["run", "--config", str(cfg), "-q"])
    assert res.exit_code == 0, res.output
    msg = _flat(res.stderr)
    assert "warning: silo 'east': delta = 0.05 ≥ 1/n" in msg
    assert "publishes one random record" in msg and "weak" in msg
    assert "'north'" not in msg and "'south'" not in msg
    assert not (workdir / "runs").exists()  # output.dir = "" writes nothing
    # through the API the same condition is a UserWarning
    fed = linear_silos(num_silos=2, sizes=[30, 300], dim=2, seed=0).with_targets(
        PrivacyTarget(1.0, 0.02))  # 1/30 > δ = 0.02 ≥ 1/300
    with pytest.warns(UserWarning, match="silo-01.*guarantee is weak") as rec:
        plan_silos(fed, make_algorithm("local"), TrainingConfig(rounds=2, batch_size=5))
    assert [w for w in rec if "silo-00" in str(w.message)] == []
