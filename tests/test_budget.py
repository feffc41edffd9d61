"""The lifetime budget store: every private run charges it before touching data, budgets
never reset by themselves (re-runs, crashes, concurrent processes), and every way of
changing a budget is explicit and logged."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest
import tomli_w
from typer.testing import CliRunner

from silofl.algorithms import make_algorithm
from silofl.cli import app, crash_frames
from silofl.config import config_from_dict
from silofl.data import linear_silos
from silofl.errors import BudgetExceeded
from silofl.experiments.run import run as run_experiment
from silofl.models import make_model
from silofl.privacy import accounting as A
from silofl.privacy import events as E
from silofl.privacy.budget import BudgetStore, BudgetStoreError, PlannedCharge
from silofl.privacy.ledger import silo_file_id, tightest
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig, plan_silos
from silofl.runtime.simulator import simulate
from silofl.training.silo_data import SiloArrays

DELTA = 1e-5
runner = CliRunner()


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Every test's own silofl home: default stores and the registry never touch ~."""
    monkeypatch.setenv("SILOFL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _fed(eps=2.0, seed=0):
    return linear_silos(num_silos=3, sizes=[60, 80, 100], dim=3, seed=seed).with_targets(
        PrivacyTarget(eps, DELTA))


def _cfg(**kw):
    base = dict(rounds=3, batch_size=10, lr=0.05, clip=1.0, accountant="rdp")
    base.update(kw)
    return TrainingConfig(**base)


@pytest.fixture
def gathers(monkeypatch):
    """Count every read of private training rows (the single access point)."""
    log = []
    orig = SiloArrays.gather

    def spy(self, silos, idx):
        log.append(len(silos))
        return orig(self, silos, idx)
    monkeypatch.setattr(SiloArrays, "gather", spy)
    return log


# --- the protocol ------------------------------------------------------------------------------

def test_two_runs_spend_twice_and_the_third_is_refused_before_any_data_access(tmp_path,
                                                                              gathers):
    fed, cfg, alg = _fed(eps=1.0), _cfg(), make_algorithm("mrmtl", lam=0.5)
    plans = plan_silos(fed, alg, cfg)
    # lifetime budget: exactly two such runs (composed under the tightest bound) fit
    two = [tightest(dpa.SelfComposedDpEvent(p.declared, 2), DELTA)[0] for p in plans]
    three = [tightest(dpa.SelfComposedDpEvent(p.declared, 3), DELTA)[0] for p in plans]
    life = {s.name: PrivacyTarget((a + b) / 2, DELTA) for s, a, b in zip(fed.silos, two, three)}
    store = BudgetStore(tmp_path / "b.sqlite")
    for i in range(2):
        simulate(fed, make_model("linear", 3), alg, cfg, plans=plans, store=store,
                 lifetime=life)
        for k, s in enumerate(fed.silos):
            spent = store.spent(s.name)
            one_more = tightest(dpa.SelfComposedDpEvent(plans[k].declared, i + 1), DELTA)
            assert spent["epsilon"] == pytest.approx(one_more[0], rel=1e-9)
    reads = len(gathers)
    with pytest.raises(BudgetExceeded, match="lifetime ε would reach"):
        simulate(fed, make_model("linear", 3), alg, cfg, plans=plans, store=store,
                 lifetime=life)
    assert len(gathers) == reads  # refused before any data access
    # the refusal reserved nothing: the store still shows exactly two runs per silo
    for s in fed.silos:
        assert {c["status"] for c in store.charges(s.name)} == {"charged"}
        assert len({c["run"] for c in store.charges(s.name)}) == 2


def test_a_new_process_sees_the_old_charges(tmp_path):
    fed, cfg = _fed(), _cfg()
    path = tmp_path / "b.sqlite"
    with BudgetStore(path) as st:
        simulate(fed, make_model("linear", 3), make_algorithm("fedavg"), cfg, store=st)
    before = {s.name: BudgetStore(path).spent(s.name)["epsilon"] for s in fed.silos}
    assert all(0.5 < e <= 2.0 for e in before.values())
    # the same job again (another "command"): refused, the budget did not reset
    with BudgetStore(path) as st, pytest.raises(BudgetExceeded):
        simulate(fed, make_model("linear", 3), make_algorithm("fedavg"), cfg, store=st)


def test_reservation_is_all_or_nothing_across_silos(tmp_path):
    st = BudgetStore(tmp_path / "b.sqlite")
    st.register({"a": PrivacyTarget(1.0, DELTA), "b": PrivacyTarget(0.1, DELTA)})
    ev = A.dpsgd_event(0.1, 4.0, 50)
    assert 0.1 < tightest(ev, DELTA)[0] < 1.0
    with pytest.raises(BudgetExceeded, match="silo 'b'"):
        st.reserve("r1", [PlannedCharge("a", "m", "x", ev), PlannedCharge("b", "m", "x", ev)],
                   command="test", noise="secure")
    assert st.spent("a")["epsilon"] == 0.0 and st.charges("a") == []


def test_settle_replaces_the_reservation_by_what_executed(tmp_path):
    st = BudgetStore(tmp_path / "b.sqlite")
    st.register({"a": PrivacyTarget(5.0, DELTA)})
    step = A.dpsgd_event(0.1, 2.0, 10)
    st.reserve("r1", [PlannedCharge("a", "m", "plan", step, 5)], command="t", noise="secure")
    planned = st.spent("a")["epsilon"]
    assert st.spent("a")["unfinished_runs"] == 1
    st.settle("r1", [PlannedCharge("a", "m", "dpsgd", step, 2)])  # stopped after 2 of 5
    done = st.spent("a")
    assert done["unfinished_runs"] == 0
    assert done["epsilon"] == pytest.approx(tightest(A.dpsgd_event(0.1, 2.0, 20), DELTA)[0])
    assert done["epsilon"] < planned
    with pytest.raises(BudgetStoreError, match="more .* than it reserved"):
        st.reserve("r2", [PlannedCharge("a", "m", "plan", step, 1)], command="t",
                   noise="secure")
        st.settle("r2", [PlannedCharge("a", "m", "dpsgd", step, 2)])


# --- crashes and concurrency -------------------------------------------------------------------

def _job_config(tmp_path: Path, store: Path, rounds: int, eps: float = 4.0) -> Path:
    csv = tmp_path / "data.csv"
    if not csv.exists():
        fed = _fed()
        import pandas as pd
        rows = []
        for s in fed.silos:
            for X, y in ((s.X_train, s.y_train), (s.X_test, s.y_test)):
                for x, t in zip(X, y):
                    rows.append({"site": s.name, "x0": x[0], "x1": x[1], "x2": x[2], "y": t})
        pd.DataFrame(rows).to_csv(csv, index=False)
        # public facts: three numeric features in [-5, 5], a regression label
        schema = {"silo_column": "site", "label": {"name": "y", "kind": "regression"},
                  "columns": [{"name": f"x{j}", "kind": "numeric", "lower": -5, "upper": 5}
                              for j in range(3)]}
        (tmp_path / "schema.toml").write_text(tomli_w.dumps(schema))
    cfg = {"data": {"source": "table", "path": str(csv), "silo_column": "site",
                    "label_column": "y", "schema": str(tmp_path / "schema.toml")},
           "model": {"name": "linear"},
           "training": {"methods": ["local"], "rounds": rounds, "batch_size": 10,
                        "local_epochs": 5.0},
           "privacy": {"epsilon": eps, "delta": DELTA, "accountant": "rdp"},
           "budget": {"store": str(store)}, "output": {"dir": str(tmp_path / "runs")}}
    p = tmp_path / f"job-{rounds}.toml"
    p.write_text(tomli_w.dumps(cfg))
    return p


@pytest.mark.slow
def test_sigkill_mid_training_keeps_the_reservation_and_the_rerun_sees_it(tmp_path):
    store = tmp_path / "budget.sqlite"
    long = _job_config(tmp_path, store, rounds=5_000, eps=4.0)
    proc = subprocess.Popen([sys.executable, "-m", "silofl.cli", "run", "--config", str(long),
                             "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 300  # a bound, not a window
        while time.monotonic() < deadline:  # until the store shows 20 rounds trained
            if store.exists():
                try:
                    with sqlite3.connect(store) as db:
                        n = db.execute("SELECT COALESCE(SUM(count), 0) FROM progress WHERE "
                                       "label = 'dpsgd'").fetchone()[0]
                except sqlite3.OperationalError:
                    n = 0
                if n >= 20:
                    break
            assert proc.poll() is None, "the long job ended before it could be killed"
            time.sleep(0.05)
        else:
            pytest.fail("the job never started training")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    with BudgetStore(store) as st:
        for name in st.silos():
            s = st.spent(name)
            assert s["unfinished_runs"] == 1  # the killed run's whole reservation counts
            assert 0.9 * 4.0 < s["epsilon"] <= 4.0
    # a re-run (even a short one) sees the charges and is refused
    short = _job_config(tmp_path, store, rounds=2, eps=4.0)
    res = runner.invoke(app, ["run", "--config", str(short), "-q"])
    assert res.exit_code == 2 and "lifetime ε would reach" in " ".join(res.output.split())


def _race(path, barrier, results):
    st = BudgetStore(path)
    ev = A.dpsgd_event(0.1, 6.0, 300)
    barrier.wait()
    try:
        st.reserve(f"run-{os.getpid()}", [PlannedCharge("a", "m", "x", ev)], command="race",
                   noise="secure")
        results.put("ok")
    except BudgetExceeded:
        results.put("refused")


@pytest.mark.slow
def test_two_concurrent_processes_cannot_overspend(tmp_path):
    path = tmp_path / "b.sqlite"
    ev = A.dpsgd_event(0.1, 6.0, 300)
    one = tightest(ev, DELTA)[0]
    two = tightest(dpa.SelfComposedDpEvent(ev, 2), DELTA)[0]
    BudgetStore(path).register({"a": PrivacyTarget((one + two) / 2, DELTA)})
    ctx = multiprocessing.get_context("spawn")
    for _ in range(3):  # a few races, each on a fresh budget
        BudgetStore(path).reset("a", "test race", new_cohort=True)
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_race, args=(path, barrier, results)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)  # bound; they finish in seconds
        got = sorted(results.get(timeout=300) for _ in procs)
        assert got == ["ok", "refused"]
        assert BudgetStore(path).spent("a")["epsilon"] <= (one + two) / 2


# --- administration and bad stores -------------------------------------------------------------

def test_reset_needs_yes_and_a_reason_and_is_logged(tmp_path):
    path = tmp_path / "b.sqlite"
    st = BudgetStore(path)
    st.register({"A B": PrivacyTarget(1.0, DELTA)})
    st.reserve("r", [PlannedCharge("A B", "m", "x", A.dpsgd_event(0.1, 4.0, 50))],
               command="t", noise="secure")
    spent = st.spent("A B")["epsilon"]
    res = runner.invoke(app, ["budget", "reset", "--silo", "A B", "--reason", "new cohort",
                              "--store", str(path)])
    assert res.exit_code == 2 and "--yes" in res.output
    assert BudgetStore(path).spent("A B")["epsilon"] == spent
    with pytest.raises(BudgetStoreError, match="needs a reason"):
        st.reset("A B", "  ")
    res = runner.invoke(app, ["budget", "reset", "--silo", "A B", "--reason", "2027 cohort",
                              "--store", str(path), "--new-cohort", "--yes"])
    assert res.exit_code == 0, res.output
    st = BudgetStore(path)
    assert st.spent("A B")["epsilon"] == 0.0 and st.spent("A B")["epoch"] == 1
    assert [(x["action"], x["reason"]) for x in st.log()] == [("new-cohort", "2027 cohort")]
    assert len(st.charges("A B", all_epochs=True)) == 1  # kept for audit
    res = runner.invoke(app, ["budget", "show", "--store", str(path), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["log"][0]["reason"] == "2027 cohort"


def test_corrupt_or_locked_store_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(BudgetStoreError, match="not a readable silofl budget database"):
        BudgetStore(bad)
    res = runner.invoke(app, ["budget", "show", "--store", str(bad)])
    assert res.exit_code == 2 and "Do not delete it" in " ".join(res.output.split())
    path = tmp_path / "b.sqlite"
    BudgetStore(path).register({"a": PrivacyTarget(1.0, DELTA)})
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        st = BudgetStore(path, timeout=0.2)
    except BudgetStoreError as e:
        assert "locked" in str(e)
    else:
        with pytest.raises(BudgetStoreError, match="locked by another process"):
            st.reserve("r", [PlannedCharge("a", "m", "x", A.dpsgd_event(0.1, 2.0, 5))],
                       command="t", noise="secure")
    holder.execute("ROLLBACK")
    with pytest.raises(BudgetStoreError, match="is a directory"):
        BudgetStore(tmp_path)


def test_stated_lifetime_target_must_match_the_store(tmp_path):
    st = BudgetStore(tmp_path / "b.sqlite")
    st.register({"a": PrivacyTarget(1.0, DELTA)})
    st.register({"a": PrivacyTarget(9.0, DELTA)})  # not stated explicitly: the store wins
    assert st.target("a") == PrivacyTarget(1.0, DELTA)
    with pytest.raises(BudgetStoreError, match="set-target"):
        st.register({"a": PrivacyTarget(9.0, DELTA)}, explicit=True)
    st.set_target("a", PrivacyTarget(2.0, DELTA), "ethics board approval 2026-11")
    assert st.target("a") == PrivacyTarget(2.0, DELTA)
    assert st.log()[0]["action"] == "set-target"


def test_changed_data_is_recorded_and_the_budget_carries_over(tmp_path):
    cfg, alg = _cfg(), make_algorithm("local")
    store = BudgetStore(tmp_path / "b.sqlite")
    life = {n: PrivacyTarget(10.0, DELTA) for n in _fed().names}
    simulate(_fed(seed=0), make_model("linear", 3), alg, cfg, store=store, lifetime=life)
    first = {n: store.spent(n)["epsilon"] for n in life}
    simulate(_fed(seed=1), make_model("linear", 3), alg, cfg, store=store, lifetime=life)
    changed = [x for x in store.log() if x["action"] == "data-changed"]
    assert sorted(x["silo"] for x in changed) == sorted(life)
    for n in life:  # both runs compose: the budget was not reset by the new data
        assert store.spent(n)["epsilon"] > first[n]


def test_events_round_trip_through_the_store():
    ev = dpa.ComposedDpEvent([A.dpsgd_event(0.01, 1.3, 7), dpa.ZCDpEvent(0.02),
                              dpa.GaussianDpEvent(3.0)])
    back = E.from_json(E.to_json(ev))
    assert back == ev and E.from_json(E.to_json(ev)) is back


def test_ledger_file_names_never_collide():
    names = ["A B", "A_B", "A/B", "a b", "1", "1.0", "01", "x" * 300]
    ids = [silo_file_id(n) for n in names]
    assert len(set(ids)) == len(names)
    assert all("/" not in i and len(i) < 60 for i in ids)


def test_crash_output_holds_no_data_values():
    secret = "patient 4711 cholesterol 987.25"
    try:
        try:
            raise ValueError(secret)
        except ValueError as inner:
            raise RuntimeError(f"wrapped {secret}") from inner
    except RuntimeError as e:
        text = crash_frames(e)
    assert secret not in text and "4711" not in text
    assert "RuntimeError" in text and "ValueError" in text and "test_budget.py" in text


def test_scratch_store_is_flagged_in_every_output(tmp_path):
    raw = {"training": {"rounds": 2, "methods": ["local"]}, "budget": {"scratch": True},
           "output": {"dir": str(tmp_path)}}
    rep = run_experiment(config_from_dict(raw))
    assert rep.scratch and rep.store is None
    priv = json.loads((rep.run_dir / "privacy_report.json").read_text())
    summary = json.loads((rep.run_dir / "summary.json").read_text())
    for out in (priv["notes"], summary["notes"]):
        assert any("scratch budget store" in n for n in out)
    assert not (tmp_path / "budget.sqlite").exists()


def test_an_unexpected_error_in_training_prints_no_record(tmp_path, monkeypatch, capsys):
    """A crash inside training (here: an exception quoting a training row) must reach the
    terminal as its type only; the log holds frames without messages or variables."""
    import silofl.cli as cli
    import silofl.runtime.simulator as sim

    secret = []

    def boom(fed, *a, **kw):
        row = fed.silos[0].X_train[0]
        secret.append(f"{row[0]:.6f}"[:7])
        raise ValueError(f"bad row {row.tolist()} label {fed.silos[0].y_train[0]}")
    monkeypatch.setattr(sim, "_train", boom)
    monkeypatch.setenv("SILOFL_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(sys, "argv", ["silofl", "run", "-q", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit) as ex:
        cli.main()
    assert ex.value.code == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert "ValueError" in text and "message is not shown" in text
    assert secret and secret[0] not in text and "bad row" not in text
    logs = list((tmp_path / "logs").glob("crash-*.log"))
    assert len(logs) == 1 and oct(logs[0].stat().st_mode & 0o777) == "0o600"
    log = logs[0].read_text()
    # frames only: source lines may appear, the values they formatted never do
    assert "ValueError" in log and secret[0] not in log and "bad row [" not in log
    # the failed job left no run directory, and its charges stay in the store
    o = tmp_path / "o"
    assert [p.name for p in o.iterdir() if p.is_dir()] == []
    assert not (o / "budget.sqlite").exists()  # never a store in the output folder
    # the built-in heart data charges the (labelled) demo store in the silofl home
    with BudgetStore(tmp_path / "home" / "stores" / "demo-heart.sqlite", demo=True) as st:
        assert st.silos() and all(st.spent(n)["unfinished_runs"] == 0 for n in st.silos())


def test_schema_draft_is_refused_until_reviewed(tmp_path):
    import pandas as pd
    csv = tmp_path / "t.csv"
    pd.DataFrame({"site": ["a", "a", "b", "b"], "age": [30, 40, 50, 60],
                  "y": [0, 1, 0, 1]}).to_csv(csv, index=False)
    out = tmp_path / "schema.toml"
    res = runner.invoke(app, ["schema", "draft", str(csv), "--label-column", "y",
                              "--silo-column", "site", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "drafted = true" in out.read_text()
    from silofl.data.schema import load_schema
    from silofl.errors import ConfigError
    with pytest.raises(ConfigError, match="drafted"):
        load_schema(out)
    out.write_text(out.read_text().replace("drafted = true", ""))
    assert [c for c in load_schema(out).feature_names] == ["age"]
    res = runner.invoke(app, ["schema", "draft", str(csv), "--label-column", "y",
                              "--out", str(out)])
    assert res.exit_code == 2 and "exists" in res.output


def test_a_tiny_epsilon_is_met_under_the_reported_accountant_or_refused(tmp_path):
    from silofl.privacy.store_paths import default_store_path
    out = tmp_path / "out"
    cfg = {"training": {"rounds": 2, "methods": ["local"]},
           "privacy": {"epsilon": 1e-6, "delta": 1e-4}, "output": {"dir": str(out)}}
    p = tmp_path / "tiny.toml"
    p.write_text(tomli_w.dumps(cfg))
    res = runner.invoke(app, ["run", "--config", str(p), "-q"])
    if res.exit_code == 0:  # met: every figure the report checks is at most the target
        d = next(x for x in out.iterdir() if x.is_dir())
        priv = json.loads((d / "privacy_report.json").read_text())
        for c in priv["combined"]:
            assert c["epsilon"] <= 1e-6 and c["within_target"]
    else:  # refused before anything was written or reserved
        assert res.exit_code == 2 and "too strict" in " ".join(res.output.split())
        assert not out.exists() or not [x for x in out.iterdir() if x.is_dir()]
        for store in (default_store_path(), out / "budget.sqlite"):
            if store.exists():
                with BudgetStore(store) as st:
                    assert all(st.charges(n) == [] for n in st.silos())


def test_default_runs_draw_fresh_noise_and_seeded_runs_say_so(tmp_path):
    """Two default runs of one config give different models (OS-entropy noise); two
    seeded runs give the same model and every output says it is no guarantee."""
    base = {"training": {"rounds": 3, "methods": ["local"]}, "budget": {"scratch": True},
            "output": {"dir": ""}}
    a, b = (run_experiment(config_from_dict(base)) for _ in range(2))
    assert a.noise == b.noise == "secure" and a.summary()["notes"] == [
        "scratch budget store: an experiment, not a release"]
    assert not np.array_equal(a.results[0].params, b.results[0].params)
    seeded = dict(base, privacy={"noise": "seeded"}, output={"dir": str(tmp_path)})
    c, d = (run_experiment(config_from_dict(seeded)) for _ in range(2))
    assert np.array_equal(c.results[0].params, d.results[0].params)
    for rep in (c, d):
        for f in ("privacy_report.json", "summary.json"):
            notes = json.loads((rep.run_dir / f).read_text())["notes"]
            assert "reproducible noise — not a privacy guarantee" in notes
    res = runner.invoke(app, ["run", "-q", "--scratch", "--config", str(_toml(tmp_path, seeded))])
    assert res.exit_code == 0 and "not a privacy guarantee" in " ".join(res.output.split())


def _toml(d: Path, raw: dict) -> Path:
    p = d / "cfg.toml"
    p.write_text(tomli_w.dumps(raw))
    return p
