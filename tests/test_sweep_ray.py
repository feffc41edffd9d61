"""The sweep's Ray engine on a local cluster of two worker processes: the same results file
as the local engine (metrics within 1e-9: seeded noise, the same float64 arithmetic in
other processes), the same charges in the lifetime store, every run reserved by the driver
before a worker runs it, a killed sweep resumes with only the missing runs, and the errors
(Ray missing, a bad address) are specific and charge nothing."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import pytest
import tomli_w
from typer.testing import CliRunner

pytest.importorskip("ray", reason="ray is not installed (pip install 'silofl[ray]')")

from silofl.cli import app  # noqa: E402
from silofl.errors import BudgetExceeded, ConfigError, PrivacyError  # noqa: E402
from silofl.experiments import sweep as S  # noqa: E402
from silofl.experiments import sweep_results  # noqa: E402
from silofl.experiments.sweep import run_sweep  # noqa: E402
from silofl.experiments.sweep_config import load_sweep_config  # noqa: E402
from silofl.experiments.sweep_results import read_results  # noqa: E402
from silofl.privacy import events  # noqa: E402
from silofl.privacy.budget import BudgetStore  # noqa: E402
from silofl.runtime.detached import detach  # noqa: E402

pytestmark = pytest.mark.slow

TOL = 1e-9  # metrics across processes: same seeded arithmetic, never compared bit for bit
VOLATILE = {"seconds", "run_id"}  # wall time, and the store's id of each run

RAW = {
    "data": {"source": "heart", "test_fraction": 0.2},
    "model": {"name": "logistic", "metric": "accuracy"},
    "training": {"rounds": 3, "batch_size": 8, "clip": 1.0},
    "privacy": {"delta": 1e-4, "noise": "seeded"},
    "budget": {"store": "budget.sqlite", "epsilon": 20.0},
    "sweep": {"methods": ["local", "mrmtl"], "epsilon": [1.0], "nonprivate": True,
              "lam": [0.1], "lr": [0.1, 0.3], "seeds": [0], "workers": 2,
              "results": "results.jsonl"},
}
N_RUNS = 8  # 2 methods × (ε 1, non-private) × 2 lr


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster (two worker CPUs) for the module: `run_sweep` uses a session
    the caller opened as it is, so the start cost is paid once."""
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _config(tmp: Path, budget: dict | None = None, **sweep) -> Path:
    """The sweep file RAW with `sweep` keys replaced (and [budget], if given)."""
    raw = json.loads(json.dumps(RAW))
    raw["sweep"].update(sweep)
    if budget is not None:
        raw["budget"] = budget
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "sweep.toml").write_text(tomli_w.dumps(raw))
    return tmp / "sweep.toml"


def _strip(o):
    if isinstance(o, dict):
        return {k: _strip(v) for k, v in o.items() if k not in VOLATILE}
    if isinstance(o, list):
        return [_strip(v) for v in o]
    return o


def _head(head: dict, folder: Path) -> dict:
    """A header without its time, the sweep's folder named alike (the notes name the store)."""
    text = json.dumps({k: v for k, v in head.items() if k != "created"})
    return json.loads(text.replace(str(folder), "<folder>"))


def _close(a, b, where="") -> None:
    """Equal records, floats within TOL."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=TOL, abs=TOL), where
    else:
        assert a == b, where


def _charges(store: Path) -> dict:
    """Per silo: ε spent and the multiset of settled charges (label, event, count)."""
    with BudgetStore(store) as st:
        out = {}
        for name in st.silos():
            rows = st.charges(name)
            assert all(c["status"] == "charged" for c in rows), rows  # nothing left reserved
            out[name] = (st.spent(name)["epsilon"],
                         sorted((c["method"], c["label"], json.dumps(c["event"], sort_keys=True),
                                 c["count"]) for c in rows))
        return out


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """The reference: the same sweep with the local engine, in this process."""
    cfg = _config(tmp_path_factory.mktemp("local"), workers=1)
    out = run_sweep(load_sweep_config(cfg))
    assert out.executed == N_RUNS
    return cfg.parent


def test_ray_results_and_charges_equal_the_local_engines(cluster, local_sweep, tmp_path):
    cfg = _config(tmp_path, engine="ray")
    seen = []
    out = run_sweep(load_sweep_config(cfg), on_progress=lambda d, t, r: seen.append(d))
    assert (out.total, out.executed, out.skipped) == (N_RUNS, N_RUNS, 0)
    assert seen == list(range(N_RUNS + 1))  # progress as each run came back
    head_l, rec_l = read_results(local_sweep / "results.jsonl")
    head_r, rec_r = read_results(out.results)
    assert head_r["fingerprint"] == head_l["fingerprint"]  # the engine is not in the sweep's id
    _close(_head(head_r, tmp_path), _head(head_l, local_sweep))
    by_key = {r["key"]: r for r in rec_l}
    assert sorted(by_key) == sorted(r["key"] for r in rec_r)
    for r in rec_r:
        _close(_strip(r), _strip(by_key[r["key"]]), r["key"])
        if r["private"]:
            assert r["privacy"]["scratch_store"] is False and r["privacy"]["run_id"]
    charged_l, charged_r = _charges(local_sweep / "budget.sqlite"), _charges(tmp_path / "budget.sqlite")
    assert charged_r.keys() == charged_l.keys()
    for silo in charged_l:
        assert charged_r[silo][1] == charged_l[silo][1]  # the same charges, run for run
        assert charged_r[silo][0] == pytest.approx(charged_l[silo][0], rel=1e-12)
        assert charged_r[silo][0] > 0


class Killed(Exception):
    pass


def test_a_killed_ray_sweep_resumes_with_only_the_missing_runs(cluster, local_sweep, tmp_path):
    cfg = _config(tmp_path, engine="ray", workers=1)

    def kill_after_three(done, total, record):
        if done == 3:
            raise Killed  # the driver dies after its third record is on disk

    with pytest.raises(Killed):
        run_sweep(load_sweep_config(cfg), on_progress=kill_after_three)
    _, first = read_results(tmp_path / "results.jsonl")
    assert len(first) == 3
    with BudgetStore(tmp_path / "budget.sqlite") as st:  # nothing left merely reserved
        assert all(c["status"] == "charged" for s in st.silos() for c in st.charges(s))
    out = run_sweep(load_sweep_config(cfg))
    assert (out.executed, out.skipped) == (N_RUNS - 3, 3)
    _, records = read_results(out.results)
    assert len(records) == N_RUNS == len({r["key"] for r in records})
    _, ref = read_results(local_sweep / "results.jsonl")
    by_key = {r["key"]: r for r in ref}
    for r in records:
        _close(_strip(r), _strip(by_key[r["key"]]), r["key"])


def test_a_second_sweep_on_the_same_results_file_is_refused(cluster, tmp_path, monkeypatch):
    cfg = _config(tmp_path, engine="ray")
    monkeypatch.setattr(sweep_results, "LOCK_WAIT_S", 0.2)
    with sweep_results.exclusive_lock(tmp_path / "results.jsonl"):  # another sweep holds it
        with pytest.raises(ConfigError, match="is in use by another `silofl sweep`"):
            run_sweep(load_sweep_config(cfg))
    assert not (tmp_path / "results.jsonl").exists()
    assert not (tmp_path / "budget.sqlite").exists() or _charges(tmp_path / "budget.sqlite") \
        == {s: (0.0, []) for s in _charges(tmp_path / "budget.sqlite")}


def test_a_scratch_sweep_on_ray_charges_a_scratch_store_per_run(cluster, tmp_path):
    cfg = _config(tmp_path, {}, engine="ray", methods=["local"], nonprivate=False, lr=[0.1])
    out = run_sweep(load_sweep_config(cfg))
    head, records = read_results(out.results)
    assert out.executed == 1 and any("scratch budget store" in n for n in head["notes"])
    assert records[0]["privacy"]["scratch_store"] is True
    assert 0.9 < records[0]["privacy"]["max_epsilon_spent"] <= 1.0 + 1e-9
    assert not (tmp_path / "budget.sqlite").exists()


def test_the_lifetime_budget_stops_a_ray_sweep_before_a_worker_runs(cluster, tmp_path):
    cfg = _config(tmp_path, {"store": "budget.sqlite", "epsilon": 1.2},  # one ε = 1 run fits
                  engine="ray", methods=["local"], nonprivate=False, workers=1)
    with pytest.raises(BudgetExceeded, match="lifetime ε would reach"):
        run_sweep(load_sweep_config(cfg))
    _, records = read_results(tmp_path / "results.jsonl")
    assert len(records) == 1
    with BudgetStore(tmp_path / "budget.sqlite") as st:
        for name in st.silos():
            assert st.spent(name)["epsilon"] <= 1.2
            assert len({c["run"] for c in st.charges(name)}) == 1


def test_the_worker_job_cannot_settle_open_the_store_or_overspend(tmp_path, monkeypatch):
    sc = load_sweep_config(_config(tmp_path, engine="ray"))
    prep = S.prepare(sc)
    S.preflight(sc, prep)
    spec = next(s for s in S.expand(sc) if s.private)
    plans = S.calibrate_all(sc, prep, [spec])
    job = S.reserve_run(sc, spec, prep, plans, {})
    assert job.store.run_status(job.run_id) == "reserved"  # before any worker exists
    worker = pickle.loads(pickle.dumps(detach(job)))  # what a Ray task receives
    assert worker.store is None and worker.run_id == job.run_id
    with pytest.raises(PrivacyError, match="cannot settle"):
        worker.settle()
    monkeypatch.setattr(S, "_DETACHED", True)  # as in a Ray worker
    with pytest.raises(PrivacyError, match="never opens the budget store"):
        S.budget_store(sc)
    method, ps = next(iter(job.planned.items()))
    led = worker.ledgers(method)[0]
    led.charge(ps[0].declared, label="plan")  # the whole reservation of that silo
    with pytest.raises(BudgetExceeded, match="not covered by what this run reserved"):
        led.charge(ps[0].declared, label="plan")  # refused before any data is read
    assert worker.log == [(ps[0].name, method, "plan", events.to_json(ps[0].declared), 1)]
    job.store.settle(job.run_id, [], status="failed")  # tidy: nothing was read


def test_ray_not_installed_is_a_specific_error_that_charges_nothing(tmp_path, monkeypatch):
    cfg = _config(tmp_path, engine="ray")
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray → ImportError
    with pytest.raises(ConfigError, match=r"pip install 'silofl\[ray\]'"):
        run_sweep(load_sweep_config(cfg))
    r = CliRunner().invoke(app, ["sweep", str(cfg), "-q"])
    assert r.exit_code == 2 and "pip install" in r.output
    assert not (tmp_path / "results.jsonl").exists() and not (tmp_path / "budget.sqlite").exists()


def test_a_bad_cluster_address_is_a_specific_error(tmp_path):
    cfg = _config(tmp_path, engine="ray", address="127.0.0.1:9")  # discard port: refused
    with pytest.raises(ConfigError, match="no Ray cluster answers at sweep.address"):
        run_sweep(load_sweep_config(cfg))
    r = CliRunner().invoke(app, ["sweep", str(cfg), "-q", "--address", "not-an-address"])
    assert r.exit_code == 2 and "is not a Ray cluster address" in r.output
    r = CliRunner().invoke(app, ["sweep", str(cfg), "-q", "--engine", "local"])
    assert r.exit_code == 2 and "names a Ray cluster" in r.output
    assert not (tmp_path / "results.jsonl").exists()
