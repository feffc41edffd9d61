"""Resuming a killed run: `silofl run --resume DIR` continues from the last checkpoint with
the models, history, counters and (seeded) noise stream it had, and the budget store stays
consistent — the killed process's executed charges are kept, the rest is reserved anew,
nothing is charged twice and nothing is forgotten."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tomli_w
from typer.testing import CliRunner

from ledger_wait import wait_for_rounds
from silofl.cli import app
from silofl.config import config_from_dict
from silofl.errors import ConfigError
from silofl.experiments.resume import resume_run
from silofl.experiments.run import run as run_experiment
from silofl.privacy.budget import BudgetStore
from silofl.privacy.ledger import silo_file_id

ROUNDS = 300
METHODS = ["local", "mrmtl"]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Every test's own silofl home (inherited by the subprocesses it starts)."""
    monkeypatch.setenv("SILOFL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _config(noise: str, store: Path | None = None) -> dict:
    # an explicit lifetime store (the built-in data's default is the demo store)
    return {"training": {"rounds": ROUNDS, "methods": METHODS},
            "privacy": {"epsilon": 1.0, "delta": 1e-4, "noise": noise},
            # a resumed run re-reads the rounds after its last checkpoint: room for them
            "budget": {"epsilon": 2.0, **({"store": str(store)} if store else {})},
            "output": {"name": "job"}}


def _killed_then_resumed(tmp: Path, noise: str) -> Path:
    """Start the job in a subprocess, SIGKILL it at a random round of a random method,
    resume it through the CLI; returns the run directory."""
    cfg = tmp / "job.toml"
    out = tmp / "runs"
    cfg.write_text(tomli_w.dumps(_config(noise, out / "budget.sqlite")))
    proc = subprocess.Popen([sys.executable, "-m", "silofl.cli", "run", "--config", str(cfg),
                             "--out", str(out), "-q"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    rng = random.Random()
    method, at = rng.choice(METHODS), rng.randint(3, ROUNDS // 2)
    ledger = out / "job" / "ledgers" / method / f"{silo_file_id('Cleveland')}.jsonl"
    try:
        wait_for_rounds(proc, ledger, at)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (out / "job" / "checkpoint" / "job.json").is_file()
    with BudgetStore(out / "budget.sqlite") as st:  # the killed run's reservation counts
        assert all(st.spent(n)["unfinished_runs"] == 1 for n in st.silos())
    res = CliRunner().invoke(app, ["run", "--resume", str(out / "job"), "-q"])
    assert res.exit_code == 0, res.output
    assert "resumed from checkpoint" in " ".join(res.output.split())
    assert not (out / "job" / "checkpoint").exists()  # finished: nothing left to resume
    return out / "job"


def _ledgers(d: Path) -> dict:
    """Each ledger file's lines without their run id (which differs between any two runs)."""
    return {str(p.relative_to(d)): [{k: v for k, v in json.loads(x).items() if k != "run"}
                                    for x in p.read_text().splitlines()]
            for p in sorted((d / "ledgers").rglob("*.jsonl"))}


@pytest.mark.slow
def test_seeded_run_killed_and_resumed_equals_an_uninterrupted_run(tmp_path):
    ref = run_experiment(config_from_dict(_config("seeded", tmp_path / "ref" / "budget.sqlite")),
                         tmp_path / "ref")
    d = _killed_then_resumed(tmp_path, "seeded")
    assert _ledgers(d) == _ledgers(ref.run_dir)
    for label in ("local", "mrmtl(λ=0.3)"):
        for name in ref.results[0].silos:
            f = f"models/{label}/model-{silo_file_id(name)}.npz"
            assert np.array_equal(np.load(d / f)["params"], np.load(ref.run_dir / f)["params"])
    a = json.loads((d / "summary.json").read_text())["methods"]
    b = json.loads((ref.run_dir / "summary.json").read_text())["methods"]
    assert [m["per_silo"] for m in a] == [m["per_silo"] for m in b]
    # the store: the killed run's executed charges and the resumed remainder; at least
    # what the uninterrupted run spent (rounds after the checkpoint were read twice)
    with BudgetStore(d.parent / "budget.sqlite") as st, \
            BudgetStore(ref.run_dir.parent / "budget.sqlite") as st0:
        assert st.silos() == st0.silos() != []
        for name in st.silos():
            spent, spent0 = st.spent(name), st0.spent(name)
            assert spent["unfinished_runs"] == 0
            assert spent0["epsilon"] <= spent["epsilon"] <= 2.0
            statuses = {c["run_status"] for c in st.charges(name)}
            assert statuses == {"killed", "finished"}
    notes = json.loads((d / "privacy_report.json").read_text())["notes"]
    assert any("interrupted" in n for n in notes)


@pytest.mark.slow
def test_secure_run_killed_and_resumed_stays_within_its_budget(tmp_path):
    d = _killed_then_resumed(tmp_path, "secure")
    priv = json.loads((d / "privacy_report.json").read_text())
    assert any("fresh OS entropy" in n for n in priv["notes"])
    for rows in priv["methods"].values():  # the model's ledger: exactly the planned rounds
        for row in rows:
            assert row["within_target"]
    for lines in _ledgers(d).values():
        assert [x["round"] for x in lines] == list(range(1, ROUNDS + 1))
    with BudgetStore(d.parent / "budget.sqlite") as st:
        assert st.silos()
        for name in st.silos():
            assert st.spent(name)["epsilon"] <= 2.0 and st.spent(name)["unfinished_runs"] == 0


def test_nothing_to_resume_is_a_clear_error(tmp_path):
    rep = run_experiment(config_from_dict({**_config("secure"), "training": {
        "rounds": 2, "methods": ["local"]}}), tmp_path)
    with pytest.raises(ConfigError, match="no resumable run"):
        resume_run(rep.run_dir)
    res = CliRunner().invoke(app, ["run", "--resume", str(tmp_path / "nope"), "-q"])
    assert res.exit_code == 2 and "no resumable run" in " ".join(res.output.split())
