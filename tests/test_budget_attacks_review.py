"""An adversarial review of the lifetime budget after issue 19 (part 2): escapes found by
attacking the changes as an ordinary user would, each pinned by a test that failed
before its fix. Synchronised on files and store rows only (no sleeps, no clocks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from silofl.errors import ConfigError
from silofl.experiments.config import config_from_dict
from silofl.experiments.run import _toml_safe, resume_run
from silofl.experiments.run import run as run_experiment
from silofl.privacy import store_paths
from silofl.privacy.budget import BudgetStore


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Every test's own silofl home: never the real ~."""
    monkeypatch.setenv("SILOFL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _stop_at(round_: int):
    """An on_progress callback that presses Ctrl-C once `round_` is done."""
    def tick(label, t, total, pooled):
        if t >= round_:
            raise KeyboardInterrupt
    return tick


def _interrupted(cfg: dict, at: int = 2) -> Path:
    """Run `cfg` (checkpointed) and interrupt it after round `at`: its run folder."""
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config_from_dict(cfg), on_progress=_stop_at(at))
    d = Path(cfg["output"]["dir"]) / cfg["output"]["name"]
    assert (d / "checkpoint" / "job.json").is_file()
    return d


def test_an_edited_job_file_cannot_charge_private_data_to_the_demo_store(tmp_path, home):
    # the built-in public demo, interrupted: its job file names the (restartable) demo store
    out = {"dir": str(tmp_path / "runs"), "name": "demo", "checkpoint_every": 1}
    run_dir = _interrupted({"training": {"rounds": 20, "methods": ["local"]}, "output": out})
    jf = run_dir / "checkpoint" / "job.json"
    info = json.loads(jf.read_text())
    assert info["demo"] is True
    # the attack: a private source in the job file, the demo store kept, fresh checkpoint
    private = config_from_dict({
        "data": {"source": "synthetic", "seed": 3}, "model": {"name": "linear"},
        "privacy": {"epsilon": 5.0}, "training": {"rounds": 20, "methods": ["local"]},
        "output": out})
    jf.write_text(json.dumps(dict(info, config=_toml_safe(private.to_dict()))))
    for f in (run_dir / "checkpoint").glob("*.pkl"):
        f.unlink()
    with pytest.raises(ConfigError, match="demo store"):
        resume_run(run_dir)
    with BudgetStore(store_paths.demo_store_path(), demo=True) as st:
        assert st.silos() == ["Cleveland", "Hungary", "Switzerland", "VA Long Beach"]
        assert all(c["run_status"] == "interrupted" for n in st.silos()
                   for c in st.charges(n))  # nothing new was reserved or charged
