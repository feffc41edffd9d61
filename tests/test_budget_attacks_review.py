"""An adversarial review of the lifetime budget after issue 19 (part 2): escapes found by
attacking the changes as an ordinary user would, each pinned by a test that failed
before its fix. Synchronised on files and store rows only (no sleeps, no clocks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from silofl.config import config_from_dict
from silofl.errors import ConfigError
from silofl.experiments.resume import resume_run
from silofl.experiments.run import _toml_safe
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


def _private_table(d: Path) -> dict:
    """A private CSV with a silo column and a declared schema: a job config for it."""
    import numpy as np
    rng = np.random.default_rng(7)
    n = 300
    age = rng.normal(50, 10, n).round(1)
    rows = ["age,bp,site,y"] + [
        f"{a},{rng.normal(120, 15):.0f},{'ABC'[i % 3]},{int(a + rng.normal(0, 5) > 50)}"
        for i, a in enumerate(age)]
    (d / "private.csv").write_text("\n".join(rows) + "\n")
    (d / "schema.toml").write_text(
        'source = "the study protocol"\nsilo_column = "site"\n'
        '[label]\nname = "y"\nkind = "binary"\nclasses = [0, 1]\n'
        '[[columns]]\nname = "age"\nkind = "numeric"\nlower = 0\nupper = 120\n'
        'nullable = false\n'
        '[[columns]]\nname = "bp"\nkind = "numeric"\nlower = 40\nupper = 250\n'
        'nullable = false\n')
    return {"data": {"source": "table", "path": str(d / "private.csv"), "label_column": "y",
                     "silo_column": "site", "schema": str(d / "schema.toml")},
            "model": {"name": "logistic"}, "training": {"rounds": 2, "methods": ["local"]},
            "output": {"dir": ""}}


def test_a_new_deployment_is_flagged_even_with_another_split_of_the_same_rows(tmp_path):
    base = _private_table(tmp_path)
    with BudgetStore(store_paths.default_store_path()) as st:
        run_experiment(config_from_dict(base), store=st)
    # the attack: the same rows, another train/test split, in a new deployment's store
    for i, change in enumerate(({"seed": 5}, {"test_fraction": 0.3})):
        cfg = dict(base, data=dict(base["data"], **change),
                   budget={"deployment": f"other{i}"})
        with pytest.warns(UserWarning, match="already charged"):
            run_experiment(config_from_dict(cfg))
        with BudgetStore(store_paths.default_store_path(f"other{i}")) as st:
            flagged = {x["silo"] for x in st.log() if x["action"] == "charged-elsewhere"}
        assert flagged == {"A", "B", "C"}


def test_a_second_deploy_init_of_a_python_federation_is_not_a_new_budget(tmp_path):
    pytest.importorskip("flwr")
    from silofl.runtime.network import consortium, deploy
    from silofl.runtime.network.silo_config import load_silo_config
    fed = deploy.demo_data("heart")  # handed over as a consortium's own federation
    stores = []
    for folder in ("first", "second"):  # the attack: deploy the same silos again elsewhere
        w = consortium.init(tmp_path / folder, federation=fed, noise="seeded")
        stores.append({n: load_silo_config(p).budget_store for n, p in w["silos"].items()})
    assert stores[0] == stores[1]
    assert set(stores[0].values()) == {store_paths.default_store_path()}


@pytest.mark.parametrize("delta", [0.5, 0.9])
def test_a_lifetime_delta_that_promises_nothing_is_refused_everywhere(tmp_path, delta):
    """δ ≥ 0.5 composed every charge to ε ≈ 0: `[budget] delta = 0.9` let a silo run any
    number of jobs while its store printed "spent 0.000"."""
    from typer.testing import CliRunner

    from silofl.cli import app
    from silofl.errors import SiloflError
    from silofl.privacy.targets import PrivacyTarget
    base = _private_table(tmp_path)
    with pytest.raises(ConfigError, match="budget.delta"):
        config_from_dict(dict(base, budget={"epsilon": 1.0, "delta": delta}))
    path = tmp_path / "b.sqlite"
    with BudgetStore(path) as st:
        with pytest.raises(SiloflError, match="0.5"):  # any caller: a silo, the pandemic track
            st.register({"a": PrivacyTarget(1.0, delta)})
        st.register({"a": PrivacyTarget(1.0, 1e-4)})
    res = CliRunner().invoke(app, ["budget", "set-target", "--silo", "a", "--epsilon", "5",
                                   "--delta", str(delta), "--reason", "r", "--yes",
                                   "--store", str(path)])
    assert res.exit_code == 2 and "0.5" in res.output, res.output
    with BudgetStore(path) as st:
        assert st.target("a") == PrivacyTarget(1.0, 1e-4) and st.log() == []


def test_a_store_restored_from_an_older_copy_is_flagged(tmp_path):
    """cp store backup; run; cp backup store: the store forgot the run in between. The
    machine registry counts the runs each store reserved, so the next run says so."""
    import shutil
    import warnings
    cfg = config_from_dict(dict(_private_table(tmp_path), budget={"epsilon": 5.0}))
    store = store_paths.default_store_path()
    run_experiment(cfg)
    backup = tmp_path / "backup.sqlite"
    with BudgetStore(store) as st:  # a consistent copy, as `sqlite3 .backup` would make
        st._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    shutil.copyfile(store, backup)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an ordinary second run: nothing to flag
        run_experiment(cfg)
    with BudgetStore(store) as st:
        st._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    shutil.copyfile(backup, store)  # the attack: the second run's charges are gone
    with pytest.warns(UserWarning, match="fewer runs than this machine saw"):
        run_experiment(cfg)
    with BudgetStore(store) as st:
        assert [x["action"] for x in st.log()].count("store-rolled-back") == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # flagged once, then counted from there
        run_experiment(cfg)


def test_ctrl_c_right_after_the_reservation_never_prints_a_false_nothing_charged(
        tmp_path, monkeypatch):
    """Ctrl-C in the instant after the reservation commits (during the machine-registry
    check, before any data is read) used to escape the job's handler: the terminal said
    "no budget was reserved, nothing was charged" while the store kept the whole job
    reserved, with no run folder to resume it from. Now that reservation is released
    (nothing was read) and the message is true."""
    from typer.testing import CliRunner

    from silofl.cli import app

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(store_paths, "note_charged", interrupted)
    cfg = dict(_private_table(tmp_path), output={"dir": str(tmp_path / "runs")})
    import tomli_w
    (tmp_path / "job.toml").write_text(tomli_w.dumps(cfg))
    res = CliRunner().invoke(app, ["run", "-c", str(tmp_path / "job.toml"), "-q"])
    assert res.exit_code == 130, res.output
    with BudgetStore(store_paths.default_store_path()) as st:
        assert st.silos() == ["A", "B", "C"]
        for n in st.silos():
            assert st.spent(n)["unfinished_runs"] == 0
            assert st.charges(n) == []  # no data was read: nothing is charged
    assert "nothing was charged" in " ".join(res.output.split())
    assert not (tmp_path / "runs").exists()


def test_resuming_against_a_deleted_store_creates_no_empty_store(tmp_path):
    """A refused resume used to leave an empty store at the deleted store's path, so the
    next run charged it without the loud 'NEW budget store created' announcement."""
    out = {"dir": str(tmp_path / "runs"), "name": "p", "checkpoint_every": 1}
    run_dir = _interrupted(dict(_private_table(tmp_path), output=out,
                                training={"rounds": 10, "methods": ["local"]}))
    store = store_paths.default_store_path()
    for f in store.parent.glob(store.name + "*"):
        f.unlink()  # the attack (or an accident): the store file is gone
    with pytest.raises(ConfigError, match="does not exist"):
        resume_run(run_dir)
    assert not store.exists()
    with pytest.warns(UserWarning, match="NEW budget store created"):
        run_experiment(config_from_dict(dict(_private_table(tmp_path),
                                             output={"dir": ""})))


def test_a_reset_budget_is_named_in_every_later_output(tmp_path):
    """`budget reset` (not --new-cohort: the same people) starts a fresh epoch; the next
    run's outputs printed a clean lifetime position with no word of the reset."""
    from typer.testing import CliRunner

    from silofl.cli import app
    cfg = dict(_private_table(tmp_path), budget={"epsilon": 5.0},
               output={"dir": str(tmp_path / "runs"), "name": "second"})
    first = run_experiment(config_from_dict(dict(cfg, output={"dir": ""})))
    assert not any("reset" in n for n in first.notes())
    res = CliRunner().invoke(app, ["budget", "reset", "--silo", "B", "--reason",
                                   "board approval 7", "--yes"])
    assert res.exit_code == 0, res.output
    rep = run_experiment(config_from_dict(cfg))
    reset = [n for n in rep.notes() if "was reset" in n]
    assert len(reset) == 1 and "'B'" in reset[0] and "board approval 7" in reset[0]
    for name in ("summary.json", "privacy_report.json"):
        notes = json.loads((rep.run_dir / name).read_text())["notes"]
        assert reset[0] in notes


def test_renaming_a_silo_in_the_same_store_is_flagged_as_a_rename(tmp_path):
    """The same rows under a new silo name are a new silo to the store (a fresh budget);
    the registry flags it, and says why: not 'this file was deleted'."""
    cfg = dict(_private_table(tmp_path), budget={"epsilon": 5.0})
    run_experiment(config_from_dict(cfg))
    csv = tmp_path / "private.csv"
    csv.write_text(csv.read_text().replace(",A,", ",A2,"))  # the attack: rename silo A
    schema = tmp_path / "schema.toml"
    with pytest.warns(UserWarning) as caught:
        run_experiment(config_from_dict(cfg))
    text = " ".join(" ".join(str(w.message) for w in caught).split())
    assert "silo 'A2': already charged" in text
    assert "as silo 'A'" in text and "deleted or replaced" not in text
    assert schema.is_file()


def test_the_python_api_cannot_hand_a_private_job_the_demo_store(tmp_path):
    """`run(cfg, store=BudgetStore(<demo store>, demo=True))`: the demo store restarts
    when spent, so it may only ever charge the built-in public heart data."""
    path = store_paths.demo_store_path()
    with BudgetStore(path, demo=True) as demo:
        with pytest.raises(ConfigError, match="demo store"):
            run_experiment(config_from_dict(_private_table(tmp_path)), store=demo)
        assert demo.silos() == []  # nothing registered, nothing reserved
