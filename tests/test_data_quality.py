"""A messy table never passes silently (issue 19, part 4): ±inf and 1e308 feature values,
columns with no value at all and repeated header names get a specific error (or, where a
declared schema says what to do, a warning), and `[data] min_silo_rows` refuses or drops a
silo too small to train or test on -- before anything is charged or written."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from silofl.cli import app
from silofl.config import config_from_dict
from silofl.data.table_checks import HUGE
from silofl.data.tabular import load_table_raw
from silofl.errors import DataError


def _frame(sizes=(200, 200, 12), seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    parts = []
    for h, n in zip(("A", "B", "C"), sizes):
        x = rng.normal(size=n)
        y = (x > 0.3).astype(int)
        y[:2] = [0, 1]
        parts.append(pd.DataFrame({"h": h, "x": x.round(4), "z": rng.normal(size=n).round(4),
                                   "y": y}))
    return pd.concat(parts, ignore_index=True)


SCHEMA = {"source": "test", "silo_column": "h",
          "label": {"name": "y", "kind": "binary", "classes": [0, 1]},
          "columns": [{"name": "x", "kind": "numeric", "lower": -5, "upper": 5},
                      {"name": "z", "kind": "numeric", "lower": -5, "upper": 5,
                       "nullable": True}]}


@pytest.mark.parametrize("bad", [np.inf, -np.inf, 1e308, -1.7976931348623157e308, 1e101])
def test_a_value_that_is_no_measurement_is_refused_without_bounds(tmp_path, bad):
    df = _frame()
    df["x"] = df["x"].astype(float)
    df.loc[[3, 250], "x"] = bad
    df.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DataError) as err:
        load_table_raw(tmp_path / "t.csv", "h", "y")
    msg = str(err.value)
    assert "column 'x': 2 value(s)" in msg and "silo 'A': 1" in msg and "silo 'B': 1" in msg
    assert ("infinite" in msg) == bool(np.isinf(bad)) and "bounds" in msg
    assert "308" not in msg and "1e+101" not in msg.replace(f"{HUGE:g}", "")  # no values


def test_declared_bounds_clip_with_a_warning_that_counts(tmp_path):
    df = _frame()
    df["x"] = df["x"].astype(float)
    df.loc[[3, 4, 250], "x"] = [np.inf, 1e308, -1e200]
    df.to_csv(tmp_path / "t.csv", index=False)
    with pytest.warns(UserWarning, match=r"column 'x': 3 value\(s\) are infinite or of "
                                         r"magnitude above .* clipped to the declared bounds"):
        raw = load_table_raw(tmp_path / "t.csv", "h", "y", schema=SCHEMA)
    X = np.concatenate([np.vstack([s.X_train, s.X_test]) for s in raw.silos])
    assert np.nanmax(np.abs(X[:, 0])) == 5.0  # clipped, not dropped


def test_an_ordinary_table_gives_no_warning(tmp_path):
    _frame().to_csv(tmp_path / "t.csv", index=False)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_table_raw(tmp_path / "t.csv", "h", "y", schema=SCHEMA)


def test_an_all_missing_column(tmp_path):
    df = _frame()
    df["z"] = np.nan
    df.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DataError, match=r"feature column\(s\) \['z'\] have no value in any"):
        load_table_raw(tmp_path / "t.csv", "h", "y")  # no schema: the column is refused
    with pytest.warns(UserWarning, match=r"\['z'\] have no value in any row"):
        load_table_raw(tmp_path / "t.csv", "h", "y", schema=SCHEMA)  # declared nullable
    with pytest.raises(DataError, match=r"\['z'\] have no value.*nullable = true"):
        load_table_raw(tmp_path / "t.csv", "h", "y", schema=SCHEMA, missing="drop")


def test_a_repeated_header_name_is_refused(tmp_path):
    df = _frame()
    path = tmp_path / "t.csv"
    text = df.to_csv(index=False).replace("h,x,z,y", "h,x,x,y", 1)
    path.write_text(text)
    with pytest.raises(DataError, match=r"names column\(s\) \['x'\] more than once"):
        load_table_raw(path, "h", "y")
    # a genuine column named like pandas' renaming is not a repeat
    path.write_text(df.rename(columns={"z": "x.1"}).to_csv(index=False))
    assert load_table_raw(path, "h", "y").feature_names == ["x", "x.1"]


# --- [data] min_silo_rows -----------------------------------------------------------------

def _config(d: Path, extra: str) -> Path:
    _frame().to_csv(d / "t.csv", index=False)
    cfg = d / "run.toml"
    cfg.write_text(f"""[data]
source = "table"
path = "{d / 't.csv'}"
silo_column = "h"
label_column = "y"
standardize = "uncharged"
impute = "uncharged"
{extra}
[training]
rounds = 2
[privacy]
noise = "seeded"
[output]
dir = "{d / 'runs'}"
name = "r"
""")
    return cfg


def _charges(store: Path) -> int:
    """Rows in the store's charges and runs tables (0 when no store was created)."""
    if not store.exists():
        return 0
    with sqlite3.connect(store) as con:
        return sum(con.execute(f"select count(*) from {t}").fetchone()[0]
                   for t in ("charges", "runs"))


def test_a_small_silo_is_refused_before_anything_is_charged(tmp_path):
    cfg = _config(tmp_path, "min_silo_rows = 5")
    store = tmp_path / "store" / "budget.sqlite"
    store.parent.mkdir()
    res = CliRunner().invoke(app, ["run", "-c", str(cfg), "-q", "--store", str(store)])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "'C' (10 training / 2 test rows)" in out and "min_silo_rows = 5" in out
    assert 'small_silos = "drop"' in out  # how to fix it
    assert not (tmp_path / "runs").exists() and _charges(store) == 0


def test_a_small_silo_is_dropped_and_listed_when_asked(tmp_path):
    cfg = _config(tmp_path, 'min_silo_rows = 5\nsmall_silos = "drop"')
    res = CliRunner().invoke(app, ["run", "-c", str(cfg), "-q", "--scratch"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "1 silo(s) dropped by [data] min_silo_rows" in out and "C (10 train / 2 test" in out
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert summary["dropped_silos"] == [{"silo": "C", "n_train": 10, "n_test": 2}]
    assert all(set(m["per_silo"]) == {"A", "B"} for m in summary["methods"])


def test_min_silo_rows_off_by_default_and_checked():
    assert config_from_dict({}).data.min_silo_rows == 0
    assert config_from_dict({}).data.small_silos == "refuse"
    from silofl.data.silo_size import check_settings
    from silofl.errors import ConfigError
    with pytest.raises(ConfigError, match="min_silo_rows must be a whole number"):
        check_settings(-1, "refuse")
    with pytest.raises(ConfigError, match="small_silos must be one of refuse, drop"):
        check_settings(3, "dorp")


def test_min_silo_rows_applies_to_every_source_and_to_its_privacy_overrides():
    """The built-in heart data: Switzerland has 25 test rows. Its [privacy.silos] override
    does not stop it from being dropped (it is listed instead)."""
    from silofl.experiments import build
    raw = {"data": {"min_silo_rows": 30}, "privacy": {"silos": {"Switzerland": {"epsilon": 0.5}}}}
    with pytest.raises(DataError, match=r"'Switzerland' \(\d+ training / 25 test rows\)"):
        build.load_raw(config_from_dict(raw).data)
    raw["data"]["small_silos"] = "drop"
    cfg = config_from_dict(raw)
    fed = build.apply_privacy(build.load_raw(cfg.data), cfg)
    assert "Switzerland" not in fed.names and len(fed.names) == 3
    assert [d["silo"] for d in fed.meta["dropped_silos"]] == ["Switzerland"]
    assert all(s.n_test >= 30 and s.n_train >= 30 for s in fed.silos)
