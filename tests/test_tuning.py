"""Private hyperparameter tuning (silofl.tuning; thesis §1.7, appendix E): the trial-count
distributions, the RepeatAndSelect charge, the per-silo random-h trial loop that releases
only the best trial, the tuned `silofl run` / `silofl sweep`, bad inputs that spend nothing,
and full-batch steps (q = 1) for silos smaller than the batch."""

from __future__ import annotations

import json
import logging
import tomllib
import warnings
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest
import tomli_w
from dp_accounting import rdp
from dp_accounting.dp_event import RepeatAndSelectDpEvent
from scipy import stats
from typer.testing import CliRunner

from silofl.cli import app
from silofl.data.federation import Federation, Silo
from silofl.errors import BudgetExceeded, ConfigError
from silofl.experiments.sweep import carve_validation, run_sweep
from silofl.experiments.sweep_config import sweep_config_from_dict
from silofl.experiments.sweep_results import read_results
from silofl.models.glm import make_model
from silofl.privacy import accounting, events
from silofl.privacy import selection as TA
from silofl.privacy.budget import BudgetStore
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig, plan_silos
from silofl.runtime.simulator import simulate
from silofl.tuning import distributions as D
from silofl.tuning.private import TunedPersonalization
from silofl.tuning.report import comparison

logging.getLogger("absl").setLevel(logging.ERROR)
LAMS = [0.01, 0.1, 1.0, 10.0]


# --- the number of trials ------------------------------------------------------------------

def _chi2(dist: D.TrialDistribution, draws: np.ndarray, pmf: np.ndarray) -> float:
    """p-value of draws against pmf (pmf[h] = P[h]), bins merged to ≥ 5 expected."""
    n = len(draws)
    counts = np.bincount(draws, minlength=len(pmf))[:len(pmf)]
    obs, exp, o, e = [], [], 0.0, 0.0
    for h in range(len(pmf)):
        o, e = o + counts[h], e + n * pmf[h]
        if e >= 5:
            obs.append(o), exp.append(e)
            o, e = 0.0, 0.0
    obs[-1] += o + (n - counts.sum())
    exp[-1] += e + n * max(0.0, 1 - pmf.sum())
    exp = np.array(exp) * sum(obs) / sum(exp)
    return stats.chisquare(obs, exp).pvalue


@pytest.mark.statistical
@pytest.mark.parametrize("dist", [D.tnb(1.0, mean=5), D.tnb(0.0, mean=5),
                                  D.tnb(0.5, gamma=0.2), D.tnb(-0.5, mean=5), D.poisson(5.0)],
                         ids=["geometric", "logarithmic", "tnb0.5", "tnb-0.5", "poisson"])
def test_draws_match_their_distribution(dist):
    draws = dist.draw(Randomness.seeded(7), 20_000)
    pmf = dist.table()
    assert abs(pmf.sum() - 1) < 1e-9
    assert abs((np.arange(len(pmf)) * pmf).sum() - dist.mean) < 1e-6 * dist.mean
    assert _chi2(dist, draws, pmf) > 1e-3
    # the test has power: the same draws against another distribution of equal mean fail
    other = D.poisson(dist.mean) if dist.kind == "tnb" else D.tnb(1.0, mean=dist.mean)
    assert _chi2(dist, draws, other.table(len(pmf) - 1)) < 1e-6


def test_pmfs_against_scipy():
    h = np.arange(1, 60)
    g = D.tnb(1.0, gamma=0.15)  # geometric on {1, 2, …}
    assert np.allclose(g.pmf(h), stats.geom.pmf(h, 0.15))
    lg = D.tnb(0.0, gamma=0.1)  # logarithmic with p = 1 − γ
    assert np.allclose(lg.pmf(h), stats.logser.pmf(h, 0.9))
    nb = D.tnb(2.5, gamma=0.3)  # negative binomial (failures) truncated at 0
    ref = stats.nbinom.pmf(h, 2.5, 0.3) / (1 - stats.nbinom.pmf(0, 2.5, 0.3))
    assert np.allclose(nb.pmf(h), ref)
    assert D.tnb(2.5, mean=nb.mean).gamma == pytest.approx(0.3, rel=1e-9)
    assert np.allclose(D.poisson(3.0).pmf(np.arange(30)), stats.poisson.pmf(np.arange(30), 3))


@pytest.mark.parametrize("make, msg", [
    (lambda: D.tnb(-1.0, gamma=0.5), "eta"), (lambda: D.tnb(-3, gamma=0.5), "eta"),
    (lambda: D.tnb(1.0, gamma=0.0), "gamma"), (lambda: D.tnb(1.0, gamma=1.0), "gamma"),
    (lambda: D.tnb(1.0, gamma=1.5), "gamma"), (lambda: D.poisson(0.0), "mu"),
    (lambda: D.poisson(-2.0), "mu"), (lambda: D.tnb(1.0, mean=0.5), "mean_trials"),
    (lambda: D.tnb(1.0), "exactly one"),
    (lambda: TA.check_accountable(D.poisson(0.5)), "mean number of trials"),
])
def test_bad_distribution_parameters(make, msg):
    with pytest.raises(ConfigError, match=msg):
        make()


# --- the charge -----------------------------------------------------------------------------

def _fed(K: int = 6, n: int = 60, d: int = 4, seed: int = 0) -> Federation:
    """Realistic heterogeneous binary silos (a logistic model per silo around a shared one)."""
    rng = np.random.default_rng(seed)
    w0 = rng.normal(size=d)
    silos = []
    for k in range(K):
        w = w0 + 0.7 * rng.normal(size=d)
        X = rng.normal(size=(n + 30, d))
        y = (rng.uniform(size=n + 30) < 1 / (1 + np.exp(-X @ w))).astype(int)
        silos.append(Silo(f"s{k}", X[:n], y[:n], X[n:], y[n:]))
    return Federation(silos, [f"x{j}" for j in range(d)], "binary", 2)


def _setup(eps: float = 2.0, K: int = 6, rounds: int = 3, dist=None, private=True):
    fed, val = carve_validation(_fed(K), 0.25, 0)
    fed = fed.with_targets(PrivacyTarget(eps, 1e-4))
    alg = TunedPersonalization(LAMS, dist or D.tnb(1.0, mean=4), val, lrs=[0.05, 0.2],
                               pivot_lam=0.1)
    cfg = TrainingConfig(rounds=rounds, batch_size=8, lr=0.1, accountant="rdp",
                         noise="seeded", seed=3, private=private)
    return fed, alg, cfg, make_model("logistic", fed.dim)


def test_charged_event_is_repeat_and_select_and_meets_target():
    fed, alg, cfg, model = _setup()
    res = simulate(fed, model, alg, cfg)
    for led, p in zip(res.ledgers, res.plans):
        tuning = [e for e in led.entries if e.label == "tuning"]
        assert len(tuning) == 1 and tuning[0].round == 1  # before the first trial
        assert led.entries[0].label == "tuning"  # charged before anything else ran
        # an independent computation with dp_accounting alone
        sigma = p.noise_multiplier
        step = dpa.PoissonSampledDpEvent(p.q, dpa.GaussianDpEvent(sigma))
        T = p.steps_per_pass * cfg.rounds
        s_sigma = 2.0 * sigma / (p.q * np.sqrt(T))
        trial = dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(step, T),
                                     dpa.GaussianDpEvent(s_sigma)])
        ras = RepeatAndSelectDpEvent(trial, alg.dist.mean, 1.0)
        acc = rdp.RdpAccountant(list(accounting.RDP_ORDERS))
        acc.compose(ras)
        charged = tuning[0].event
        assert charged.mean == ras.mean and charged.shape == ras.shape
        assert accounting.epsilon(charged, 1e-4, "rdp") == pytest.approx(
            acc.get_epsilon(1e-4), rel=1e-6)
        # the whole run (pivot + RepeatAndSelect) meets the silo's target, as reported
        rep = led.report()
        assert rep["epsilon"] <= led.target.epsilon and rep["within_target"]
        assert rep["epsilon"] > 0.95 * led.target.epsilon  # and σ is not wastefully large
        total = rdp.RdpAccountant(list(accounting.RDP_ORDERS))
        total.compose(dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(step, T), ras]))
        assert total.get_epsilon(1e-4) <= led.target.epsilon * (1 + 1e-9)
    # the store round-trips the event (it is a base event of ledgers and of the store)
    ev = res.ledgers[0].entries[0].event
    assert events.from_json(events.to_json(ev)) == ev


def test_naive_grid_costs_more_than_the_random_h_release_for_large_grids():
    rev = accounting.dpsgd_event(0.2, 3.0, 5)
    tuned = TA.epsilon_of(TA.tuned_event(rev, 20, D.tnb(1.0, mean=10)), 1e-5)
    naive = TA.epsilon_of(TA.naive_event(rev, 20, 30), 1e-5)
    one = TA.epsilon_of(TA.naive_event(rev, 20, 1), 1e-5)
    assert one < tuned < naive


# --- the trial loop ---------------------------------------------------------------------------

def _steps(fed, alg, cfg, model):
    """Run the algorithm by hand (as the simulator does) and return the final silo state."""
    from silofl.runtime.job import open_job
    from silofl.training.dpsgd import GradientRule
    from silofl.training.silo_data import SiloArrays
    from silofl.training.trainer import LocalTrainer
    plans = plan_silos(fed, alg, cfg)
    ledgers = None
    if cfg.private:
        job = open_job(BudgetStore(None), {"t": plans}, lifetime={p.name: p.target for p in plans},
                       command="test", noise="seeded", accountant="rdp")
        ledgers = job.ledgers("t")
    trainer = LocalTrainer(model, SiloArrays.stack([s.X_train for s in fed.silos],
                                                   [s.y_train for s in fed.silos]),
                           GradientRule(cfg.clip, np.array([p.noise_multiplier for p in plans])
                                        if cfg.private else None),
                           cfg.batch_size, np.array([p.steps_per_pass for p in plans]), cfg.lr,
                           0.0, Randomness.seeded(5), ledgers)
    silos, server = alg.init(model.init_params(), fed.num_silos, rounds=cfg.rounds)
    w = np.ones(fed.num_silos)
    for t in range(1, cfg.rounds + 1):
        old = silos.pivot.copy()
        silos, update = alg.silo_step(silos, alg.broadcast(server), trainer, t)
        assert np.array_equal(update, silos.pivot - old)  # only the pivot's update is sent
        server = alg.server_step(server, update, w)
    return silos, trainer


@pytest.mark.statistical
def test_h_drawn_per_silo_independently():
    # (non-private: the draws do not depend on the noise, and 300 calibrations are slow)
    fed, alg, cfg, model = _setup(K=300, rounds=1, dist=D.tnb(1.0, mean=3), private=False)
    silos, _ = _steps(fed, alg, cfg, model)
    h = silos.h
    assert len(h) == 300 and h.min() >= 1
    assert np.array_equal(np.bincount(silos.owner, minlength=300), h)
    assert _chi2(alg.dist, h, alg.dist.table()) > 1e-3  # each silo's h ~ TNB
    # independent across silos: neighbouring silos' counts are uncorrelated
    assert abs(stats.pearsonr(h[:-1], h[1:])[0]) < 0.2
    assert len(np.unique(h)) > 3  # silos do not share one draw
    # settings are uniform draws from the grid, per trial
    assert set(np.unique(silos.lam)) == set(LAMS) and set(np.unique(silos.lr)) == {0.05, 0.2}


def test_only_the_best_trial_leaves_each_silo():
    fed, alg, cfg, model = _setup(private=False, rounds=2)
    silos, trainer = _steps(fed, alg, cfg, model)
    from silofl.training import selection
    for k in range(fed.num_silos):
        mine = np.nonzero(silos.owner == k)[0]
        t = silos.chosen[k]
        assert t in mine  # a trial of this silo
        assert np.array_equal(silos.params[k], silos.trials[t])  # released: that one only
        X, y = alg.validation[k]
        s = selection.scores(model, silos.trials[mine], X, y)
        assert s[list(mine).index(t)] == s.min()  # non-private: the exact best
    assert [r["lam"] for r in alg.last_release] == [float(silos.lam[t]) for t in silos.chosen]
    assert all("h" not in r for r in alg.last_release)  # h_k never leaves the silo


def test_trials_cannot_run_past_what_was_charged():
    fed, alg, cfg, model = _setup(rounds=2)
    silos, trainer = _steps(fed, alg, cfg, model)
    sub, rows = alg._sub_trainers(silos, trainer)[0]
    with pytest.raises(BudgetExceeded):  # a third round of trials was never paid for
        sub.run(silos.trials[rows], round=3)


# --- silofl run / silofl sweep ----------------------------------------------------------------

def _run_toml(tmp: Path, tuning: dict, **training) -> Path:
    raw = {"data": {"source": "heart"}, "model": {"name": "logistic"},
           "training": {"methods": ["local", "mrmtl"], "rounds": 3, "batch_size": 8,
                        **training},
           "privacy": {"epsilon": 2.0, "delta": 1e-4, "noise": "seeded", "accountant": "rdp"},
           "budget": {"store": str(tmp / "budget.sqlite")},
           "output": {"dir": str(tmp / "runs")},
           "tuning": {"mode": "private", "lam": [0.1, 1.0], "mean_trials": 3, **tuning}}
    p = tmp / "run.toml"
    p.write_text(tomli_w.dumps(raw))
    return p


def test_run_with_tuning_section(tmp_path):
    res = CliRunner().invoke(app, ["run", "-c", str(_run_toml(tmp_path, {}))])
    assert res.exit_code == 0, res.output
    run_dir = next((tmp_path / "runs").iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    names = [m["name"] for m in summary["methods"]]
    assert names == ["local", "mrmtl_tuned"]
    rep = json.loads((run_dir / "privacy_report.json").read_text())
    text = json.dumps(rep)
    assert "RepeatAndSelectDpEvent" in text and "sampling_rate" in text
    store = BudgetStore(tmp_path / "budget.sqlite")
    for name in ("Cleveland", "Switzerland"):
        assert store.spent(name)["epsilon"] <= 2.0 + 1e-9


@pytest.mark.parametrize("tuning, msg", [
    ({"eta": -1.0}, "eta"), ({"gamma": 1.5, "mean_trials": None}, "gamma"),
    ({"lam": [-1.0]}, "tuning.lam"),
    ({"distribution": "poisson", "mu": 0.0, "mean_trials": None}, "mu"),
    ({"pivot_lam": -0.1}, "pivot_lam"), ({"method": "fedavg"}, "tuning.method"),
    ({"select": "best"}, "tuning.select"), ({"mode": "grid"}, "tuning.mode"),
])
def test_bad_tuning_input_spends_nothing(tmp_path, tuning, msg):
    p = _run_toml(tmp_path, {})
    d = tomllib.loads(p.read_text())
    for k, v in tuning.items():  # None: leave the key out
        d["tuning"].pop(k, None) if v is None else d["tuning"].__setitem__(k, v)
    p.write_text(tomli_w.dumps(d))
    res = CliRunner().invoke(app, ["run", "-c", str(p)])
    assert res.exit_code == 2, res.output
    assert msg in " ".join(res.output.split())
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    if (tmp_path / "budget.sqlite").exists():
        store = BudgetStore(tmp_path / "budget.sqlite")
        assert all(store.spent(n)["epsilon"] == 0 for n in ("Cleveland", "Hungary"))


BASE = {"data": {"source": "heart", "test_fraction": 0.2},
        "model": {"name": "logistic", "metric": "accuracy"},
        "training": {"rounds": 3, "batch_size": 8},
        "privacy": {"delta": 1e-4, "noise": "seeded", "accountant": "rdp"},
        "sweep": {"methods": ["local", "fedavg", "mrmtl"], "epsilon": [2.0], "lam": [0.1, 1.0],
                  "lr": [0.1], "seeds": [0], "workers": 1, "tuning": "private"},
        "tuning": {"mean_trials": 3, "select": "random", "eta": 1.0, "score_ratio": 2.0}}


def test_sweep_private_tuning_compares_honestly(tmp_path):
    raw = json.loads(json.dumps(BASE))
    raw["sweep"]["results"] = str(tmp_path / "r.jsonl")
    out = run_sweep(sweep_config_from_dict(raw, tmp_path))
    head, records = read_results(out.results)
    tuned = [r for r in records if r["method"] == "mrmtl_tuned"]
    assert len(tuned) == 1
    t = tuned[0]
    assert t["privacy"]["max_epsilon_spent"] <= 2.0 and not t["privacy"]["over_target"]
    assert t["tuning"]["naive_grid_trials"] == 3 and t["tuning"]["uncounted_grid_size"] == 2
    # the uncounted choice over 2 runs at ε = 2 each costs more than 2 by composition
    assert t["tuning"]["uncounted_grid_epsilon"] > 2.0
    row, = comparison(head, records)
    for arm in ("local", "fedavg", "fixed", "tuned", "uncounted"):
        assert row[arm] is not None and 0 < row[arm][0] <= 1
    assert row["honest_epsilon"] <= 2.0


@pytest.mark.parametrize("sweep, tuning, msg", [
    ({"tuning": "none"}, {}, "one fixed"),  # two λ values cannot be "no tuning"
    ({"tuning": "later"}, {}, "sweep.tuning"),
    ({}, {"pivot_lam": 0.5}, "not in sweep.lam"),
    ({"methods": ["local"]}, {}, "not in sweep.methods"),
    ({}, {"mode": "private"}, "sweep.tuning"),
])
def test_sweep_tuning_bad_input(tmp_path, sweep, tuning, msg):
    raw = json.loads(json.dumps(BASE))
    raw["sweep"].update(sweep)
    raw["tuning"].update(tuning)
    with pytest.raises(ConfigError, match=msg):
        sweep_config_from_dict(raw, tmp_path)


# --- small silos: full-batch steps ------------------------------------------------------------

def test_batch_above_silo_size_takes_full_batch_steps():
    fed = _fed(K=3, n=40).with_targets(PrivacyTarget(2.0, 1e-4))
    small = Silo("tiny", fed.silos[0].X_train[:12], fed.silos[0].y_train[:12],
                 fed.silos[0].X_test, fed.silos[0].y_test, PrivacyTarget(2.0, 1e-4))
    fed = Federation([*fed.silos, small], fed.feature_names, "binary", 2)
    cfg = TrainingConfig(rounds=2, batch_size=16, lr=0.1, accountant="rdp", noise="seeded")
    from silofl.algorithms import make_algorithm
    with pytest.warns(UserWarning, match=r"tiny \(n = 12\).*q = 1"):
        plans = plan_silos(fed, make_algorithm("local"), cfg)
    assert [p.q for p in plans] == [16 / 40] * 3 + [1.0]
    assert plans[-1].steps_per_pass == 1  # one full-batch step per epoch
    # q = 1 is plain Gaussian composition: the accountant agrees with the closed form
    p = plans[-1]
    eps = accounting.epsilon(accounting.dpsgd_event(1.0, p.noise_multiplier, 2), 1e-4, "rdp")
    assert eps <= 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(fed, make_model("logistic", fed.dim), make_algorithm("local"), cfg,
                       plans=plans)
    assert res.privacy()[-1]["sampling_rate"] == 1.0
    assert all(r["epsilon"] <= 2.0 for r in res.privacy())


def test_exponential_mechanism_route_charges_grid_and_selection():
    fed, val = carve_validation(_fed(4), 0.25, 0)
    fed = fed.with_targets(PrivacyTarget(3.0, 1e-4))
    alg = TunedPersonalization(LAMS, D.tnb(1.0, mean=4), val, select="em", em_fraction=0.1)
    cfg = TrainingConfig(rounds=2, batch_size=8, lr=0.1, accountant="rdp", noise="seeded")
    res = simulate(fed, make_model("logistic", fed.dim), alg, cfg)
    for led, p in zip(res.ledgers, res.plans):
        first = led.entries[0]
        assert first.label == "tuning" and first.round == 1
        counts = events.flatten(first.event)
        step = dpa.PoissonSampledDpEvent(p.q, dpa.GaussianDpEvent(p.noise_multiplier))
        assert counts[step] == len(LAMS) * p.steps_per_pass * cfg.rounds  # every λ, once
        assert counts[dpa.ZCDpEvent((0.1 * 3.0) ** 2 / 8)] == 1  # ε_sel = 0.1 · 3, zCDP
        assert led.report()["epsilon"] <= 3.0
    assert len(alg.last_release) == 4 and all(r["lam"] in LAMS for r in alg.last_release)


@pytest.mark.slow
def test_a_privately_tuned_run_cannot_be_resumed(tmp_path):
    """A tuned run killed mid-way leaves its checkpoint; resuming it would re-read the
    trials' later rounds beyond the one RepeatAndSelect charge, so it is refused, and the
    store keeps exactly what it held (the killed run's reservation stays counted)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from silofl.experiments.resume import resume_run
    cfg = _run_toml(tmp_path, {}, methods=["mrmtl"], rounds=400)
    proc = subprocess.Popen([sys.executable, "-m", "silofl.cli", "run", "-c", str(cfg), "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 300  # bound; the loop ends when ready
        while time.monotonic() < deadline and proc.poll() is None:
            done = list((tmp_path / "runs").glob("*/checkpoint/*.state.pkl"))
            if done:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    run_dir = next((tmp_path / "runs").iterdir())
    assert (run_dir / "checkpoint" / "job.json").is_file()
    with BudgetStore(tmp_path / "budget.sqlite") as store:
        before = {n: store.charges(n) for n in store.silos()}
    with pytest.raises(ConfigError, match="privately tuned run"):
        resume_run(run_dir)
    res = CliRunner().invoke(app, ["run", "--resume", str(run_dir), "-q"])
    assert res.exit_code != 0 and "privately tuned run" in " ".join(res.output.split())
    with BudgetStore(tmp_path / "budget.sqlite") as store:
        assert {n: store.charges(n) for n in store.silos()} == before and before
