"""The bad-input corpus: every failure is clean.

Each case runs one `silofl` command on one bad input or fault and must exit with code 2,
name the problem, print no traceback and no record value (the sentinel SECRET), write
nothing (the case's folder is unchanged) and spend no budget (no charge in any store).
"""

from __future__ import annotations

import copy
import fcntl
import json
import logging
import math
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

from pandemic.conftest import small_outbreak  # noqa: F401 — the shared pandemic fixture
from silo_tables import three_silo_frame
from silofl.cli import app
from silofl.experiments import sweep_results as sweep_mod
from silofl.io import dumps_strict, write_json_atomic
from silofl.models.metrics import accuracy, mse, pooled

logging.getLogger("absl").setLevel(logging.ERROR)

SECRET = 987654.321  # a record value no message may quote
SCHEMA = {"silo_column": "hospital",
          "label": {"name": "outcome", "kind": "binary", "classes": [0, 1]},
          "columns": [{"name": "x", "kind": "numeric", "lower": -4, "upper": 4},
                      {"name": "colour", "kind": "categorical",
                       "levels": ["blue", "green", "red"]}]}
REG_SCHEMA = {"silo_column": "hospital", "label": {"name": "outcome", "kind": "regression"},
              "columns": SCHEMA["columns"]}


def _frame(n: int = 30) -> pd.DataFrame:
    return three_silo_frame(n)


@dataclass
class Env:
    root: Path
    csv: Path
    schema: Path
    reg_schema: Path
    results: Path        # a finished sweep's results file
    sweep_cfg: dict      # its config (absolute data paths)
    outbreak: Path | None = None


def _run_cfg(env: Env, d: Path, csv: Path | None = None, schema: Path | None = None,
             **sections) -> Path:
    raw = {"data": {"source": "table", "path": str(csv or env.csv), "silo_column": "hospital",
                    "label_column": "outcome", "schema": str(schema or env.schema)},
           "training": {"rounds": 2, "batch_size": 4, "methods": ["local"]},
           "privacy": {"epsilon": 2.0, "delta": 1e-4},
           "budget": {"store": str(d / "store.sqlite")}}
    for sec, vals in sections.items():
        for k, v in vals.items():
            if v is None:
                raw.setdefault(sec, {}).pop(k, None)
            else:
                raw.setdefault(sec, {})[k] = v
    p = d / "run.toml"
    p.write_text(tomli_w.dumps(raw))
    return p


def _sweep_raw(env: Env, **sections) -> dict:
    raw = copy.deepcopy(env.sweep_cfg)
    raw["budget"] = {}
    for sec, vals in sections.items():
        for k, v in vals.items():
            if v is None:
                raw.setdefault(sec, {}).pop(k, None)
            else:
                raw.setdefault(sec, {})[k] = v
    return raw


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Env:
    root = tmp_path_factory.mktemp("failures")
    csv = root / "base.csv"
    _frame().to_csv(csv, index=False)
    (root / "schema.toml").write_text(tomli_w.dumps(SCHEMA))
    (root / "reg_schema.toml").write_text(tomli_w.dumps(REG_SCHEMA))
    raw = {"data": {"source": "table", "path": str(csv), "silo_column": "hospital",
                    "label_column": "outcome", "schema": str(root / "schema.toml")},
           "training": {"rounds": 2, "batch_size": 4},
           "privacy": {"delta": 1e-4, "noise": "seeded"},
           "sweep": {"methods": ["local"], "epsilon": [2.0], "nonprivate": False,
                     "lam": [0.1], "lr": [0.1], "seeds": [0], "workers": 1,
                     "results": str(root / "done.jsonl")}}
    (root / "sweep.toml").write_text(tomli_w.dumps(raw))
    res = CliRunner().invoke(app, ["sweep", str(root / "sweep.toml"), "-q"])
    assert res.exit_code == 0, res.output
    return Env(root, csv, root / "schema.toml", root / "reg_schema.toml", root / "done.jsonl",
               raw)


# --- helpers that build one bad input in the case's folder ---------------------------------

def _csv(d: Path, df: pd.DataFrame, name: str = "data.csv") -> Path:
    p = d / name
    df.to_csv(p, index=False)
    return p


def _bad_data(change: Callable[[pd.DataFrame], pd.DataFrame], schema="schema", **sections):
    """A run on the base frame after `change` (schema: "schema", "reg" or None)."""
    def setup(env: Env, d: Path) -> list[str]:
        csv = _csv(d, change(_frame()))
        if schema is None:
            extra = {"data": {"schema": None, "standardize": "uncharged"}}
            for k, v in sections.items():
                extra.setdefault(k, {}).update(v)
            return ["run", "-q", "-c", str(_run_cfg(env, d, csv, **extra))]
        sch = env.reg_schema if schema == "reg" else env.schema
        return ["run", "-q", "-c", str(_run_cfg(env, d, csv, sch, **sections))]
    return setup


def _set(col, rows, value):
    def change(df):
        df = df.copy()
        if isinstance(value, str) or df[col].dtype.kind in "iu" and not isinstance(value, int):
            df[col] = df[col].astype(object)
        df.loc[rows, col] = value
        return df
    return change


def _silos(mapping):
    def change(df):
        df = df.copy()
        df["hospital"] = df["hospital"].map(mapping)
        return df
    return change


def _run(**sections):
    def setup(env, d):
        return ["run", "-q", "-c", str(_run_cfg(env, d, **sections))]
    return setup


def _raw_config(text: str, name: str = "run.toml"):
    def setup(env, d):
        (d / name).write_text(text)
        return ["run", "-q", "-c", str(d / name)]
    return setup


def _sweep(**sections):
    def setup(env, d):
        raw = _sweep_raw(env, **sections)
        raw["sweep"]["results"] = str(d / "results.jsonl")
        (d / "sweep.toml").write_text(tomli_w.dumps(raw))
        return ["sweep", "-q", str(d / "sweep.toml")]
    return setup


def _sweep_on(prepare: Callable[[Env, Path], Path], *extra, **sections):
    """A good sweep config whose results file is whatever `prepare` leaves."""
    def setup(env, d):
        results = prepare(env, d)
        raw = _sweep_raw(env, **sections)
        raw["sweep"]["results"] = str(results)
        (d / "sweep.toml").write_text(tomli_w.dumps(raw))
        return ["sweep", "-q", str(d / "sweep.toml"), *extra]
    return setup


def _results(content: str | bytes | None, name: str = "r.jsonl"):
    """A results path holding `content` (None: the finished sweep's file; a dir: "/")."""
    def prepare(env, d):
        if content is None:
            return env.results
        p = d / name
        if content == "/":
            p.mkdir()
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
        return p
    return prepare


def _on_results(cmd: str, prepare, *extra):
    def setup(env, d):
        return [cmd, str(prepare(env, d)), "--out", str(d / "rep"), *extra]
    return setup


def _damaged(kind: str):
    def prepare(env, d):
        lines = env.results.read_text().splitlines()
        head = json.loads(lines[0])
        if kind == "middle":
            text = "\n".join([lines[0], "{not json", *lines[1:]]) + "\n"
        elif kind == "format":
            head["format"] = 99
            text = json.dumps(head) + "\n"
        elif kind == "nohead":
            text = "\n".join(lines[1:]) + "\n"
        elif kind == "array":
            text = lines[0] + "\n[1, 2]\n"
        elif kind == "runkeys":
            text = lines[0] + "\n" + json.dumps({"kind": "run", "method": "local"}) + "\n"
        elif kind == "headkeys":
            text = json.dumps({"kind": sweep_mod.HEADER_KIND, "format": sweep_mod.FORMAT}) + "\n"
        else:
            raise AssertionError(kind)
        p = d / "r.jsonl"
        p.write_text(text)
        return p
    return prepare


def _account(*args):
    def setup(env, d):
        return ["account", *args]
    return setup


A = ["--n", "1000", "--batch", "64", "--delta", "1e-5"]


def _plain(*args):
    def setup(env, d):
        return [a.replace("{d}", str(d)).replace("{csv}", str(env.csv))
                .replace("{root}", str(env.root)) for a in args]
    return setup


def _with_file(name: str, content: str | bytes, *args):
    def setup(env, d):
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
        return _plain(*args)(env, d)
    return setup


def _pandemic(*args):
    def setup(env, d):
        if env.outbreak is None:
            pytest.skip("pandemic extra not installed")
        return [a.replace("{data}", str(env.outbreak)).replace("{d}", str(d)) for a in args]
    return setup


def _damaged_model(kind: str):
    """A pandemic model directory whose files are damaged in one way."""
    def setup(env, d):
        m = d / "model"
        m.mkdir(parents=True, exist_ok=True)
        meta = {"config": {"rounds": 1}, "regions": ["region-51001", "region-51003"]}
        (m / "model.json").write_text("{not json" if kind == "json" else json.dumps(meta))
        if kind == "shape":
            np.save(m / "weights.npy", np.zeros((5, 13)))
        elif kind == "bytes":
            (m / "weights.npy").write_bytes(b"\x93NUMPY garbage")
        return _pandemic("pandemic", "predict", "--data", "{data}", "--model", str(m),
                         "--out", "{d}/p.csv")(env, d)
    return setup


def _locked_sweep(env, d):
    """Another process holds the results file's lock (flock is per open file)."""
    raw = _sweep_raw(env)
    raw["sweep"]["results"] = str(d / "results.jsonl")
    (d / "sweep.toml").write_text(tomli_w.dumps(raw))
    fd = os.open(d / "results.jsonl.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    Case.cleanup.append(lambda: os.close(fd))
    return ["sweep", "-q", str(d / "sweep.toml")]


@dataclass
class Case:
    id: str
    setup: Callable[[Env, Path], list[str]]
    words: tuple[str, ...]
    cleanup = []  # class-level: callbacks after the invocation


def C(id_, setup, *words, **kw):
    return pytest.param(Case(id_, setup, words, **kw), id=id_)


LABEL = "column 'outcome'"
CASES = [
    # --- run: the data ------------------------------------------------------------------
    C("silo-names-number-spellings", _bad_data(_silos({"north": "1", "south": "1.0",
                                                       "east": "01"})),
      "'1' / '1.0' / '01'", "one distinct name"),
    C("silo-names-case", _bad_data(_silos({"north": "Ward", "south": "ward", "east": "e"})),
      "'Ward' / 'ward'", "differ only in case"),
    C("silo-names-spaces", _bad_data(_silos({"north": "A B", "south": "A  B", "east": "e"})),
      "'A B' / 'A  B'"),
    C("silo-names-float-exp", _bad_data(_silos({"north": "10", "south": "1e1", "east": "e"})),
      "'10' / '1e1'"),
    C("label-1e300-binary", _bad_data(_set("outcome", [3], 1e300)), LABEL,
      "not among the declared label classes", "silo 'north': 1"),
    C("label-inf-binary", _bad_data(_set("outcome", [3, 40], np.inf)), LABEL,
      "are infinite", "silo 'north': 1", "silo 'south': 1"),
    C("label-inf-noschema", _bad_data(_set("outcome", [3], np.inf), schema=None), LABEL,
      "are infinite"),
    C("label-neginf-regression", _bad_data(_set("outcome", [70], -np.inf), schema="reg"),
      LABEL, "are infinite", "silo 'east': 1"),
    C("label-inf-text", _bad_data(_set("outcome", [3], "Infinity")), LABEL, "infinite"),
    C("label-secret-not-a-class", _bad_data(_set("outcome", [5], SECRET)), LABEL,
      "not among the declared label classes"),
    C("label-all-missing", _bad_data(_set("outcome", slice(None), np.nan)),
      "no rows left", "fill the label column 'outcome'"),
    C("silo-all-missing", _bad_data(_set("hospital", slice(None), "")),
      "no rows left", "fill the silo column 'hospital'"),
    C("twelve-integer-classes", _bad_data(
        lambda df: df.assign(outcome=np.arange(len(df)) % 12), schema=None,
        model={"name": "logistic"}), "12 distinct integer values", 'task = "multiclass"'),
    C("feature-not-number", _bad_data(_set("x", [4], "SECRET")), "column 'x'",
      "are not numbers"),
    C("feature-unknown-level", _bad_data(_set("colour", [4], "SECRET")), "column 'colour'",
      "not among its declared levels"),
    C("feature-missing-not-nullable", _bad_data(_set("x", [4], np.nan)), "column 'x'",
      "not nullable"),
    # a silo smaller than the batch is allowed (full-batch steps, q = 1): test_tuning.py
    C("silo-one-class", _bad_data(lambda df: df.assign(
        outcome=np.where(df.hospital == "east", 0, df.outcome))), "silo 'east'",
      "single class"),
    C("empty-csv", lambda env, d: ["run", "-q", "-c", str(_run_cfg(
        env, d, _with_empty(d)))], "is empty"),
    C("header-only-csv", lambda env, d: ["run", "-q", "-c", str(_run_cfg(
        env, d, _with_text(d, "hospital,x,colour,outcome\n")))], "empty"),
    C("binary-garbage-csv", lambda env, d: ["run", "-q", "-c", str(_run_cfg(
        env, d, _with_bytes(d, b"\xff\xfe\x00\x01" * 50)))], "could not read"),
    C("missing-columns", _bad_data(lambda df: df.drop(columns=["colour"])),
      "lacks 1 column(s)", "'colour'"),
    C("duplicate-silo-label-col", _run(data={"label_column": "hospital"}),
      "label"),
    # --- run: the config ----------------------------------------------------------------
    C("config-missing", _plain("run", "-q", "-c", "{d}/nope.toml"), "does not exist"),
    C("config-is-dir", _plain("run", "-q", "-c", "{d}"), "is a directory"),
    C("config-not-toml", _raw_config("this is [not toml\n"), "cannot read config file"),
    C("config-unknown-section", _run(dat={"x": 1}), "unknown config section [dat]",
      "did you mean [data]"),
    C("config-unknown-key", _run(training={"round": 3}), "training.round", "rounds"),
    C("config-wrong-type", _run(training={"rounds": "many"}), "training.rounds",
      "must be of type int"),
    C("test-fraction-0", _run(data={"test_fraction": 0.0}), "data.test_fraction",
      "(0, 1)", "held-out test rows"),
    C("test-fraction-1", _run(data={"test_fraction": 1.0}), "data.test_fraction"),
    C("test-fraction-neg", _run(data={"test_fraction": -0.2}), "data.test_fraction"),
    C("test-fraction-nan", _run(data={"test_fraction": math.nan}), "data.test_fraction"),
    C("data-path-missing", _run(data={"path": "/nonexistent/x.csv"}), "data file not found"),
    C("data-path-dir", lambda env, d: ["run", "-q", "-c", str(_run_cfg(env, d, d))],
      "is not a file"),
    C("data-bad-extension", lambda env, d: ["run", "-q", "-c", str(_run_cfg(
        env, d, _with_text(d, "a,b\n1,2\n", "data.xlsx")))], "unsupported file type"),
    C("silo-column-unknown", _run(data={"silo_column": "hospitl"}), "hospitl"),
    C("label-column-unknown", _run(data={"label_column": "outcom"}), "outcom"),
    C("schema-missing", _run(data={"schema": "/nonexistent/schema.toml"}), "schema"),
    C("epsilon-zero", _run(privacy={"epsilon": 0.0}), "epsilon"),
    C("epsilon-negative", _run(privacy={"epsilon": -1.0}), "epsilon"),
    C("epsilon-inf", _run(privacy={"epsilon": math.inf}), "epsilon"),
    C("delta-zero", _run(privacy={"delta": 0.0}), "delta"),
    C("delta-one", _run(privacy={"delta": 1.0}), "delta"),
    # batch_size ≥ n_k is allowed (full-batch steps, q = 1): tests/test_tuning.py
    C("batch-zero", _run(training={"batch_size": 0}), "batch"),
    C("rounds-zero", _run(training={"rounds": 0}), "rounds"),
    C("method-unknown", _run(training={"methods": ["fedavgg"]}), "fedavgg"),
    C("method-duplicate", _run(training={"methods": ["local", "local"]}), "local"),
    C("model-unknown", _run(model={"name": "transformer"}), "transformer"),
    C("metric-unknown", _run(model={"metric": "f1"}), "f1"),
    C("accountant-unknown", _run(privacy={"accountant": "moments"}), "accountant"),
    C("noise-unknown", _run(privacy={"noise": "loud"}), "noise"),
    C("missing-mode-unknown", _run(data={"missing": "ignore"}), "missing"),
    C("task-unknown", _run(data={"task": "ranking"}), "task"),
    C("calibration-unreachable", _run(privacy={"epsilon": 1e-9}, training={"rounds": 50}),
      "no noise multiplier"),
    C("lifetime-budget-exceeded", _run(budget={"epsilon": 0.5}), "budget"),
    C("out-is-file", lambda env, d: ["run", "-q", "-c", str(_run_cfg(env, d)), "--out",
                                     str(_touch(d / "afile"))], "--out", "is a file"),
    C("output-dir-is-file", lambda env, d: ["run", "-q", "-c", str(_run_cfg(
        env, d, output={"dir": str(_touch(d / "afile"))}))], "[output] dir", "is a file"),
    C("store-is-dir", lambda env, d: ["run", "-q", "-c", str(_run_cfg(env, d)), "--store",
                                      str(_mkdir(d / "sdir"))], "is a directory"),
    # --- sweep --------------------------------------------------------------------------
    C("sweep-config-missing", _plain("sweep", "{d}/nope.toml"), "does not exist"),
    C("sweep-config-dir", _plain("sweep", "{d}"), "is a directory"),
    C("sweep-no-section", lambda env, d: ["sweep", str(_toml(d, {k: v for k, v in _sweep_raw(
        env).items() if k != "sweep"}))], "needs a [sweep] section"),
    C("sweep-methods-empty", _sweep(sweep={"methods": []}), "sweep.methods", "empty"),
    C("sweep-method-unknown", _sweep(sweep={"methods": ["mrmtll"]}), "mrmtll",
      "Did you mean 'mrmtl'"),
    C("sweep-method-dup", _sweep(sweep={"methods": ["local", "local"]}), "more than once"),
    C("sweep-epsilon-zero", _sweep(sweep={"epsilon": [0.0]}), "sweep.epsilon", "positive"),
    C("sweep-epsilon-inf", _sweep(sweep={"epsilon": [math.inf]}), "sweep.epsilon", "finite"),
    C("sweep-epsilon-dup", _sweep(sweep={"epsilon": [1.0, 1.0]}), "more than once"),
    C("sweep-lam-negative", _sweep(sweep={"lam": [-1.0]}), "sweep.lam", "non-negative"),
    C("sweep-lr-zero", _sweep(sweep={"lr": [0.0]}), "sweep.lr", "positive"),
    C("sweep-seeds-float", _sweep(sweep={"seeds": [1.5]}), "sweep.seeds", "integers"),
    C("sweep-valfrac-0", _sweep(sweep={"validation_fraction": 0.0}), "validation_fraction"),
    C("sweep-valfrac-1", _sweep(sweep={"validation_fraction": 1.0}), "validation_fraction"),
    C("sweep-workers-0", _sweep(sweep={"workers": 0}), "workers"),
    C("sweep-cli-workers-0", lambda env, d: [*_sweep()(env, d), "--workers", "0"], "workers"),
    C("sweep-results-empty-name", lambda env, d: ["sweep", str(_toml(d, _sweep_raw(
        env, sweep={"results": " "})))], "sweep.results", "is empty"),
    C("sweep-replaced-key", _sweep(training={"lr": 0.3}), "training.lr", "sweep grid"),
    C("sweep-report-eps", _sweep(report={"epsilon": 5.0}), "report.epsilon",
      "not in sweep.epsilon"),
    C("sweep-unknown-key", _sweep(sweep={"seed": [0]}), "sweep.seed"),
    C("sweep-test-fraction-0", _sweep(data={"test_fraction": 0.0}), "data.test_fraction"),
    C("sweep-min-silo-train", _sweep(sweep={"min_silo_train": 1000}), "min_silo_train"),
    C("sweep-batch-zero", _sweep(training={"batch_size": 0}),
      "batch_size must be a positive integer"),  # b ≥ n_k is allowed now (q = 1)
    C("sweep-bad-data", lambda env, d: [*_sweep(data={"path": str(_csv(d, _silos(
        {"north": "1", "south": "01", "east": "e"})(_frame())))})(env, d)],
      "'1' / '01'"),
    C("sweep-results-other-sweep", _sweep_on(_results(None), sweep={"lr": [0.2]}),
      "belongs to a different sweep", "differs in"),
    C("sweep-results-empty-file", _sweep_on(_results("")), "exists but is empty",
      "delete it"),
    C("sweep-results-is-dir", _sweep_on(_results("/")), "is not a file"),
    C("sweep-results-not-ours", _sweep_on(_results('{"kind": "x"}\n')),
      "not a silofl sweep results file"),
    C("sweep-results-parent-is-file", _sweep_on(
        lambda env, d: _touch(d / "plainfile") / "r.jsonl"), "results"),
    C("sweep-locked-by-another", _locked_sweep, "in use by another `silofl sweep`",
      "wait for it to finish"),
    # --- report and plot ----------------------------------------------------------------
    *[c for cmd in ("report", "plot") for c in (
        C(f"{cmd}-missing", _plain(cmd, "{d}/none.jsonl"), "does not exist",
          "run `silofl sweep` first"),
        C(f"{cmd}-dir", _plain(cmd, "{d}"), "is a directory"),
        C(f"{cmd}-toml", _on_results(cmd, lambda env, d: _toml(d, _sweep_raw(env))),
          "is a TOML file", "not its config"),
        C(f"{cmd}-empty", _on_results(cmd, _results("")), "is empty"),
        C(f"{cmd}-garbage", _on_results(cmd, _results("hello world\n")),
          "not a silofl sweep results file"),
        C(f"{cmd}-binary", _on_results(cmd, _results(b"\xff\xfe\xfa" * 30)),
          "cannot read results file"),
        C(f"{cmd}-damaged-middle", _on_results(cmd, _damaged("middle")), "line 2",
          "damaged"),
        C(f"{cmd}-format", _on_results(cmd, _damaged("format")), "results format 99"),
        C(f"{cmd}-no-header", _on_results(cmd, _damaged("nohead")),
          "not a silofl sweep results file"),
        C(f"{cmd}-array-line", _on_results(cmd, _damaged("array")), "line 2",
          "not a JSON object"),
        C(f"{cmd}-run-keys", _on_results(cmd, _damaged("runkeys")), "line 2 lacks"),
        C(f"{cmd}-header-keys", _on_results(cmd, _damaged("headkeys")), "header lacks"),
        C(f"{cmd}-eps-not-swept", _on_results(cmd, _results(None), "--epsilon", "3"),
          "--epsilon 3 was not swept"),
        C(f"{cmd}-out-is-file", lambda env, d, cmd=cmd: [
            cmd, str(env.results), "--out", str(_touch(d / "afile"))], "is a file"),
    )],
    # --- account ------------------------------------------------------------------------
    C("account-sigma-tiny", _account(*A, "--steps", "100", "--sigma", "1e-3"), "--sigma",
      "[0.3, 10000]"),
    C("account-sigma-inf", _account(*A, "--steps", "100", "--sigma", "inf"), "--sigma"),
    C("account-sigma-nan", _account(*A, "--steps", "100", "--sigma", "nan"), "--sigma"),
    C("account-sigma-huge", _account(*A, "--steps", "100", "--sigma", "1e9"), "--sigma"),
    C("account-sigma-zero", _account(*A, "--steps", "5", "--sigma", "0"),
      "sigma must be positive"),
    C("account-epsilon-inf", _account(*A, "--steps", "100", "--epsilon", "inf"),
      "--epsilon", "[0.001, 100]"),
    C("account-epsilon-1e6", _account(*A, "--steps", "100", "--epsilon", "1e6"),
      "--epsilon"),
    C("account-epsilon-neg", _account(*A, "--steps", "5", "--epsilon", "-1"),
      "epsilon must be positive"),
    C("account-epsilon-tiny", _account(*A, "--steps", "5", "--epsilon", "1e-9"),
      "--epsilon"),
    C("account-epochs-neg", _account(*A, "--epochs", "-1", "--sigma", "1"), "--epochs"),
    C("account-epochs-inf", _account(*A, "--epochs", "inf", "--sigma", "1"), "--epochs"),
    C("account-epochs-many", _account(*A, "--epochs", "1e5", "--sigma", "1"),
      "more than 1000000"),
    C("account-steps-zero", _account(*A, "--steps", "0", "--sigma", "1"), "--steps"),
    C("account-steps-huge", _account(*A, "--steps", "100000000", "--sigma", "1"), "--steps"),
    C("account-delta-one", _account("--n", "1000", "--batch", "64", "--delta", "1",
                                    "--steps", "5", "--sigma", "1"), "delta must be in"),
    C("account-delta-tiny", _account("--n", "1000", "--batch", "64", "--delta", "1e-30",
                                     "--steps", "5", "--sigma", "1"), "--delta"),
    C("account-no-delta", _account("--n", "1000", "--batch", "64", "--steps", "5",
                                   "--sigma", "1"), "give --delta"),
    C("account-batch-too-big", _account("--n", "1000", "--batch", "2000", "--delta", "1e-5",
                                        "--steps", "5", "--sigma", "1"), "batch < n"),
    C("account-batch-nan", _account("--n", "1000", "--batch", "nan", "--delta", "1e-5",
                                    "--steps", "5", "--sigma", "1"), "batch"),
    C("account-both-modes", _account(*A, "--steps", "5", "--sigma", "1", "--epsilon", "1"),
      "exactly one of --sigma"),
    C("account-both-lengths", _account(*A, "--steps", "5", "--epochs", "1", "--sigma", "1"),
      "exactly one of --steps"),
    C("account-search-too-big", _account("--n", "1000", "--batch", "999", "--delta", "1e-5",
                                         "--steps", "1", "--epsilon", "100"),
      "noise multiplier below 0.15", "lower epsilon or delta"),  # was: out of memory
    C("account-node-sigma-tiny", _account("--node-level", "--n", "1000", "--batch", "64",
                                          "--epochs", "1", "--sigma", "1e-3"), "--sigma"),
    C("account-node-epochs-neg", _account("--node-level", "--n", "1000", "--batch", "64",
                                          "--epochs", "-1", "--sigma", "1"), "--epochs"),
    C("account-node-eps-inf", _account("--node-level", "--n", "1000", "--batch", "64",
                                       "--epochs", "1", "--epsilon", "inf"), "--epsilon"),
    C("account-node-batch", _account("--node-level", "--n", "1000", "--batch", "0",
                                     "--epochs", "1", "--sigma", "1"), "batch"),
    C("account-node-S", _account("--node-level", "--n", "1000", "--batch", "64",
                                 "--epochs", "1", "--sigma", "1", "--S", "0"), "--S"),
    # --- budget -------------------------------------------------------------------------
    C("budget-show-missing", _plain("budget", "show", "--store", "{d}/none.sqlite"),
      "does not exist"),
    C("budget-show-dir", _plain("budget", "show", "--store", "{d}"), "does not exist"),
    C("budget-export-missing", _plain("budget", "export", "--store", "{d}/none.sqlite"),
      "does not exist"),
    C("budget-reset-no-yes", _plain("budget", "reset", "--silo", "north", "--reason", "x",
                                    "--store", "{d}/none.sqlite"), "--yes"),
    C("budget-set-target-no-yes", _plain("budget", "set-target", "--silo", "north",
                                         "--epsilon", "1", "--delta", "1e-5", "--reason", "x",
                                         "--store", "{d}/none.sqlite"), "--yes"),
    # --- schema draft -------------------------------------------------------------------
    C("draft-data-missing", _plain("schema", "draft", "{d}/none.csv", "--label-column",
                                   "outcome", "--out", "{d}/s.toml"), "not found"),
    C("draft-data-dir", _plain("schema", "draft", "{d}", "--label-column", "outcome",
                               "--out", "{d}/s.toml"), "is not a file"),
    C("draft-out-exists", _with_file("s.toml", "keep = 1\n", "schema", "draft", "{csv}",
                                     "--label-column", "outcome", "--out", "{d}/s.toml"),
      "exists"),
    C("draft-label-unknown", _plain("schema", "draft", "{csv}", "--label-column", "outcom",
                                    "--out", "{d}/s.toml"), "outcom"),
    C("draft-empty-csv", _with_file("e.csv", "", "schema", "draft", "{d}/e.csv",
                                    "--label-column", "outcome", "--out", "{d}/s.toml"),
      "is empty"),
    C("draft-bad-extension", _with_file("e.txt", "a,b\n", "schema", "draft", "{d}/e.txt",
                                        "--label-column", "outcome", "--out", "{d}/s.toml"),
      "unsupported file type"),
    # --- pandemic -----------------------------------------------------------------------
    C("synth-persons-zero", _pandemic("pandemic", "synth", "--persons", "0", "--out",
                                      "{d}/o"), "persons"),
    C("synth-regions-zero", _pandemic("pandemic", "synth", "--persons", "500", "--regions",
                                      "0", "--out", "{d}/o"), "regions"),
    C("synth-bad-format", _pandemic("pandemic", "synth", "--persons", "500", "--format",
                                    "xml", "--out", "{d}/o"), "format"),
    C("synth-foreign-dir", lambda env, d: _pandemic(
        "pandemic", "synth", "--persons", "500", "--out", str(_touch(d / "o" / "x.txt").parent)
    )(env, d), "not part of a synthetic dataset"),
    C("synth-different-dataset", _pandemic("pandemic", "synth", "--persons", "500",
                                           "--regions", "4", "--seed", "8", "--out", "{data}"),
      "different dataset", "--overwrite"),
    C("train-data-missing", _pandemic("pandemic", "train", "--data", "{d}/none", "--model",
                                      "{d}/m", "--store", "{d}/b.sqlite"), "none"),
    C("train-epsilon-zero", _pandemic("pandemic", "train", "--data", "{data}", "--model",
                                      "{d}/m", "--epsilon", "0", "--store", "{d}/b.sqlite"),
      "epsilon"),
    C("train-epsilon-inf", _pandemic("pandemic", "train", "--data", "{data}", "--model",
                                     "{d}/m", "--epsilon", "inf", "--store", "{d}/b.sqlite"),
      "epsilon"),
    C("train-store-under-file", lambda env, d: _pandemic(
        "pandemic", "train", "--data", "{data}", "--model", "{d}/m", "--store",
        str(_touch(d / "notes.txt") / "b.sqlite"))(env, d), "budget store",
      "notes.txt' is a file, not a folder"),  # the second corpus (test_failures_second.py) has the rest
    C("train-epsilon-1e6", _pandemic("pandemic", "train", "--data", "{data}", "--model",
                                     "{d}/m", "--batch", "16", "--epsilon", "1e6", "--store",
                                     "{d}/b.sqlite"), "epsilon", "(0, 100]"),
    C("train-rounds-zero", _pandemic("pandemic", "train", "--data", "{data}", "--model",
                                     "{d}/m", "--rounds", "0", "--store", "{d}/b.sqlite"),
      "rounds"),
    C("train-batch-zero", _pandemic("pandemic", "train", "--data", "{data}", "--model",
                                    "{d}/m", "--batch", "0", "--store", "{d}/b.sqlite"),
      "batch"),
    C("train-S-zero", _pandemic("pandemic", "train", "--data", "{data}", "--model", "{d}/m",
                                "--S", "0", "--store", "{d}/b.sqlite"), "S"),
    C("train-noise-bad", _pandemic("pandemic", "train", "--data", "{data}", "--model",
                                   "{d}/m", "--noise", "loud", "--store", "{d}/b.sqlite"),
      "noise"),
    C("train-adjacency-bad", _pandemic("pandemic", "train", "--data", "{data}", "--model",
                                       "{d}/m", "--adjacency", "edge", "--store",
                                       "{d}/b.sqlite"), "adjacency"),
    C("train-preprocessing-bad", _pandemic("pandemic", "train", "--data", "{data}",
                                           "--model", "{d}/m", "--preprocessing", "magic",
                                           "--store", "{d}/b.sqlite"), "preprocessing"),
    C("predict-model-missing", _pandemic("pandemic", "predict", "--data", "{data}",
                                         "--model", "{d}/none", "--out", "{d}/p.csv"),
      "none"),
    C("predict-model-json-damaged", _damaged_model("json"), "damaged", "not valid JSON"),
    C("predict-model-weights-missing", _damaged_model("missing"), "damaged", "weights.npy"),
    C("predict-model-weights-garbage", _damaged_model("bytes"), "damaged", "weights.npy"),
    C("predict-model-weights-shape", _damaged_model("shape"), "damaged", "does not match"),
    C("predict-data-missing", _pandemic("pandemic", "predict", "--data", "{d}/none",
                                        "--model", "{d}/none", "--out", "{d}/p.csv"),
      "none"),
]


def _touch(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("x")
    return p


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def _toml(d: Path, raw: dict, name: str = "cfg.toml") -> Path:
    p = d / name
    p.write_text(tomli_w.dumps(raw))
    return p


def _with_text(d: Path, text: str, name: str = "data.csv") -> Path:
    p = d / name
    p.write_text(text)
    return p


def _with_empty(d: Path) -> Path:
    return _with_text(d, "")


def _with_bytes(d: Path, data: bytes) -> Path:
    p = d / "data.csv"
    p.write_bytes(data)
    return p


def _snapshot(d: Path) -> dict:
    """Every file under `d` with size and mtime; lock files hold no data, and a budget
    store a refused job opened is checked for charges instead (`_charges`)."""
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in d.rglob("*") if p.is_file() and not p.name.endswith(".lock")
            and ".sqlite" not in p.name}


def _charges(d: Path) -> int:
    """Charges in every budget store under `d` (the case's default stores included: its
    silofl home is under `d`); the machine registry has no charges table."""
    n = 0
    for p in d.rglob("*.sqlite"):
        with sqlite3.connect(p) as con:
            if con.execute("SELECT 1 FROM sqlite_master WHERE name = 'charges'").fetchone():
                n += con.execute("SELECT COUNT(*) FROM charges").fetchone()[0]
    return n


@pytest.fixture(scope="module")
def outbreak(request):
    try:
        import numba  # noqa: F401
        import sknetwork  # noqa: F401
    except ImportError:
        return None
    return request.getfixturevalue("small_outbreak")


@pytest.mark.parametrize("case", CASES)
def test_every_failure_is_clean(case: Case, env: Env, outbreak, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SILOFL_LOG_DIR", str(tmp_path / "crash-logs"))
    monkeypatch.setattr(sweep_mod, "LOCK_WAIT_S", 0.2)
    env.outbreak = outbreak
    d = tmp_path / "case"
    d.mkdir()
    monkeypatch.setenv("SILOFL_HOME", str(d / "silofl-home"))  # default stores: checked too
    args = case.setup(env, d)
    before = _snapshot(d)
    results_before = env.results.read_bytes()
    outbreak_before = _snapshot(outbreak) if outbreak is not None else None
    try:
        res = CliRunner().invoke(app, args)
    finally:
        while Case.cleanup:
            Case.cleanup.pop()()
    out = " ".join((res.stdout + res.stderr).split())
    assert res.exit_code == 2, (args, res.exception, out)
    for w in case.words:  # ignoring whitespace: rich folds long paths anywhere ("non e")
        assert "".join(w.split()) in "".join(out.split()), (w, out)
    assert "Traceback" not in out and "SECRET" not in out and str(SECRET) not in out, out
    assert _snapshot(d) == before, "the refused command wrote files"
    assert not (tmp_path / "crash-logs").exists()
    assert _charges(d) == 0, "the refused command spent budget"
    assert env.results.read_bytes() == results_before
    if outbreak is not None:
        assert _snapshot(outbreak) == outbreak_before


def test_corpus_cases_are_distinct_and_each_names_its_error():
    """Each case must be its own (pytest would silently suffix a repeated id) and must
    check the message's words, not only the exit code."""
    cases = [p.values[0] for p in CASES]
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids), sorted({i for i in ids if ids.count(i) > 1})
    assert [c.id for c in cases if not any(w.strip() for w in c.words)] == []
    assert len(cases) >= 100  # the corpus the README describes


# --- what is not a failure any more ---------------------------------------------------------

def test_na_none_null_are_silo_names(env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    csv = _csv(tmp_path, _silos({"north": "NA", "south": "None", "east": "null"})(_frame()))
    from silofl.data.tabular import load_table
    fed = load_table(csv, "hospital", "outcome", schema=env.schema)
    assert fed.names == ["NA", "None", "null"]


def test_silo_names_are_read_as_exact_text(env, tmp_path):
    csv = _csv(tmp_path, _silos({"north": "007", "south": "7.50", "east": "x"})(_frame()))
    from silofl.data.tabular import load_table
    assert load_table(csv, "hospital", "outcome", schema=env.schema).names == \
        ["007", "7.50", "x"]


def test_a_diverged_silo_is_never_hidden():
    assert mse(np.array([1.0]), np.array([1e300])) == math.inf
    assert mse(np.array([1.0]), np.array([np.nan])) == math.inf
    assert math.isnan(accuracy(np.array([1]), np.array([np.nan])))
    assert pooled([0.1, math.inf, 0.2], [10, 10, 10]) == math.inf  # not a finite average
    assert pooled([0.1, math.nan, 0.2], [10, 10, 10]) == pytest.approx(0.15)  # undefined


def test_results_table_flags_a_diverged_silo():
    from types import SimpleNamespace

    from silofl.experiments.report import results_table
    hist = SimpleNamespace(rounds=[1], pooled=[math.inf])
    r = SimpleNamespace(metric="mse", silos=["a", "b"], final_per_silo=[0.1, math.inf],
                        final_pooled=math.inf, history=hist, method={"name": "local"})
    rep = SimpleNamespace(results=[r], config=SimpleNamespace(
        privacy=SimpleNamespace(enabled=False)), label=lambda r: "local", notes=lambda: [])
    from rich.console import Console
    con = Console(width=200, record=True)
    con.print(results_table(rep))
    text = con.export_text()
    assert "inf (diverged) b" in text and "0.1000 a" in text
    r.final_per_silo = [math.nan, math.nan]  # no test rows anywhere: no crash
    r.final_pooled = math.nan
    con.print(results_table(rep))


def test_json_is_strict_and_atomic(tmp_path):
    obj = {"a": math.inf, "b": [np.float64("nan"), 1.0], "c": np.int64(3)}
    text = dumps_strict(obj)
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text) == {"a": None, "b": [None, 1.0], "c": 3}
    write_json_atomic(tmp_path / "x.json", obj)
    assert json.loads((tmp_path / "x.json").read_text())["a"] is None
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temp file left


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    p = tmp_path / "summary.json"
    p.write_text('{"old": 1}')

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError):
        write_json_atomic(p, {"new": 2})
    assert json.loads(p.read_text()) == {"old": 1}
    assert [x.name for x in tmp_path.iterdir()] == ["summary.json"]


def test_sweep_and_report_files_are_strict_json(env, tmp_path):
    for line in env.results.read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict token {c}"))
    res = CliRunner().invoke(app, ["report", str(env.results), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    json.loads((tmp_path / "r" / "summary.json").read_text(),
               parse_constant=lambda c: pytest.fail(f"non-strict token {c}"))
    rec = json.loads(env.results.read_text().splitlines()[1])
    assert rec["nonfinite"] == []


def test_a_diverging_sweep_is_flagged_in_strict_json(env, tmp_path):
    """A label of 1e300 (finite, undeclared bounds) sends one silo's MSE to inf: the
    record stores null and names it, the pooled figure is not a finite average, and the
    report's summary.json is strict JSON that lists it."""
    df = _frame().assign(outcome=lambda f: f.x.astype(float))
    df.loc[df.hospital == "north", "outcome"] = 1e300
    csv = _csv(tmp_path, df)
    raw = _sweep_raw(env, data={"path": str(csv), "schema": str(env.reg_schema)},
                     model={"name": "linear"})
    raw["sweep"]["results"] = str(tmp_path / "r.jsonl")
    res = CliRunner().invoke(app, ["sweep", "-q", str(_toml(tmp_path, raw))])
    assert res.exit_code == 0, res.output
    strict = {"parse_constant": lambda c: pytest.fail(f"non-strict token {c}")}
    rec = [json.loads(x, **strict) for x in (tmp_path / "r.jsonl").read_text().splitlines()][1]
    assert rec["final_test"] is None and "final_test" in rec["nonfinite"]
    assert "final_test_per_silo[north]" in rec["nonfinite"]
    res = CliRunner().invoke(app, ["report", str(tmp_path / "r.jsonl"), "--out",
                                   str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text(), **strict)
    assert summary["selection"][0]["test_mean"] is None
    assert "selection[0].test_mean" in summary["nonfinite"]
