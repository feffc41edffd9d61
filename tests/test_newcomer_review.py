"""A newcomer's walk-through (issue 19, acceptance): three hospitals' messy CSVs to
predictions, from the CLI and the README only. Each test is a step that did not work as a
newcomer would expect, reproduced on a small table:

- `predict` printed the clip warnings as Python's ``file.py:330: UserWarning`` with a
  source line (every command now prints one ``warning:`` line);
- `predict --run runs` (the folder of runs, not one run) said "run again";
- a run with several methods asked for ``method:`` where the CLI option is ``--method``;
- `deploy init --schema s --table A=… --table B=…` (the README's form) was refused with
  "name the silos", and a mistyped table path was accepted silently;
- a hospital with a Latin-1 / semicolon export could not deploy at all: the reader told it
  to set ``[data] encoding``, which a silo's config refused as an unknown key.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

from silo_tables import SILOS, three_silo_frame
from silofl.cli import app
from silofl.errors import ConfigError
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.network.silo_table import read_silo_table, table_settings

logging.getLogger("absl").setLevel(logging.ERROR)

SCHEMA = {"silo_column": "hospital",
          "label": {"name": "outcome", "kind": "binary", "classes": [0, 1]},
          "columns": [{"name": "x", "kind": "numeric", "lower": -4, "upper": 4},
                      {"name": "colour", "kind": "categorical",
                       "levels": ["blue", "green", "réd"]}]}


def _frame(n: int = 30, seed: int = 0) -> pd.DataFrame:
    return three_silo_frame(n, seed, colours=("réd", "green", "blue"))  # a non-ASCII level


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A finished run with two methods (local, fedavg) under <root>/runs/saved."""
    root = tmp_path_factory.mktemp("newcomer")
    _frame().to_csv(root / "t.csv", index=False)
    (root / "schema.toml").write_text(tomli_w.dumps(SCHEMA))
    raw = {"data": {"source": "table", "path": "t.csv", "silo_column": "hospital",
                    "label_column": "outcome", "schema": "schema.toml"},
           "training": {"rounds": 2, "batch_size": 4, "methods": ["local", "fedavg"]},
           "privacy": {"epsilon": 2.0, "delta": 1e-4, "noise": "seeded"},
           "budget": {"store": "store.sqlite"},
           "output": {"dir": str(root / "runs"), "name": "saved"}}
    (root / "run.toml").write_text(tomli_w.dumps(raw))
    res = CliRunner().invoke(app, ["run", "-q", "-c", str(root / "run.toml")])
    assert res.exit_code == 0, res.output
    return root / "runs" / "saved"


def test_predict_prints_a_clip_warning_as_one_line_not_a_python_warning(saved, tmp_path):
    rows = _frame(seed=1)
    rows["x"] = rows["x"].astype(float)
    rows.loc[3, "x"] = np.inf  # a placeholder a spreadsheet export writes
    rows.to_csv(tmp_path / "new.csv", index=False)
    # a fresh process: in this one `silofl run` (the fixture) already set the printer
    res = subprocess.run([sys.executable, "-m", "silofl.cli", "predict", "--run", str(saved),
                          "--silo", "north", "--method", "local",
                          "--data", str(tmp_path / "new.csv"), "--out", str(tmp_path / "p.csv")],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    assert "warning: column 'x': 1 value(s) are infinite" in res.stderr
    assert "UserWarning" not in res.stderr and ".py:" not in res.stderr


def test_predict_on_the_folder_of_runs_names_a_run_directory(saved, tmp_path):
    res = CliRunner().invoke(app, ["predict", "--run", str(saved.parent), "--silo", "north",
                                   "--method", "local", "--data", str(saved / "config.toml"),
                                   "--out", str(tmp_path / "p.csv")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "folder of runs" in text and str(saved) in text
    assert "run again" not in text
    assert not (tmp_path / "p.csv").exists()


def test_predict_without_method_names_the_cli_option(saved, tmp_path):
    _frame(seed=2).to_csv(tmp_path / "new.csv", index=False)
    res = CliRunner().invoke(app, ["predict", "--run", str(saved), "--silo", "north",
                                   "--data", str(tmp_path / "new.csv"),
                                   "--out", str(tmp_path / "p.csv")])
    assert res.exit_code == 2, res.output
    assert "--method" in res.output and "'fedavg'" in res.output


needs_flower = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("flwr", "cryptography")),
    reason="the network extra (silofl[flower]) is not installed")


@needs_flower
def test_deploy_init_takes_the_silo_names_from_table(tmp_path):
    (tmp_path / "schema.toml").write_text(tomli_w.dumps(SCHEMA))
    for h in ("north", "south"):
        _frame().query("hospital == @h").to_csv(tmp_path / f"{h}.csv", index=False)
    res = CliRunner().invoke(app, ["deploy", "init", "--out", str(tmp_path / "c"),
                                   "--schema", str(tmp_path / "schema.toml"),
                                   "--table", f"north={tmp_path / 'north.csv'}",
                                   "--table", f"south={tmp_path / 'typo.csv'}"])
    assert res.exit_code == 0, res.output
    folders = sorted(p.name.split("-")[0] for p in (tmp_path / "c" / "silos").iterdir())
    assert folders == ["north", "south"]
    text = " ".join(res.output.split())
    assert "--table south:" in text and "typo.csv" in text and "not a file" in text
    assert "--table north:" not in text


@needs_flower
def test_deploy_init_refuses_one_silo_named_twice_by_table(tmp_path):
    (tmp_path / "schema.toml").write_text(tomli_w.dumps(SCHEMA))
    res = CliRunner().invoke(app, ["deploy", "init", "--out", str(tmp_path / "c"),
                                   "--schema", str(tmp_path / "schema.toml"),
                                   "--table", "north=a.csv", "--table", "north=b.csv"])
    assert res.exit_code == 2, res.output
    assert "twice" in res.output
    assert not (tmp_path / "c").exists()


def test_a_silo_reads_its_latin1_semicolon_export(tmp_path):
    (tmp_path / "schema.toml").write_text(tomli_w.dumps(SCHEMA), encoding="utf-8")
    rows = _frame().query("hospital == 'north'")
    rows.to_csv(tmp_path / "north.csv", index=False, sep=";", encoding="latin-1")
    target = PrivacyTarget(1.0, 1e-4)
    plain = table_settings({"path": "north.csv", "schema": "schema.toml"}, tmp_path, "s")
    with pytest.raises(Exception, match=r"\[data\] encoding"):  # what the reader says
        read_silo_table("north", plain, target)
    ts = table_settings({"path": "north.csv", "schema": "schema.toml",
                         "encoding": "latin-1", "sep": ";"}, tmp_path, "silo.toml")
    raw, _ = read_silo_table("north", ts, target)
    s = raw.silos[0]
    assert s.n_train + len(s.y_test) == len(rows)
    # the silo's rows are the file's rows: same labels, in some split
    assert sorted(np.concatenate([s.y_train, s.y_test]).tolist()) == \
        sorted(rows["outcome"].tolist())


@pytest.mark.parametrize("bad, word", [({"encoding": 1}, "encoding"), ({"sep": [";"]}, "sep"),
                                       ({"drop": "visit_date"}, "drop"),
                                       ({"encodng": "latin-1"}, "encodng")])
def test_a_silo_refuses_a_bad_reader_setting(tmp_path, bad, word):
    with pytest.raises(ConfigError, match=word):
        table_settings({"path": "t.csv", "schema": "s.toml", **bad}, tmp_path, "silo.toml")


def test_schema_draft_points_out_placeholders_and_spellings(tmp_path):
    """A 1e308 placeholder became ``upper = 1e+308`` and four spellings of one category
    became four levels, silently."""
    df = _frame()
    df["x"] = df["x"].astype(float)
    df.loc[4, "x"], df.loc[40, "x"] = 1e308, -np.inf
    df["colour"] = df["colour"].replace({"blue": "BLUE"})
    df.loc[[5, 6], "colour"] = ["blue", "Blue "]
    df.loc[7, "colour"] = "red"  # 'réd' without the accent
    df.to_csv(tmp_path / "t.csv", index=False)
    res = subprocess.run([sys.executable, "-m", "silofl.cli", "schema", "draft",
                          str(tmp_path / "t.csv"), "--label-column", "outcome",
                          "--silo-column", "hospital", "--out", str(tmp_path / "s.toml")],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    import tomllib
    doc = tomllib.loads((tmp_path / "s.toml").read_text(encoding="utf-8"))
    x = next(c for c in doc["columns"] if c["name"] == "x")
    finite = df["x"][np.isfinite(df["x"]) & (df["x"].abs() < 1e100)]
    assert (x["lower"], x["upper"]) == (finite.min(), finite.max())
    assert "column 'x': 2 cell(s) hold ±inf or a magnitude above 1e+100" in res.stderr
    assert "column 'colour': " in res.stderr and "spelled several ways" in res.stderr
    assert "UserWarning" not in res.stderr
    text = (tmp_path / "s.toml").read_text(encoding="utf-8")
    assert "'BLUE' / 'Blue' / 'blue'" in text or "'BLUE' / 'blue' / 'Blue'" in text
    assert "'réd' / 'red'" in text or "'red' / 'réd'" in text


@pytest.mark.parametrize("levels, groups", [
    (["Female", "Male"], []),
    (["Female", "M", "Male", "fémale"], [["Female", "fémale"], ["Male", "M"]]),
    (["typical angina", "atypical angina", "non-anginal", "non-Angina l"],
     [["non-anginal", "non-Angina l"]]),
    (["A", "AB", "B"], []),      # blood groups: 'A' starts 'AB' but both are short codes
    ([0, 1, "0"], []),           # numbers are matched by value elsewhere, not here
])
def test_spelling_groups(levels, groups):
    from silofl.data.draft_checks import spelling_groups
    assert spelling_groups(levels) == groups


def test_set_a_list_key_to_one_word_shows_the_list_form(saved, tmp_path):
    """`--set training.methods=local` (a newcomer's first try) names the form that works,
    and that form runs."""
    cfg = saved.parent.parent / "run.toml"
    base = ["run", "-q", "-c", str(cfg), "--scratch", "--out", str(tmp_path / "runs"),
            "--set", "training.rounds=1"]
    res = CliRunner().invoke(app, [*base, "--set", "training.methods=local"])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert """--set 'training.methods=["local"]'""" in text
    assert not (tmp_path / "runs").exists()
    res = CliRunner().invoke(app, [*base, "--set", 'training.methods=["local"]'])
    assert res.exit_code == 0, res.output


def test_a_networked_silo_shows_its_baseline_beside_its_metric():
    """Over the network each silo printed only 'test metric (local) 0.8919': the one-class
    model that `silofl run` flags looked fine at the silo."""
    from silofl.experiments.quality import silo_line
    y = np.array([0] * 33 + [1] * 4)                     # 33/37 = 0.8919 majority
    one_class = float(np.mean(y == 0))
    line = silo_line("accuracy", one_class, y)
    assert line.startswith(f"{33 / 37:.4f} accuracy (maj. {33 / 37:.4f}, n=37")
    assert "NOT BEATEN" in line and "TINY" not in line
    better = silo_line("accuracy", 35 / 37, y)
    assert "NOT BEATEN" not in better
    small = silo_line("accuracy", 0.9, y[:10])
    assert "TINY" in small and "n=10" in small
    assert "NOT BEATEN" in silo_line("mse", 2.0, np.array([0.0, 1.0, 2.0]))  # var 2/3


def _deploy(tmp_path, *args):
    (tmp_path / "schema.toml").write_text(tomli_w.dumps(SCHEMA), encoding="utf-8")
    return CliRunner().invoke(app, ["deploy", "init", "--out", str(tmp_path / "c"),
                                    "--schema", str(tmp_path / "schema.toml"), *args])


@needs_flower
def test_deploy_init_splits_a_latin1_semicolon_table_with_sep_and_encoding(tmp_path):
    _frame().to_csv(tmp_path / "all.csv", index=False, sep=";", encoding="latin-1")
    res = _deploy(tmp_path, "--split", str(tmp_path / "all.csv"))
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "--encoding" in text or "--sep" in text       # a setting deploy init has
    assert "[data]" not in text and not (tmp_path / "c").exists()
    res = _deploy(tmp_path, "--split", str(tmp_path / "all.csv"), "--sep", ";",
                  "--encoding", "latin-1")
    assert res.exit_code == 0, res.output
    cut = {p.parent.name.split("-")[0]: pd.read_csv(p)
           for p in (tmp_path / "c" / "silos").glob("*/data.csv")}
    assert sorted(cut) == sorted(SILOS)
    assert (cut["north"]["colour"] == "réd").any()       # decoded, not mangled


@needs_flower
@pytest.mark.parametrize("args, words", [
    (["--silo", "A", "--set", "round=3"], ["'round'", "did you mean 'rounds'"]),
    (["--silo", "A", "--address", "127.0.0.1:99999"], ["port 99999", "1..65535"]),
    (["--silo", "A", "--sep", ";"], ["--split", "[data] sep"]),
])
def test_deploy_init_refuses_a_newcomers_typo_clearly(tmp_path, args, words):
    res = _deploy(tmp_path, *args)
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    for w in words:
        assert w in text
    assert not (tmp_path / "c").exists()


@needs_flower
def test_deploy_init_placeholder_note_keeps_its_section_name(tmp_path):
    res = _deploy(tmp_path, "--silo", "A")
    assert res.exit_code == 0, res.output
    assert "own table under [data] path" in " ".join(res.output.split())


@needs_flower
def test_a_second_server_on_a_taken_port_is_a_clear_error(tmp_path):
    """Flower exits with code 1 and its own line when the port is taken; `silofl server`
    says which address, why, and where to change it (exit 2)."""
    import socket
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        res = _deploy(tmp_path, "--silo", "A", "--address", f"127.0.0.1:{port}")
        assert res.exit_code == 0, res.output
        res = CliRunner().invoke(app, ["server", "--config",
                                       str(tmp_path / "c" / "server.toml")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert f"cannot listen on 127.0.0.1:{port}" in text and "[server] address" in text
    assert "unexpected error" not in text


def test_a_silos_new_store_is_not_flagged_as_deleted_at_its_second_round(tmp_path,
                                                                          monkeypatch):
    """A networked silo reserves every round on one BudgetStore object. Its fresh store
    was flagged 'charged elsewhere … itself (this file was deleted or replaced since)' at
    every round after the first (seen in `silofl budget show` after a 3-round job)."""
    import dp_accounting as dpa

    from silofl.privacy.budget import BudgetStore, PlannedCharge
    monkeypatch.setenv("SILOFL_HOME", str(tmp_path / "home"))
    ev = dpa.GaussianDpEvent(8.0)
    st = BudgetStore(tmp_path / "silo.sqlite")
    st.register({"A": PrivacyTarget(5.0, 1e-4)})
    for r in range(3):
        st.reserve(f"r{r}", [PlannedCharge("A", "mrmtl", "dpsgd", ev)], command="silo",
                   noise="secure", fingerprints={"A": "digest-of-A's-rows"})
    assert [x for x in st.log() if x["action"] == "charged-elsewhere"] == []
    st.close()
    # the genuine case still flags: the file replaced, the same data charged again
    (tmp_path / "silo.sqlite").unlink()
    with pytest.warns(UserWarning, match="deleted or replaced"):
        st = BudgetStore(tmp_path / "silo.sqlite")
        st.register({"A": PrivacyTarget(5.0, 1e-4)})
        st.reserve("r9", [PlannedCharge("A", "mrmtl", "dpsgd", ev)], command="silo",
                   noise="secure", fingerprints={"A": "digest-of-A's-rows"})
    assert [x["action"] for x in st.log()].count("charged-elsewhere") == 1
    st.close()


def test_schema_draft_with_a_misspelt_column_names_the_option_and_the_columns(tmp_path):
    _frame().to_csv(tmp_path / "t.csv", index=False)
    res = CliRunner().invoke(app, ["schema", "draft", str(tmp_path / "t.csv"),
                                   "--label-column", "Outcome", "--silo-column", "hospital",
                                   "--out", str(tmp_path / "s.toml")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "--label-column 'Outcome'" in text and "did you mean 'outcome'?" in text
    assert "'colour'" in text and "draft_schema" not in text
    assert not (tmp_path / "s.toml").exists()


def test_predict_names_the_data_file_and_every_missing_column(saved, tmp_path):
    wide = _frame(seed=3).drop(columns=["colour"])
    for i in range(25):  # a schema-less cut of a wide export
        wide[f"extra{i}"] = 0
    wide.drop(columns=["x"]).to_csv(tmp_path / "cut.csv", index=False)
    res = CliRunner().invoke(app, ["predict", "--run", str(saved), "--silo", "north",
                                   "--method", "local", "--data", str(tmp_path / "cut.csv"),
                                   "--out", str(tmp_path / "p.csv")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert f"--data {str(tmp_path / 'cut.csv')!r}" in text
    assert "lacks 2 column(s)" in text and "'x'" in text and "'colour'" in text
    assert not (tmp_path / "p.csv").exists()


@needs_flower
def test_a_second_process_of_one_silo_is_refused_before_it_connects(tmp_path):
    """Two `silofl silo --config same.toml` split the job's rounds between them and both
    saved "the" model into one folder (seen: 5 rounds in one, 4 in the other)."""
    from silofl.runtime.network.silo_config import load_silo_config
    from silofl.runtime.network.silo_lock import hold
    _frame().to_csv(tmp_path / "all.csv", index=False)
    res = _deploy(tmp_path, "--split", str(tmp_path / "all.csv"), "--address",
                  "127.0.0.1:1")  # nothing listens there: the test never connects
    assert res.exit_code == 0, res.output
    conf = next((tmp_path / "c" / "silos").glob("north-*/silo.toml"))
    cfg = load_silo_config(conf)
    with hold(cfg.state_dir, cfg.name):  # the first process, alive
        before = sorted(p.name for p in Path(cfg.state_dir).iterdir())
        res = CliRunner().invoke(app, ["silo", "--config", str(conf), "--wait", "1"])
        text = " ".join(res.output.split())
        assert res.exit_code == 2, res.output
        assert "already running" in text and str(cfg.state_dir) in text
        assert f"process {os.getpid()}" in text
        assert sorted(p.name for p in Path(cfg.state_dir).iterdir()) == before
    with hold(cfg.state_dir, cfg.name):  # released when the holder ends
        pass


def test_the_silo_lock_leaves_no_folder_when_the_silo_is_refused(tmp_path):
    from silofl.runtime.network.silo_lock import hold
    with pytest.raises(ConfigError):
        with hold(tmp_path / "state", "A"):
            raise ConfigError("bad table")
    assert not (tmp_path / "state").exists()


@needs_flower
def test_silo_and_server_logs_carry_no_flower_deprecation_banner():
    """Every silo log began with Flower's 15-line 'DEPRECATED FEATURE … flower-supernode
    --insecure' banner: noise an operator running with TLS cannot act on."""
    from silofl.runtime.network.flower import _quiet_deprecations

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("flwr", logging.WARNING, __file__, 1, msg, ("x",), None)
    _quiet_deprecations()
    _quiet_deprecations()  # idempotent: one filter
    flower = logging.getLogger("flwr")
    assert not flower.filter(record("DEPRECATED FEATURE: %s\n  removed soon"))
    assert not flower.filter(record("FEATURE UPDATE: %s"))
    assert flower.filter(record("round 1: silo %s exhausted"))  # silofl's own warnings stay
    assert len([f for f in flower.filters if getattr(f, "__name__", "") ==
                "_drop_flower_deprecation"]) == 1


@pytest.mark.parametrize("source", [None, "titanic"])
def test_own_table_keys_under_a_built_in_source_are_refused(tmp_path, source):
    """A newcomer writes [data] path/label_column/silo_column but forgets source = "table":
    the default source (the built-in heart data) would train and report on the demo data
    as if it were theirs. Refused, naming the keys and the fix; nothing charged."""
    from silofl.privacy.store_paths import default_store_path, demo_store_path
    _frame().to_csv(tmp_path / "mine.csv", index=False)
    data = {"path": "mine.csv", "label_column": "outcome", "silo_column": "hospital"}
    if source:
        data["source"] = source
    (tmp_path / "run.toml").write_text(tomli_w.dumps({"data": data}))
    res = CliRunner().invoke(app, ["run", "-q", "-c", str(tmp_path / "run.toml"),
                                   "--out", str(tmp_path / "runs")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "data.path" in text and 'source = "table"' in text
    assert not (tmp_path / "runs").exists()
    assert not default_store_path().exists() and not demo_store_path().exists()
