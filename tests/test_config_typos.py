"""A newcomer's typos in the personalization keys (issue 22): each is refused with the
fix spelled out ("did you mean"), exit 2, before a store, a charge or a run folder exists."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w
from typer.testing import CliRunner

from silofl.cli import app


def _toml(tmp: Path, training: dict, tuning: dict) -> Path:
    raw = {"data": {"source": "heart"}, "model": {"name": "logistic"},
           "training": {"methods": ["local", "mrmtl"], "rounds": 2, "batch_size": 8,
                        **training},
           "privacy": {"epsilon": 2.0, "delta": 1e-4, "noise": "seeded", "accountant": "rdp"},
           "budget": {"store": str(tmp / "budget.sqlite")},
           "output": {"dir": str(tmp / "runs")}, "tuning": tuning}
    p = tmp / "run.toml"
    p.write_text(tomli_w.dumps(raw))
    return p


@pytest.mark.parametrize("training, tuning, hint", [
    ({"methods": ["fedprx"]}, {}, "Did you mean 'fedprox'?"),
    ({"lam": "atuo"}, {}, 'did you mean "auto"?'),
    ({"clip": "Auto"}, {}, 'did you mean "auto"?'),
    ({"clip": "atuo"}, {}, 'did you mean "auto"?'),
    ({}, {"mode": "proxxy"}, "Did you mean 'proxy'?"),
    ({}, {"mode": "private", "method": "mrmtll"}, "Did you mean 'mrmtl'?"),
    ({}, {"mode": "private", "select": "subsampel"}, "Did you mean 'subsample'?"),
    # the mode ignores these keys, but a misspelt value is still refused
    ({}, {"select": "subsampel"}, "Did you mean 'subsample'?"),
    ({}, {"proxy_noise": "simulatd"}, "Did you mean 'simulated'?"),
    ({}, {"mode": "proxy", "proxy_source": "schol"},
     "unknown tuning.proxy_source 'schol'"),
    ({}, {"mode": "proxy", "proxy_source": "schol"}, "Did you mean 'school'?"),
    ({}, {"mode": "private", "distribution": "poison"}, "Did you mean 'poisson'?"),
])
def test_typo_is_refused_with_the_fix_and_nothing_written(tmp_path, training, tuning, hint):
    p = _toml(tmp_path, training, tuning)
    res = CliRunner().invoke(app, ["run", "-c", str(p)])
    assert res.exit_code == 2, res.output
    assert hint in " ".join(res.output.split())
    assert not (tmp_path / "budget.sqlite").exists()
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_sweep_lam_near_auto_says_how_to_write_it(tmp_path):
    raw = {"data": {"source": "heart"}, "training": {"rounds": 2},
           "sweep": {"methods": ["local", "mrmtl"], "epsilon": [1], "lam": ["Auto"],
                     "seeds": [0], "results": "sw.jsonl"}}
    p = tmp_path / "sw.toml"
    p.write_text(tomli_w.dumps(raw))
    res = CliRunner().invoke(app, ["sweep", str(p)])
    assert res.exit_code == 2, res.output
    msg = " ".join(res.output.split())
    assert "'sweep.lam' holds 'Auto'" in msg and 'exactly as "auto"' in msg
    assert not (tmp_path / "sw.jsonl").exists()


@pytest.mark.parametrize("tuning", [
    {"mode": "private", "lam": [0.1, 1.0], "mean_trials": 3},
    {"mode": "proxy", "proxy_source": "school"},
])
def test_lam_auto_and_a_tuning_mode_are_not_silently_combined(tmp_path, tuning):
    p = _toml(tmp_path, {"lam": "auto"}, tuning)
    res = CliRunner().invoke(app, ["run", "-c", str(p)])
    assert res.exit_code == 2, res.output
    assert "both choose λ of 'mrmtl': keep one" in " ".join(res.output.split())
    assert not (tmp_path / "budget.sqlite").exists()

