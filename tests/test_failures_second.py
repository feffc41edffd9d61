"""The second bad-input corpus (issue 19, part 5): kinds of input a new user produced.

Each case runs one `silofl` command on one bad input or fault and must exit with code 2,
say what is wrong, where and how to fix it (each case lists words its message must hold:
the key, column or file it is about), print no traceback, no "unexpected error" and no
record value (the sentinel SECRET), write nothing (the case's folder is unchanged, a
refused `deploy init` leaves no folder) and spend no budget (no charge in any store).

After the corpus: the inputs that are *not* failures any more (the same files read with
the setting the message offers, ``--set`` overrides, paths relative to the config file,
help texts that keep their ``[section]`` names).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

from silo_tables import three_silo_frame
from silofl.cli import app

logging.getLogger("absl").setLevel(logging.ERROR)

SECRET = "SECRETVALUE"  # a record value no message may quote
SCHEMA = {"silo_column": "hospital",
          "label": {"name": "outcome", "kind": "binary", "classes": [0, 1]},
          "columns": [{"name": "x", "kind": "numeric", "lower": -4, "upper": 4},
                      {"name": "colour", "kind": "categorical",
                       "levels": ["blue", "green", "red"]}]}


def _frame(n: int = 30) -> pd.DataFrame:
    return three_silo_frame(n)


@dataclass
class Env:
    root: Path
    csv: Path
    schema: Path
    run_dir: Path          # a finished run with saved models (methods local, fedavg)


def _raw(env: Env, d: Path, csv: Path | None = None, **sections) -> dict:
    raw = {"data": {"source": "table", "path": str(csv or env.csv), "silo_column": "hospital",
                    "label_column": "outcome", "schema": str(env.schema)},
           "training": {"rounds": 2, "batch_size": 4, "methods": ["local"]},
           "privacy": {"epsilon": 2.0, "delta": 1e-4, "noise": "seeded"},
           "budget": {"store": str(d / "store.sqlite")},
           "output": {"dir": str(d / "runs")}}
    for sec, vals in sections.items():
        for k, v in vals.items():
            if v is None:
                raw.setdefault(sec, {}).pop(k, None)
            else:
                raw.setdefault(sec, {})[k] = v
    return raw


def _cfg(env: Env, d: Path, csv: Path | None = None, **sections) -> Path:
    p = d / "run.toml"
    p.write_text(tomli_w.dumps(_raw(env, d, csv, **sections)))
    return p


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Env:
    root = tmp_path_factory.mktemp("failures2")
    csv = root / "base.csv"
    _frame().to_csv(csv, index=False)
    (root / "schema.toml").write_text(tomli_w.dumps(SCHEMA))
    e = Env(root, csv, root / "schema.toml", root / "runs" / "saved")
    raw = _raw(e, root, training={"methods": ["local", "fedavg"]},
               output={"dir": str(root / "runs"), "name": "saved"})
    (root / "saved.toml").write_text(tomli_w.dumps(raw))
    res = CliRunner().invoke(app, ["run", "-q", "-c", str(root / "saved.toml")])
    assert res.exit_code == 0, res.output
    return e


# --- helpers that build one bad input in the case's folder ---------------------------------

def _run(*extra, csv: Callable[[Path], Path] | None = None, **sections):
    def setup(env, d):
        return ["run", "-q", "-c", str(_cfg(env, d, csv(d) if csv else None, **sections)),
                *extra]
    return setup


def _write(name: str, make: Callable[[pd.DataFrame, Path], None]):
    """A data file `name` in the case folder written by `make(frame, path)`."""
    def at(d: Path) -> Path:
        p = d / name
        make(_frame(), p)
        return p
    return at


SEMI = _write("semi.csv", lambda df, p: df.to_csv(p, sep=";", index=False))
TABS = _write("tabs.csv", lambda df, p: df.to_csv(p, sep="\t", index=False))
LATIN = _write("latin.csv", lambda df, p: df.assign(
    colour=df.colour.where(df.index != 57, SECRET + "\u00e9")).to_csv(
        p, index=False, encoding="latin-1"))
DATES = _write("dates.csv", lambda df, p: df.assign(
    visit=pd.date_range("2020-01-01", periods=len(df)).strftime("%Y-%m-%d")).to_csv(
        p, index=False))


def _predict(tamper: Callable[[Path], None] | None = None, *, silo: str = "north",
             method: str = "local", out: Callable[[Path, Path], Path] | None = None,
             data: Callable[[Path], Path] | None = None, extra=()):
    """`predict` on a copy of the saved run (in the case folder), after `tamper(run_dir)`."""
    def setup(env, d):
        run = d / "run"
        shutil.copytree(env.run_dir, run)
        if tamper:
            tamper(run)
        src = data(d) if data else _copy(env.csv, d / "rows.csv")
        dest = out(d, src) if out else d / "pred.csv"
        return ["predict", "--run", str(run), "--silo", silo, "--method", method,
                "--data", str(src), "--out", str(dest), *extra]
    return setup


def _copy(src: Path, dest: Path) -> Path:
    shutil.copyfile(src, dest)
    return dest


def _manifest(run: Path, method: str = "local") -> dict:
    return json.loads((run / "models" / method / "manifest.json").read_text())


def _file(run: Path, silo: str, role: str, method: str = "local") -> Path:
    entry = next(s for s in _manifest(run, method)["silos"] if s["name"] == silo)
    return run / "models" / method / entry[role]


def _truncate(run):
    p = _file(run, "north", "params")
    p.write_bytes(p.read_bytes()[:100])


def _delete_card(run):
    _file(run, "north", "card").unlink()


def _swap_silos(run):
    shutil.copyfile(_file(run, "south", "params"), _file(run, "north", "params"))


def _swap_methods(run):
    shutil.copyfile(_file(run, "north", "params", "fedavg"), _file(run, "north", "params"))


def _old_manifest(then: Callable[[Path], None]):
    """A run saved before hashes were recorded (no sha256 in its manifest), then `then`."""
    def tamper(run):
        p = run / "models" / "local" / "manifest.json"
        man = json.loads(p.read_text())
        for s in man["silos"]:
            s.pop("sha256")
        man.pop("shared_sha256", None)
        p.write_text(json.dumps(man))
        then(run)
    return tamper


def _swap_cards(run):
    a, b = _file(run, "north", "card"), _file(run, "south", "card")
    ta, tb = a.read_bytes(), b.read_bytes()
    a.write_bytes(tb)
    b.write_bytes(ta)


def _symlink_to_input(d: Path, src: Path) -> Path:
    link = d / "link.csv"
    link.symlink_to(src)
    return link


def _deploy(*args):
    def setup(env, d):
        return ["deploy", "init", "--out", str(d / "consortium"), "--silo", "a", "--silo", "b",
                *args]
    return setup


def _plain(*args):
    def setup(env, d):
        return [a.replace("{d}", str(d)).replace("{csv}", str(env.csv)) for a in args]
    return setup


def _draft(make: Callable[[Path], Path]):
    def setup(env, d):
        return ["schema", "draft", str(make(d)), "--label-column", "outcome",
                "--silo-column", "hospital", "--out", str(d / "s.toml")]
    return setup


def _touch(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("not a folder")
    return p


def _sweep(**sections):
    def setup(env, d):
        raw = _raw(env, d, **sections)
        raw["training"].pop("methods")
        raw["sweep"] = {"methods": ["local"], "epsilon": [2.0], "nonprivate": False,
                        "lam": [0.1], "lr": [0.1], "seeds": [0], "workers": 1,
                        "results": str(d / "results.jsonl"), **sections.get("sweep", {})}
        raw["privacy"].pop("epsilon")
        raw["budget"] = sections.get("budget", {})  # none: scratch stores
        (d / "sweep.toml").write_text(tomli_w.dumps(raw))
        return ["sweep", "-q", str(d / "sweep.toml")]
    return setup


@dataclass
class Case:
    id: str
    setup: Callable[[Env, Path], list[str]]
    words: tuple[str, ...]


def C(id_, setup, *words):
    assert words, "a case must name what its message is about"
    return pytest.param(Case(id_, setup, words), id=id_)


CASES = [
    # --- privacy targets: δ ≥ 0.5 ran out of memory, ε = 1e6 overflowed ------------------
    C("delta-half", _run(privacy={"delta": 0.5}), "privacy.delta", "(0, 0.5)", "1e-5"),
    C("delta-0.9", _run(privacy={"delta": 0.9}), "privacy.delta", "(0, 0.5)"),
    C("delta-nan", _run(privacy={"delta": math.nan}), "privacy.delta", "nan"),
    C("epsilon-1e6", _run(privacy={"epsilon": 1e6}), "privacy.epsilon", "(0, 100]",
      "epsilon = 1.0"),
    C("epsilon-101", _run(privacy={"epsilon": 101.0}), "privacy.epsilon", "(0, 100]"),
    C("epsilon-nan", _run(privacy={"epsilon": math.nan}), "privacy.epsilon", "nan"),
    C("silo-delta-half", _run(privacy={"silos": {"north": {"delta": 0.7}}}),
      "privacy.silos.north.delta", "(0, 0.5)"),
    C("silo-epsilon-1e6", _run(privacy={"silos": {"south": {"epsilon": 1e6}}}),
      "privacy.silos.south.epsilon", "(0, 100]"),
    C("sweep-delta-half", _sweep(privacy={"delta": 0.5}), "privacy.delta", "(0, 0.5)"),
    C("sweep-epsilon-1e6", _sweep(sweep={"epsilon": [1e6]}), "epsilon", "(0, 100]"),
    C("delta-half-rdp", _run(privacy={"delta": 0.6, "accountant": "rdp"}), "privacy.delta"),
    C("target-too-loose-for-pld", _run(privacy={"epsilon": 100.0, "delta": 0.4}),
      "silo 'north'", "noise multiplier below 0.15", "lower epsilon or delta"),
    # --- run --set ------------------------------------------------------------------------
    C("set-epsilon-1e6", _run("--set", "privacy.epsilon=1e6"), "privacy.epsilon",
      "(0, 100]"),
    C("set-delta-half", _run("--set", "privacy.delta=0.5"), "privacy.delta"),
    C("set-unknown-key", _run("--set", "training.roundz=3"), "training.roundz",
      "valid keys of [training]", "rounds", "Did you mean 'training.rounds'"),
    C("set-unknown-section", _run("--set", "trainin.rounds=3"), "'trainin'",
      "valid sections", "Did you mean 'training'"),
    C("set-no-equals", _run("--set", "training.rounds"), "SECTION.KEY=VALUE"),
    C("set-no-section", _run("--set", "rounds=3"), "'rounds=3'", "SECTION.KEY=VALUE"),
    C("set-wrong-type", _run("--set", "training.rounds=many"), "training.rounds",
      "must be of type int"),
    C("set-with-resume", lambda env, d: ["run", "-q", "--resume", str(env.run_dir), "--set",
                                         "training.rounds=3"], "--resume"),
    # --- the budget store's path --------------------------------------------------------
    C("store-under-file", lambda env, d: ["run", "-q", "-c", str(_cfg(env, d, budget={
        "store": str(_touch(d / "notes.txt") / "budget.sqlite")}))],
      "notes.txt", "is a regular file, not a folder", "[budget] store"),
    C("store-under-file-deep", lambda env, d: ["run", "-q", "-c", str(_cfg(env, d, budget={
        "store": str(_touch(d / "notes.txt") / "a" / "b" / "budget.sqlite")}))],
      "notes.txt", "is a regular file"),
    C("store-option-under-file", lambda env, d: ["run", "-q", "-c", str(_cfg(env, d)),
                                                 "--store", str(_touch(d / "f") / "s.sqlite")],
      "is a regular file", "--store"),
    C("store-set-under-file", lambda env, d: ["run", "-q", "-c", str(_cfg(env, d)), "--set",
                                              f"budget.store='{_touch(d / 'f')}/s.sqlite'"],
      "is a regular file"),
    C("sweep-store-under-file", lambda env, d: _sweep(budget={
        "store": str(_touch(d / "notes.txt") / "b.sqlite"), "epsilon": 10.0})(env, d),
      "[budget] store", "notes.txt", "is a regular file"),
    C("budget-show-store-under-file", lambda env, d: [
        "budget", "show", "--store", str(_touch(d / "f") / "s.sqlite")], "does not exist"),
    # --- saved models: damaged, deleted, swapped ----------------------------------------
    C("model-truncated", _predict(_truncate), "model file of silo 'north'",
      "model-", ".npz", "does not match the SHA-256", "restore the run directory"),
    C("model-card-deleted", _predict(_delete_card), "model card of silo 'north'", "card-",
      "is missing", "restore the run directory"),
    C("model-swapped-silos", _predict(_swap_silos), "model file of silo 'north'",
      "swapped with another silo's or method's file"),
    C("model-swapped-methods", _predict(_swap_methods), "model file of silo 'north'",
      "(method 'local')", "does not match"),
    C("model-card-swapped", _predict(_swap_cards), "model card of silo 'north'",
      "does not match"),
    C("manifest-swapped-methods", _predict(lambda run: shutil.copyfile(
        run / "models" / "local" / "manifest.json", run / "models" / "fedavg" / "manifest.json")),
      "describes method 'local'", "'fedavg'"),
    C("old-run-truncated", _predict(_old_manifest(_truncate)), "model file of silo 'north'",
      "is damaged"),
    C("old-run-cards-swapped", _predict(_old_manifest(_swap_cards)),
      "describes silo 'south'", "not silo 'north'", "swapped"),
    C("old-run-card-deleted", _predict(_old_manifest(_delete_card)), "model card",
      "is missing"),
    # --- predict --out ------------------------------------------------------------------
    C("predict-out-is-input", _predict(out=lambda d, src: src), "--out",
      "is the input table", "--out predictions.csv"),
    C("predict-out-symlink-to-input", _predict(out=_symlink_to_input), "is the input table"),
    C("predict-out-other-spelling", _predict(out=lambda d, src: d / "sub" / ".." / src.name),
      "is the input table"),
    C("predict-out-is-dir", _predict(out=lambda d, src: d), "--out", "is a directory"),
    C("predict-out-under-file", _predict(out=lambda d, src: _touch(d / "f") / "p.csv"),
      "--out", "is a regular file"),
    C("draft-out-under-file", lambda env, d: [
        "schema", "draft", str(env.csv), "--label-column", "outcome", "--out",
        str(_touch(d / "f") / "s.toml")], "--out", "is a regular file"),
    C("draft-out-folder-missing", _plain("schema", "draft", "{csv}", "--label-column",
                                         "outcome", "--out", "{d}/nodir/s.toml"),
      "the folder of --out does not exist", "nodir"),
    C("predict-out-in-models", _predict(out=lambda d, src: d / "run" / "models" / "p.csv"),
      "inside the run's saved models"),
    # --- tables: encoding, separator, dates, drop ---------------------------------------
    C("table-latin1", _run(csv=LATIN), "could not read", "latin.csv", "as utf-8",
      "(line 59", "[data] encoding", "latin-1"),
    C("table-semicolons", _run(csv=SEMI), "semi.csv", "semicolon-separated",
      '[data] sep = ";"'),
    C("table-tabs", _run(csv=TABS), "tabs.csv", "tab-separated", r'[data] sep = "\t"'),
    C("table-encoding-unknown", _run(data={"encoding": "klingon"}), "[data] encoding",
      "'klingon'", "not a known text encoding"),
    C("table-drop-unknown", _run(data={"drop": ["visitt"]}), "[data] drop", "visitt",
      "does not have"),
    C("table-drop-string", _run(data={"drop": "visit"}), "data.drop", "list"),
    C("table-dates-no-schema", _run(csv=DATES, data={"schema": None,
                                                     "standardize": "uncharged"}),
      "column 'visit'", "date-like", '[data] drop = ["visit"]'),
    C("table-wrong-sep-given", _run(data={"sep": ";"}), "hospital"),
    C("draft-semicolons", _draft(SEMI), "semicolon-separated", '--sep ";"'),
    C("draft-latin1", _draft(LATIN), "could not read", "--encoding", "(line 59"),
    C("predict-semicolons", _predict(data=SEMI), "semicolon-separated", "--sep"),
    C("predict-latin1", _predict(data=LATIN), "--encoding", "(line 59"),
    # --- deploy init: the job's privacy target ------------------------------------------
    C("deploy-epsilon-zero", _deploy("--epsilon", "0"), "--epsilon must be positive"),
    C("deploy-epsilon-negative", _deploy("--epsilon", "-1"), "--epsilon must be positive"),
    C("deploy-epsilon-nan", _deploy("--epsilon", "nan"), "--epsilon", "nan"),
    C("deploy-epsilon-inf", _deploy("--epsilon", "inf"), "--epsilon", "(0, 100]"),
    C("deploy-epsilon-1e6", _deploy("--epsilon", "1e6"), "--epsilon", "(0, 100]"),
    C("deploy-delta-half", _deploy("--delta", "0.5"), "--delta", "(0, 0.5)"),
    C("deploy-delta-zero", _deploy("--delta", "0"), "--delta must be positive"),
    # --- paths in a config are relative to the config file ------------------------------
    C("config-relative-path-missing", lambda env, d: _relative_cfg(d, "missing.csv"),
      "data file not found", "sub/missing.csv"),
    C("config-relative-schema-missing", lambda env, d: _relative_cfg(
        d, "../data.csv", schema="nope.toml"), "schema file not found", "sub/nope.toml"),
]


def _relative_cfg(d: Path, data: str, schema: str = "../schema.toml") -> list[str]:
    """A config in d/sub naming files relative to itself; the test's cwd is elsewhere."""
    sub = d / "sub"
    sub.mkdir()
    _frame().to_csv(d / "data.csv", index=False)
    (d / "schema.toml").write_text(tomli_w.dumps(SCHEMA))
    raw = {"data": {"source": "table", "path": data, "silo_column": "hospital",
                    "label_column": "outcome", "schema": schema},
           "training": {"rounds": 2, "batch_size": 4, "methods": ["local"]},
           "budget": {"store": "store.sqlite"}, "output": {"dir": str(d / "runs")}}
    (sub / "run.toml").write_text(tomli_w.dumps(raw))
    return ["run", "-q", "-c", str(sub / "run.toml")]


def _snapshot(d: Path) -> dict:
    """Every path under `d` (files with size and mtime); a budget store a refused job
    opened is checked for charges instead (`_charges`)."""
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file()
            else "dir" for p in d.rglob("*") if not p.name.endswith(".lock")
            and ".sqlite" not in p.name}


def _charges(d: Path) -> int:
    n = 0
    for p in d.rglob("*.sqlite"):
        with sqlite3.connect(p) as con:
            n += con.execute("SELECT COUNT(*) FROM charges").fetchone()[0]
    return n


@pytest.mark.parametrize("case", CASES)
def test_every_failure_is_clean(case: Case, env: Env, tmp_path, monkeypatch):
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # paths must not depend on where the user stands
    monkeypatch.setenv("SILOFL_LOG_DIR", str(tmp_path / "crash-logs"))
    d = tmp_path / "case"
    d.mkdir()
    args = case.setup(env, d)
    before = _snapshot(d)
    run_before = _snapshot(env.run_dir)
    store_charges = _charges(env.root)
    res = CliRunner().invoke(app, args)
    out = " ".join((res.stdout + res.stderr).split())
    flat = "".join(out.split())  # the terminal may wrap a long path anywhere
    assert res.exit_code == 2, (args, res.exception, out)
    for w in case.words:
        assert "".join(w.split()) in flat, (w, out)
    assert "inside silofl" not in out and "unexpected error" not in out, out
    assert "Traceback" not in out, out
    assert SECRET not in out, out
    assert _snapshot(d) == before, "the refused command wrote files"
    assert not any(elsewhere.iterdir()), "the refused command wrote into the working dir"
    assert not (tmp_path / "crash-logs").exists()
    assert _charges(d) == 0, "the refused command spent budget"
    assert _charges(env.root) == store_charges
    assert _snapshot(env.run_dir) == run_before


# --- what is not a failure any more ---------------------------------------------------------

def _ok(args: list[str]):
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, (args, res.output)
    return res


def _history(out_dir: Path) -> dict:
    (run,) = [p for p in out_dir.iterdir() if p.is_dir()]
    return json.loads((run / "history.json").read_text())


def test_config_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    """The same config runs from any working directory; its store lands next to it."""
    proj = tmp_path / "project"
    (proj / "configs").mkdir(parents=True)
    _frame().to_csv(proj / "data.csv", index=False)
    (proj / "schema.toml").write_text(tomli_w.dumps(SCHEMA))
    raw = {"data": {"source": "table", "path": "../data.csv", "silo_column": "hospital",
                    "label_column": "outcome", "schema": "../schema.toml"},
           "training": {"rounds": 1, "batch_size": 4, "methods": ["local"]},
           "privacy": {"noise": "seeded"},
           "budget": {"store": "budget.sqlite", "epsilon": 10.0}}
    (proj / "configs" / "run.toml").write_text(tomli_w.dumps(raw))
    for cwd in (tmp_path / "a", tmp_path / "b" / "c"):
        cwd.mkdir(parents=True)
        monkeypatch.chdir(cwd)
        _ok(["run", "-q", "-c", str(proj / "configs" / "run.toml"), "--out", "runs"])
        assert (cwd / "runs").is_dir()  # [output] dir / --out: the working directory
    # both runs charged the one store next to the config file (2 runs × 3 silos)
    assert not list((tmp_path / "a").rglob("budget.sqlite"))
    assert _charges(proj / "configs") >= 6


def test_sweep_schema_is_relative_to_the_config_file(tmp_path, monkeypatch):
    _frame().to_csv(tmp_path / "data.csv", index=False)
    (tmp_path / "schema.toml").write_text(tomli_w.dumps(SCHEMA))
    raw = {"data": {"source": "table", "path": "data.csv", "silo_column": "hospital",
                    "label_column": "outcome", "schema": "schema.toml"},
           "training": {"rounds": 1, "batch_size": 4}, "privacy": {"noise": "seeded",
                                                                  "delta": 1e-4},
           "sweep": {"methods": ["local"], "epsilon": [2.0], "nonprivate": False,
                     "lam": [0.1], "lr": [0.1], "seeds": [0], "results": "r.jsonl"}}
    (tmp_path / "sweep.toml").write_text(tomli_w.dumps(raw))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    _ok(["sweep", "-q", str(tmp_path / "sweep.toml")])
    assert (tmp_path / "r.jsonl").is_file()


def test_run_set_overrides_the_config(env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _frame().to_csv(tmp_path / "mine.csv", index=False)
    cfg = _cfg(env, tmp_path, training={"rounds": 3})
    _ok(["run", "-q", "-c", str(cfg), "--set", "training.rounds=1", "--set",
         'training.methods=["local", "fedavg"]', "--set", "data.path=mine.csv"])
    hist = _history(tmp_path / "runs")
    assert set(hist) == {"local", "fedavg"}
    assert all(len(h["pooled"]) == 1 for h in hist.values())
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    saved = (run / "config.toml").read_text()
    assert str(tmp_path / "mine.csv") in saved  # --set paths: relative to the cwd


def test_run_set_without_a_config_file(tmp_path, monkeypatch):
    """--set works on the defaults too (the built-in heart data)."""
    monkeypatch.chdir(tmp_path)
    _ok(["run", "-q", "--scratch", "--set", "training.rounds=1", "--set",
         'training.methods=["local"]', "--set", "privacy.noise='seeded'"])
    assert list(_history(tmp_path / "runs")) == ["local"]


def test_tables_read_with_the_offered_settings(tmp_path):
    """The files the corpus refuses read exactly like the comma/UTF-8 original with the
    setting the message names."""
    df = _frame().assign(colour=lambda f: f.colour.map(
        {"red": "r\u00e9d", "green": "green", "blue": "blue"}))
    schema = json.loads(json.dumps(SCHEMA))
    schema["columns"][1]["levels"] = ["blue", "green", "r\u00e9d"]
    df.to_csv(tmp_path / "plain.csv", index=False)
    df.to_csv(tmp_path / "semi.csv", index=False, sep=";", encoding="cp1252")
    from silofl.data.tabular import load_table_raw
    a = load_table_raw(tmp_path / "plain.csv", "hospital", "outcome", schema=schema)
    b = load_table_raw(tmp_path / "semi.csv", "hospital", "outcome", schema=schema,
                       read_options={"sep": ";", "encoding": "cp1252"})
    df.to_csv(tmp_path / "bom.csv", index=False, encoding="utf-8-sig")  # Excel's UTF-8
    c = load_table_raw(tmp_path / "bom.csv", "hospital", "outcome", schema=schema)
    for other in (b, c):
        assert [s.name for s in other.silos] == [s.name for s in a.silos]
        for sa, sb in zip(a.silos, other.silos):
            np.testing.assert_array_equal(sa.X_train, sb.X_train)
            np.testing.assert_array_equal(sa.y_train, sb.y_train)


def test_set_keys_are_toml_keys():
    from silofl.config.input import apply_overrides, parse_override
    assert parse_override('privacy.silos."VA Long Beach".epsilon=0.5') == (
        ["privacy", "silos", "VA Long Beach", "epsilon"], 0.5)
    assert parse_override("training.we_user=a=b") == (["training", "we_user"], "a=b")
    assert parse_override("training.methods=['local']")[1] == ["local"]
    raw = apply_overrides({"privacy": {"epsilon": 2.0}},
                          ['privacy.silos."VA Long Beach".epsilon=0.5'])
    assert raw == {"privacy": {"epsilon": 2.0, "silos": {"VA Long Beach": {"epsilon": 0.5}}}}


def test_a_date_column_is_dropped_by_config(env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(env, tmp_path, DATES(tmp_path), data={"schema": None,
                                                     "standardize": "uncharged",
                                                     "drop": ["visit"]},
               budget={"epsilon": 10.0})
    _ok(["run", "-q", "-c", str(cfg)])
    cfg = _cfg(env, tmp_path, DATES(tmp_path))  # a declared schema ignores the column
    _ok(["run", "-q", "-c", str(cfg)])


def test_schema_draft_leaves_out_identifiers_and_dates(tmp_path):
    import tomllib

    from silofl.data.schema import load_schema
    df = _frame()
    df.insert(0, "patient_id", np.arange(1000, 1000 + len(df)))
    df["visit"] = pd.date_range("2020-01-01", periods=len(df)).strftime("%Y-%m-%d")
    df["ref"] = [f"r{i:04d}" for i in range(len(df))]  # unique text: an unnamed identifier
    df["patient_age"] = np.random.default_rng(1).integers(20, 30, len(df))
    df.to_csv(tmp_path / "t.csv", index=False)
    res = _ok(["schema", "draft", str(tmp_path / "t.csv"), "--label-column", "outcome",
               "--silo-column", "hospital", "--out", str(tmp_path / "s.toml")])
    text = (tmp_path / "s.toml").read_text()
    drafted = [c["name"] for c in tomllib.loads(text)["columns"]]
    assert drafted == ["x", "colour", "patient_age"]
    for col in ("patient_id", "visit", "ref"):
        assert f'#   "{col}":' in text
        assert f"column '{col}' left out of the draft" in " ".join(res.stderr.split())
    assert "[data] schema" in " ".join(res.stdout.split())  # printed literally
    (tmp_path / "s.toml").write_text(text.replace("drafted = true\n", ""))
    from silofl.data.tabular import load_table_raw
    raw = load_table_raw(tmp_path / "t.csv", "hospital", "outcome",
                         schema=load_schema(tmp_path / "s.toml"))
    assert not any(n.startswith(("patient_id", "visit", "ref")) for n in raw.feature_names)


@pytest.mark.parametrize("argv, words", [
    (["run", "--help"], ["[budget] store", "--set"]),
    (["audit", "--help"], ["[output] dir"]),
    (["report", "--help"], ["[report] epsilon"]),
    (["deploy", "init", "--help"], ["[job] setting"]),
])
def test_help_keeps_section_names(argv, words):
    out = " ".join(_ok(argv).stdout.replace("│", " ").split())  # rich's box edges
    for w in words:
        assert w in out, (w, out)


def _commands(cmd, path=()):
    import click
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))


def test_every_bracketed_name_in_a_help_text_is_printed():
    """Whatever a help string names in brackets ([data], [budget] …) reaches the screen:
    rich markup would drop it as an unknown style tag."""
    import re

    import typer
    checked = 0
    for path, cmd in _commands(typer.main.get_command(app)):
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        names = {m for t in texts for m in re.findall(r"\[([a-z][a-z_.]*)\]", t)}
        if not names:
            continue
        res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250"})
        assert res.exit_code == 0, (path, res.output)
        for n in names:
            assert f"[{n}]" in res.stdout, (path, n)
            checked += 1
    assert checked >= 5  # run, audit, report, deploy init, deploy key at least


def test_calibration_refuses_targets_it_cannot_compute():
    """Before: δ = 0.6 exhausted memory (TiB-sized PLD grid), ε = 1e6 overflowed."""
    from silofl.errors import CalibrationError, PrivacyError
    from silofl.privacy import accounting as A
    with pytest.raises(PrivacyError, match=r"epsilon must be in \(0, 100\]"):
        A.calibrate_dpsgd(1e6, 1e-5, 0.2, 20)
    with pytest.raises(PrivacyError, match=r"delta must be in \(0, 0.5\)"):
        A.calibrate_dpsgd(2.0, 0.6, 0.2, 20)
    with pytest.raises(PrivacyError, match="epsilon must be positive"):
        A.calibrate(lambda s: A.dpsgd_event(0.2, s, 20), math.nan, 1e-5)
    with pytest.raises(PrivacyError, match="below 0.15") as e:
        A.calibrate_dpsgd(100.0, 0.49, 0.2, 20)  # in range, but σ would be < 0.15
    assert not isinstance(e.value, CalibrationError)  # not "too strict": too loose
    sigma = A.calibrate_dpsgd(100.0, 1e-4, 0.2, 20)  # the ceiling itself still works
    assert 0.15 <= sigma < 1 and A.epsilon(A.dpsgd_event(0.2, sigma, 20), 1e-4) <= 100


def test_saved_models_carry_hashes_that_match(env):
    from silofl.io import sha256_file
    for method in ("local", "fedavg"):
        man = _manifest(env.run_dir, method)
        d = env.run_dir / "models" / method
        for s in man["silos"]:
            assert s["sha256"] == {"params": sha256_file(d / s["params"]),
                                   "card": sha256_file(d / s["card"])}
        if man["shared"]:
            assert man["shared_sha256"] == sha256_file(d / man["shared"])
    from silofl import load_run
    assert load_run(env.run_dir).shared("fedavg") is not None
