"""The lifetime budget cannot be escaped by ordinary actions (issue 19, part 2), tested as
an attacker would: run again from another folder or with another --out, resume a run that
is still alive, delete the ledger files before resuming, test a guessed record against the
store's fingerprint, stop a run with SIGTERM / Ctrl-C, lower a target below what is spent."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import dp_accounting as dpa
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
from silofl.privacy import accounting as A
from silofl.privacy import runlock
from silofl.privacy.budget import BudgetStore, BudgetStoreError, PlannedCharge
from silofl.privacy.ledger import silo_file_id
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.job import fingerprint

runner = CliRunner()
DELTA = 1e-4


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Every test's own silofl home (subprocesses inherit it): never the real ~."""
    monkeypatch.setenv("SILOFL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _nows(text: str) -> str:
    """`text` without any whitespace (the terminal wraps long paths anywhere)."""
    return "".join(text.split())


def _synthetic(d: Path, **budget) -> Path:
    """A private-looking source (not the built-in demo data): 3 rounds of Local."""
    p = d / "job.toml"
    p.write_text(tomli_w.dumps({"data": {"source": "synthetic", "seed": 3},
                                "model": {"name": "linear"},
                                "training": {"rounds": 3, "methods": ["local"]},
                                **({"budget": budget} if budget else {})}))
    return p


# --- a new folder is not a new budget ---------------------------------------------------------

def test_another_folder_or_out_hits_the_same_default_store(tmp_path, home, monkeypatch):
    cfg = _synthetic(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = runner.invoke(app, ["run", "-c", str(cfg), "-q"])
    assert first.exit_code == 0, first.output
    store = home / "stores" / "default.sqlite"
    assert store.is_file()
    assert "NEW budget store created" in _flat(first.output), first.output
    assert str(store) in _nows(first.output)
    d = next(p for p in (tmp_path / "a" / "runs").iterdir() if p.is_dir())
    for f in ("summary.json", "privacy_report.json"):  # the store's path in every output
        assert json.loads((d / f).read_text())["budget_store"] == str(store)
    assert not list(tmp_path.rglob("runs/budget.sqlite"))
    # the same job on the same data, from another folder and with another --out: the
    # default budget (one job's worth) is spent, so it is refused before any data access
    monkeypatch.chdir(tmp_path / "b")
    for extra in ([], ["--out", "runs2"]):
        res = runner.invoke(app, ["run", "-c", str(cfg), "-q", *extra])
        assert res.exit_code == 2, res.output
        assert "lifetime ε would reach" in _flat(res.output) and str(store) in _nows(res.output)
        assert "NEW budget store" not in res.output
    assert not (tmp_path / "b" / "runs2").exists() and not (tmp_path / "b" / "runs").exists()
    # no output directory at all is no escape either (it used to mean a scratch store)
    rep = None
    with pytest.raises(Exception, match="lifetime ε would reach"):
        rep = run_experiment(config_from_dict({**_load(cfg), "output": {"dir": ""}}))
    assert rep is None


def _load(p: Path) -> dict:
    import tomllib
    return tomllib.loads(p.read_text())


def test_a_deployment_names_its_own_store_and_bad_names_are_refused(tmp_path, home,
                                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["run", "-c", str(_synthetic(tmp_path, deployment="trial-2")),
                              "-q"])
    assert res.exit_code == 0, res.output
    assert (home / "stores" / "trial-2.sqlite").is_file()
    assert not (home / "stores" / "default.sqlite").exists()
    res = runner.invoke(app, ["budget", "show", "--deployment", "trial-2", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["store"].endswith("trial-2.sqlite")
    res = runner.invoke(app, ["run", "-c", str(_synthetic(tmp_path, deployment="../x")), "-q"])
    assert res.exit_code == 2 and "deployment" in res.output
    assert not list(home.rglob("x.sqlite"))


def test_a_new_store_for_data_charged_elsewhere_is_flagged(tmp_path, home, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["run", "-c", str(_synthetic(tmp_path)), "-q"]).exit_code == 0
    other = tmp_path / "other.sqlite"
    res = runner.invoke(app, ["run", "-c", str(_synthetic(tmp_path)), "-q", "--store",
                              str(other)])
    assert res.exit_code == 0, res.output  # an explicit store still works …
    text = _flat(res.output)
    assert "already charged in" in text
    assert str(home / "stores" / "default.sqlite") in _nows(res.output)
    with BudgetStore(other) as st:  # … and the flag is kept in the store's log
        assert {x["action"] for x in st.log()} >= {"charged-elsewhere"}
    # the machine key is private to the user
    assert oct((home / "machine.key").stat().st_mode & 0o777) == "0o600"


def test_the_builtin_demo_uses_a_labelled_demo_store_that_can_be_repeated(tmp_path, home,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "demo.toml"
    cfg.write_text(tomli_w.dumps({"training": {"rounds": 2, "methods": ["local"]}}))
    for _ in range(2):  # one job's worth each time: the demo store restarts (logged)
        res = runner.invoke(app, ["run", "-c", str(cfg), "-q"])
        assert res.exit_code == 0, res.output
        assert "demo budget store (public built-in heart data)" in _flat(res.output)
    demo = home / "stores" / "demo-heart.sqlite"
    with BudgetStore(demo, demo=True) as st:
        assert any(x["action"] == "reset" and "demo" in x["reason"] for x in st.log())
    with pytest.raises(BudgetStoreError, match="demo store"):
        BudgetStore(demo)  # a private source can never be charged to it
    assert not (home / "stores" / "default.sqlite").exists()


# --- keyed fingerprints -------------------------------------------------------------------------

def test_a_guessed_label_cannot_be_tested_against_the_store(tmp_path):
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 3)), rng.integers(0, 2, 40).astype(float)
    guesses = {}
    for v in (0.0, 1.0):  # the attacker knows every row but the last label
        g = y.copy()
        g[-1] = v
        guesses[v] = fingerprint(X, g)
    path = tmp_path / "b.sqlite"
    st = BudgetStore(path)
    st.register({"a": PrivacyTarget(1.0, 1e-5)})
    st.reserve("r1", [PlannedCharge("a", "m", "x", A.dpsgd_event(0.1, 4.0, 10))],
               command="t", noise="secure", fingerprints={"a": fingerprint(X, y)})
    stored = st.charges("a")[0]["fingerprint"]
    export = json.dumps(st.export())
    st.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("b.sqlite*"))
    for digest in guesses.values():  # neither guess (nor the true value) is in the store
        assert digest not in stored and digest.encode() not in raw and digest not in export
    # nor is a plain SHA-256 of the rows (the old, unkeyed fingerprint)
    plain = hashlib.sha256(np.ascontiguousarray(X).tobytes() +
                           np.ascontiguousarray(y).tobytes()).hexdigest()
    assert plain[:16] not in export and plain[:16].encode() not in raw
    # keyed by the store's own secret: another store keeps another value for the same rows
    other = BudgetStore(tmp_path / "c.sqlite")
    other.register({"a": PrivacyTarget(1.0, 1e-5)})
    other.reserve("r1", [PlannedCharge("a", "m", "x", A.dpsgd_event(0.1, 4.0, 10))],
                  command="t", noise="secure", fingerprints={"a": fingerprint(X, y)})
    assert other.charges("a")[0]["fingerprint"] != stored
    secret = sqlite3.connect(path).execute("SELECT value FROM meta WHERE key='secret'"
                                           ).fetchone()[0]
    assert secret not in export and "secret" not in export


def test_a_schema_1_store_is_migrated_and_its_fingerprints_rekeyed(tmp_path):
    path = tmp_path / "v1.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    INSERT INTO meta VALUES ('schema', '1');
    CREATE TABLE silos (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, epsilon REAL NOT NULL,
        delta REAL NOT NULL, epoch INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL);
    CREATE TABLE runs (id TEXT PRIMARY KEY, command TEXT NOT NULL, started REAL NOT NULL,
        finished REAL, status TEXT NOT NULL, noise TEXT NOT NULL, host TEXT NOT NULL,
        pid INTEGER NOT NULL);
    CREATE TABLE charges (id INTEGER PRIMARY KEY, silo_id INTEGER NOT NULL, epoch INTEGER NOT NULL,
        run_id TEXT NOT NULL, method TEXT NOT NULL, label TEXT NOT NULL, event TEXT NOT NULL,
        count INTEGER NOT NULL, status TEXT NOT NULL, time REAL NOT NULL, fingerprint TEXT);
    CREATE TABLE log (id INTEGER PRIMARY KEY, time REAL NOT NULL, silo_id INTEGER,
        action TEXT NOT NULL, reason TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '');
    INSERT INTO silos VALUES (1, 'a', 1.0, 1e-5, 0, 0);
    INSERT INTO runs VALUES ('r0', 't', 0, 1, 'finished', 'secure', 'h', 1);
    """)
    ev = A.dpsgd_event(0.1, 4.0, 10)
    from silofl.privacy import events
    db.execute("INSERT INTO charges VALUES (1, 1, 0, 'r0', 'm', 'x', ?, 1, 'charged', 0, "
               "'0123456789abcdef')", (events.to_json(ev),))
    db.commit()
    db.close()
    st = BudgetStore(path)
    c = st.charges("a")
    assert len(c) == 1 and c[0]["fingerprint"] != "0123456789abcdef"
    assert st.export()["schema_version"] == 3
    assert st.spent("a")["epsilon_rdp"] == pytest.approx(  # the charge is kept
        dpa.rdp.RdpAccountant().compose(ev).get_epsilon(1e-5), rel=1e-6)
    st.close()
    assert not any(b"0123456789abcdef" in p.read_bytes() for p in tmp_path.glob("v1.sqlite*"))


# --- settled never below what executed -----------------------------------------------------------

def _heart(d: Path, rounds: int, methods=("local",)) -> Path:
    p = d / "job.toml"
    p.write_text(tomli_w.dumps({
        "training": {"rounds": rounds, "methods": list(methods)},
        "privacy": {"epsilon": 1.0, "delta": DELTA},
        "budget": {"epsilon": 2.0, "store": str(d / "budget.sqlite")},
        "output": {"dir": str(d / "runs"), "name": "job"}}))
    return p


def _start(cfg: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "silofl.cli", "run", "--config", str(cfg),
                             "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def _dpa_event(d: dict):
    """dp_accounting's event from a ledger line's event dict (independent of silofl)."""
    t = d["type"]
    if t == "GaussianDpEvent":
        return dpa.GaussianDpEvent(d["noise_multiplier"])
    if t == "PoissonSampledDpEvent":
        return dpa.PoissonSampledDpEvent(d["sampling_probability"], _dpa_event(d["event"]))
    if t == "SelfComposedDpEvent":
        return dpa.SelfComposedDpEvent(_dpa_event(d["event"]), d["count"])
    if t == "ComposedDpEvent":
        return dpa.ComposedDpEvent([_dpa_event(e) for e in d["events"]])
    raise AssertionError(t)


def _rdp(evs: list) -> float:
    return dpa.rdp.RdpAccountant().compose(dpa.ComposedDpEvent(evs)).get_epsilon(DELTA)


def test_deleted_ledgers_do_not_make_the_store_forget_a_killed_run(tmp_path):
    cfg = _heart(tmp_path, 400, ("local", "mrmtl"))
    proc = _start(cfg)
    run_dir = tmp_path / "runs" / "job"
    try:
        wait_for_rounds(proc, run_dir / "ledgers" / "local" / f"{silo_file_id('Cleveland')}.jsonl",
                    150)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed = json.loads((run_dir / "checkpoint" / "job.json").read_text())["run_id"]
    executed = {}  # per silo: every charge the killed process wrote, read before deleting
    for f in (run_dir / "ledgers").rglob("*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                d = json.loads(line)
            except json.JSONDecodeError:  # a torn last line: never acted on
                continue
            executed.setdefault(d["silo"], []).append(_dpa_event(d["event"]))
        f.unlink()  # the attack: the run folder's plain files are gone
    # the attack has teeth: the waited-for ledger holds 150 charges, and every silo charged
    # (silos of one round are written one after another, so the others may be a round behind)
    assert len(executed) == 4 and all(len(v) >= 140 for v in executed.values())
    resume_run(run_dir)
    with BudgetStore(tmp_path / "budget.sqlite") as st:
        for silo, evs in executed.items():
            mine = [c for c in st.charges(silo) if c["run"] == killed]
            assert mine and {c["status"] for c in mine} == {"charged"}
            assert {c["run_status"] for c in mine} == {"killed"}
            stored = [_dpa_event(json.loads(c["event"])) for c in mine
                      for _ in range(c["count"])]
            # never below what executed (tolerance: float formatting of the events only)
            assert _rdp(stored) >= _rdp(evs) * (1 - 1e-9), silo
            assert st.spent(silo)["unfinished_runs"] == 0


def test_resume_refuses_while_the_run_is_alive_and_sigterm_settles(tmp_path):
    cfg = _heart(tmp_path, 50_000)
    proc = _start(cfg)
    run_dir = tmp_path / "runs" / "job"
    try:
        wait_for_rounds(proc, run_dir / "ledgers" / "local" / f"{silo_file_id('Cleveland')}.jsonl",
                    5)
        res = runner.invoke(app, ["run", "--resume", str(run_dir), "-q"])
        assert res.exit_code == 2 and "still running" in _flat(res.output), res.output
        with pytest.raises(ConfigError, match="still running"):
            resume_run(run_dir)
        assert proc.poll() is None  # the live run goes on, its reservation intact
        with BudgetStore(tmp_path / "budget.sqlite") as st:
            assert all(st.spent(n)["unfinished_runs"] == 1 for n in st.silos())
        proc.send_signal(signal.SIGTERM)
        out, errs = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, errs[-3000:]
    text = _flat(errs)
    assert "interrupted by SIGTERM" in text and "settled to what it executed" in text
    assert f"silofl run --resume {run_dir}".replace(" ", "") in _nows(errs)
    lines = {f.stem: len(f.read_text().splitlines())
             for f in (run_dir / "ledgers" / "local").glob("*.jsonl")}
    with BudgetStore(tmp_path / "budget.sqlite") as st:
        for n in st.silos():
            c = st.charges(n)
            assert {x["run_status"] for x in c} == {"interrupted"}
            assert st.spent(n)["unfinished_runs"] == 0
            # settled to exactly the rounds it executed (its ledger), not the reservation
            assert sum(x["count"] for x in c if x["label"] == "dpsgd") == \
                lines[silo_file_id(n)]


def test_ctrl_c_settles_prints_the_charge_and_exits_130(tmp_path):
    cfg = _heart(tmp_path, 50_000)
    proc = _start(cfg)
    run_dir = tmp_path / "runs" / "job"
    try:
        wait_for_rounds(proc, run_dir / "ledgers" / "local" / f"{silo_file_id('Cleveland')}.jsonl",
                    3)
        proc.send_signal(signal.SIGINT)
        _, errs = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, errs[-3000:]
    text = _flat(errs)
    assert "interrupted by Ctrl-C" in text and "ε spent" in text and "--resume" in text
    with BudgetStore(tmp_path / "budget.sqlite") as st:
        assert all(st.spent(n)["unfinished_runs"] == 0 for n in st.silos())


def test_a_resume_settles_a_run_only_once(tmp_path):
    st = BudgetStore(tmp_path / "b.sqlite")
    st.register({"a": PrivacyTarget(10.0, 1e-5)})
    ev = A.dpsgd_event(0.1, 4.0, 10)
    st.reserve("r1", [PlannedCharge("a", "m", "x", ev, 5)], command="t", noise="secure")
    from silofl.privacy import events
    st.record_progress("r1", [("a", "m", "x", events.to_json(ev), 3)])
    st.settle("r1", [], status="killed")  # ledgers gone: the store's progress is the floor
    assert sum(c["count"] for c in st.charges("a")) == 3
    with pytest.raises(BudgetStoreError, match="already settled"):
        st.settle("r1", [], status="killed")
    with pytest.raises(BudgetStoreError, match="no longer reserved"):
        st.record_progress("r1", [("a", "m", "x", events.to_json(ev), 1)])
    st.reserve("r2", [PlannedCharge("a", "m", "x", ev)], command="t", noise="secure",
               parent="r1")
    with pytest.raises(BudgetStoreError, match="already continued by run r2"):
        st.reserve("r3", [PlannedCharge("a", "m", "x", ev)], command="t", noise="secure",
                   parent="r1")


def test_a_reused_pid_is_not_a_live_owner():
    me = os.getpid()
    assert runlock.owner_alive(me, runlock.host(), runlock.process_start(me)) is True
    assert runlock.owner_alive(me, runlock.host(), "another-boot:1") is False
    assert runlock.owner_alive(me, "some-other-host", "") is None


def test_set_target_below_what_was_spent_is_refused_with_the_figures(tmp_path):
    path = tmp_path / "b.sqlite"
    st = BudgetStore(path)
    st.register({"a": PrivacyTarget(5.0, 1e-5)})
    st.reserve("r", [PlannedCharge("a", "m", "x", A.dpsgd_event(0.1, 2.0, 50))],
               command="t", noise="secure")
    spent = st.spent("a")["epsilon"]
    st.close()
    low = round(spent / 2, 3)
    res = runner.invoke(app, ["budget", "set-target", "--silo", "a", "--epsilon", str(low),
                              "--delta", "1e-5", "--reason", "tighter", "--yes",
                              "--store", str(path)])
    assert res.exit_code == 2
    text = _flat(res.output)
    assert f"{spent:.4g}" in text and f"{low:g}" in text
    with BudgetStore(path) as st:
        assert st.target("a") == PrivacyTarget(5.0, 1e-5)  # nothing changed
    res = runner.invoke(app, ["budget", "set-target", "--silo", "a", "--epsilon",
                              str(round(spent * 2, 3)), "--delta", "1e-5", "--reason", "ok",
                              "--yes", "--store", str(path)])
    assert res.exit_code == 0, res.output


def _kill_at(proc, ledger: Path, n: int) -> None:
    try:
        wait_for_rounds(proc, ledger, n)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_resumed_run_killed_again_resumes_from_the_chain(tmp_path):
    """Kill, resume, kill the resumed process, resume: each killed process is settled
    once, to what it executed, and the store ends with no unfinished run."""
    cfg = _heart(tmp_path, 400)
    run_dir = tmp_path / "runs" / "job"
    ledger = run_dir / "ledgers" / "local" / f"{silo_file_id('Cleveland')}.jsonl"
    _kill_at(_start(cfg), ledger, 100)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    second = subprocess.Popen([sys.executable, "-m", "silofl.cli", "run", "--resume",
                               str(run_dir), "-q"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    _kill_at(second, ledger, 250)
    rep = resume_run(run_dir)
    with BudgetStore(tmp_path / "budget.sqlite") as st:
        first = json.loads((run_dir / "ledgers" / "local" / f"{silo_file_id('Cleveland')}"
                            ".jsonl").read_text().splitlines()[0])["run"]
        chain, r = [first], first
        while (own := st.owner(r))["child"] is not None:
            r = own["child"]
            chain.append(r)
        assert len(chain) == 3 and chain[-1] == rep.run_id
        assert [st.owner(x)["status"] for x in chain] == ["killed", "killed", "finished"]
        for n in st.silos():
            assert st.spent(n)["unfinished_runs"] == 0
            steps = {x: sum(c["count"] for c in st.charges(n) if c["run"] == x and
                            c["label"] == "dpsgd") for x in chain}
            # every process charged at least the rounds it ran: the first ≥ 100; the
            # second's file reached 250 lines, of which at most the first's were kept
            assert steps[chain[0]] >= 100
            assert steps[chain[1]] >= 250 - steps[chain[0]]
            assert sum(steps.values()) >= 400


def test_deleting_the_default_store_is_flagged_on_the_next_run(tmp_path, home, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _synthetic(tmp_path)
    assert runner.invoke(app, ["run", "-c", str(cfg), "-q"]).exit_code == 0
    store = home / "stores" / "default.sqlite"
    for p in store.parent.glob("default.sqlite*"):
        p.unlink()  # the attack: a fresh file at the same path
    res = runner.invoke(app, ["run", "-c", str(cfg), "-q"])
    assert res.exit_code == 0, res.output  # flagged loudly, and kept in the new store's log
    assert "NEW budget store created" in _flat(res.output)
    assert "deleted or replaced" in _flat(res.output)
    with BudgetStore(store) as st:
        assert any(x["action"] == "charged-elsewhere" for x in st.log())


def test_a_run_settled_to_zero_does_not_make_the_next_run_look_like_a_new_store(
        tmp_path, home):
    """A failed run settled to nothing left its silo without charges; the next run on the
    same store was flagged as charged in 'this store itself (deleted or replaced)'."""
    ev = dpa.GaussianDpEvent(8.0)
    path = tmp_path / "budget.sqlite"
    with BudgetStore(path) as st:  # the failed run: reserved, then settled to zero
        st.register({"A": PrivacyTarget(5.0, 1e-4)})
        st.reserve("r0", [PlannedCharge("A", "local", "dpsgd", ev)], command="run",
                   noise="secure", fingerprints={"A": "digest-of-A's-rows"})
        st.settle("r0", [], status="failed")
        assert st.charges("A") == []
    with BudgetStore(path) as st:  # the next process, same store, same data
        st.register({"A": PrivacyTarget(5.0, 1e-4)})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            st.reserve("r1", [PlannedCharge("A", "local", "dpsgd", ev)], command="run",
                       noise="secure", fingerprints={"A": "digest-of-A's-rows"})
        assert [x for x in st.log() if x["action"] == "charged-elsewhere"] == []
    # a silo registered before but never charged is still flagged for another store's data
    other = tmp_path / "other.sqlite"
    with BudgetStore(other) as st:
        st.register({"B": PrivacyTarget(5.0, 1e-4)})
    with BudgetStore(other) as st, pytest.warns(UserWarning, match="already charged in"):
        st.register({"B": PrivacyTarget(5.0, 1e-4)})
        st.reserve("r2", [PlannedCharge("B", "local", "dpsgd", ev)], command="run",
                   noise="secure", fingerprints={"B": "digest-of-A's-rows"})


def test_a_failed_cli_run_settled_to_zero_is_not_flagged_on_the_next_run(
        tmp_path, home, monkeypatch):
    """End to end: training fails after the reservation (settled to 0), then a clean run."""
    import silofl.runtime.simulator as sim
    monkeypatch.chdir(tmp_path)
    cfg = _synthetic(tmp_path)
    real = sim._train

    def boom(*a, **k):
        raise RuntimeError("training broke")
    monkeypatch.setattr(sim, "_train", boom)
    res = runner.invoke(app, ["run", "-c", str(cfg), "-q"])
    assert res.exit_code != 0
    with BudgetStore(home / "stores" / "default.sqlite") as st:
        assert all(st.charges(n) == [] for n in st.silos()) and st.silos()
    monkeypatch.setattr(sim, "_train", real)
    res = runner.invoke(app, ["run", "-c", str(cfg), "-q"])
    assert res.exit_code == 0, res.output
    assert "deleted or replaced" not in _flat(res.output)
    assert "already charged" not in _flat(res.output)
