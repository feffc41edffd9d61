"""Attacks on the issue-22 features (auto λ, clip = "auto", the peer methods, subsample and
proxy tuning): each test failed before its fix."""

from __future__ import annotations

import logging
import os
import shutil
import tomllib
import warnings
from pathlib import Path

import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

from silofl.cli import app
from test_tuning_modes import _proxy_toml, _spent, _toml

logging.getLogger("absl").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", category=RuntimeWarning)


def _nothing_written(tmp: Path) -> bool:
    return not (tmp / "runs").exists() or not any((tmp / "runs").iterdir())


# --- clip = "auto" with subsample tuning -------------------------------------------------

def test_auto_clip_with_subsample_tuning_is_refused_before_anything_runs(tmp_path):
    """Before: the plan declared the subsample trials as plain Gaussian steps, the pivot
    charged adaptive-clipping steps, the ledger refused mid-run — after Local had run and
    been charged (ε ≈ 1.6 per silo spent, no output). Now: exit 2, nothing spent."""
    p = _toml(tmp_path, {"mode": "private", "select": "subsample", "lam": [0.1, 1.0],
                         "mean_trials": 3}, )
    text = p.read_text().replace("batch_size = 8", "batch_size = 8\nclip = \"auto\"")
    p.write_text(text)
    res = CliRunner().invoke(app, ["run", "-c", str(p)])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "select = 'subsample' needs a fixed clip" in out
    assert _spent(tmp_path) == [0.0, 0.0]
    assert _nothing_written(tmp_path)


# --- proxy tuning on the silos' own table under another name ------------------------------

def _disguise(tmp: Path, how: str) -> str:
    src, dst = tmp / "silos.csv", tmp / f"public_{how}.csv"
    if how == "symlink":
        os.symlink(src, dst)
    elif how == "hardlink":
        os.link(src, dst)
    elif how == "copy":
        shutil.copyfile(src, dst)
    else:  # the same rows, shuffled, under other silo names, written anew
        df = pd.read_csv(src).sample(frac=1.0, random_state=0)
        df["site"] = df["site"].map({"s1": "a", "s2": "b", "s3": "a"})
        df.to_csv(dst, index=False)
    return str(dst)


@pytest.mark.parametrize("how", ["symlink", "hardlink", "copy", "resplit"])
def test_proxy_refuses_the_silos_table_under_another_name(tmp_path, how):
    """Before: only the same resolved path was refused, so a hard link, a copy or a
    re-split of the silos' table ran as a "public" proxy and the report said the choice
    cost the silos nothing. Now: exit 2, nothing charged or written; the message names no
    count or hash of the silos' rows."""
    p = _proxy_toml(tmp_path, str(tmp_path / "proxy.csv"))
    disguised = _disguise(tmp_path, how)
    p.write_text(p.read_text().replace(str(tmp_path / "proxy.csv"), disguised))
    res = CliRunner().invoke(app, ["run", "-c", str(p)])
    assert res.exit_code == 2, res.output
    assert "silos' own" in " ".join(res.output.split())
    assert _spent(tmp_path, ("s1", "s2", "s3")) == [0.0, 0.0, 0.0]
    assert _nothing_written(tmp_path)


def test_proxy_overlap_check_refuses_own_rows_and_passes_others():
    """The row check alone: the silos' federation against itself is refused; the same
    silos with every feature moved by 1e-3 (no row in common) pass."""
    import dataclasses

    from silofl.errors import ConfigError
    from silofl.experiments.proxy_tuning import check_disjoint
    from test_tuning import _fed
    fed = _fed(3)
    with pytest.raises(ConfigError, match="silos' own rows"):
        check_disjoint(fed, fed)
    moved = dataclasses.replace(fed, silos=[dataclasses.replace(
        s, X_train=s.X_train + 1e-3, X_test=s.X_test + 1e-3) for s in fed.silos])
    check_disjoint(moved, fed)


# --- SCAFFOLD without a step size ---------------------------------------------------------

def test_scaffold_with_lr_zero_is_refused_before_the_store_is_opened(tmp_path):
    """Before: refused inside the first silo step — after the budget store had been created
    and the run reserved (and released). Now: exit 2 before any store or run folder."""
    p = _toml(tmp_path, {})
    d = tomllib.loads(p.read_text())
    d.pop("tuning")
    d["training"].update(methods=["scaffold"], lr=0.0)
    p.write_text(tomli_w.dumps(d))
    res = CliRunner().invoke(app, ["run", "-c", str(p)])
    assert res.exit_code == 2, res.output
    assert "set lr > 0" in " ".join(res.output.split())
    assert not (tmp_path / "budget.sqlite").exists()
    assert _nothing_written(tmp_path)


def test_sweep_refuses_auto_clip_with_subsample_tuning_when_loaded(tmp_path):
    """A sweep would have run (and charged) its other cells before the tuned cell's plan
    refused: the sweep config itself is refused."""
    import json

    from silofl.errors import ConfigError
    from silofl.experiments.sweep_config import sweep_config_from_dict
    from test_tuning import BASE
    raw = json.loads(json.dumps(BASE))
    raw["sweep"]["results"] = str(tmp_path / "r.jsonl")
    raw["tuning"].update({"select": "subsample", "subsample_fraction": 0.2})
    raw.setdefault("training", {})["clip"] = "auto"
    with pytest.raises(ConfigError, match="select = 'subsample' needs a fixed clip"):
        sweep_config_from_dict(raw, tmp_path)
