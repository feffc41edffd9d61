"""Privacy: reported ε against an independent dp_accounting computation of the steps that
actually touched data, σ calibration, ledgers (refusal before data access, on-disk JSONL),
the scale of the Gaussian noise, and seeded vs OS-entropy randomness."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections import Counter

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import pld, rdp
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
from scipy import stats

from silofl.algorithms import make_algorithm
from silofl.data import linear_silos
from silofl.data.federation import Federation, Silo
from silofl.errors import BudgetExceeded, CalibrationError, PrivacyError
from silofl.models import make_model
from silofl.privacy import accounting as A
from silofl.privacy import events as E
from silofl.privacy.accounting import RDP_ORDERS
from silofl.privacy.ledger import Ledger, silo_file_id, tightest
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig, plan_silos
from silofl.runtime.simulator import simulate
from silofl.training import dpsgd
from silofl.training.dpsgd import GradientRule
from silofl.training.silo_data import SiloArrays
from silofl.training.trainer import LocalTrainer

# dp_accounting logs a warning for every fractional order it cannot evaluate
logging.getLogger("absl").setLevel(logging.ERROR)

DELTA = 1e-4
SIZES = [60, 100, 150]


@pytest.fixture
def gather_log(monkeypatch):
    """Every call of SiloArrays.gather (the only read of private rows): the silos it read."""
    calls: list[np.ndarray] = []
    orig = SiloArrays.gather

    def counting(self, silos, idx):
        calls.append(np.array(silos, copy=True))
        return orig(self, silos, idx)

    monkeypatch.setattr(SiloArrays, "gather", counting)
    return calls


def _touches(calls, k_silos):
    """Per silo: number of DP-SGD steps (gather calls) that read its data."""
    out = np.zeros(k_silos, dtype=int)
    for silos in calls:
        np.add.at(out, silos, 1)
    return out


def _fed(eps=2.0, delta=DELTA, sizes=SIZES, seed=0):
    fed = linear_silos(num_silos=len(sizes), sizes=sizes, dim=3, seed=seed)
    return fed.with_targets(PrivacyTarget(eps, delta))


def _cfg(**kw):
    base = dict(rounds=4, local_epochs=1.0, batch_size=10, lr=0.05, clip=1.0, seed=3)
    base.update(kw)
    return TrainingConfig(**base)


def _ref_event(q, sigma, steps):
    return dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)


def _rdp_eps(event, delta, orders=None):
    acc = rdp.RdpAccountant(orders=list(orders)) if orders is not None else rdp.RdpAccountant()
    acc.compose(event)
    return acc.get_epsilon(delta)


def _pld_eps(event, delta, grid=1e-4):
    acc = pld.PLDAccountant(value_discretization_interval=grid)
    acc.compose(event)
    return acc.get_epsilon(delta)


# --- reported ε == independent accounting of the executed steps ------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("method", ["local", "mrmtl"])
def test_reported_epsilon_matches_dp_accounting_for_executed_steps(gather_log, method):
    fed, cfg = _fed(), _cfg()
    res = simulate(fed, make_model("linear", 3), make_algorithm(method, lam=0.5), cfg)
    touched = _touches(gather_log, fed.num_silos)
    # steps differ between silos (q_k = b/n_k), and every silo was actually trained
    assert len(set(touched.tolist())) == fed.num_silos and touched.min() > 0
    report = res.privacy()
    for k, s in enumerate(fed.silos):
        q = cfg.batch_size / s.n_train
        sigma = res.plans[k].noise_multiplier
        event = _ref_event(q, sigma, int(touched[k]))
        eps_rdp = _rdp_eps(event, DELTA, RDP_ORDERS)
        led = res.ledgers[k]
        assert led.epsilon("rdp") == pytest.approx(eps_rdp, rel=1e-9)
        assert report[k]["epsilon_rdp"] == pytest.approx(eps_rdp, rel=1e-9)
        # the ledger holds exactly one kind of step, counted as many times as data was read
        counts = led.spent_counts()
        assert list(counts.values()) == [int(touched[k])]
        # calibrated to the target under the default accountant (PLD): within it, and
        # not far below it
        assert report[k]["within_target"] is True
        assert 0.98 * 2.0 <= report[k]["epsilon_pld"] <= 2.0
        if method == "local":
            # the PLD figure is dp_accounting's at the grid the engine picked, and within
            # 1% of a fine-grid computation
            grid = A.pld_grid(event, DELTA)
            assert report[k]["epsilon_pld"] == pytest.approx(
                _pld_eps(event, DELTA, grid), rel=1e-9)
            eps_pld = _pld_eps(event, DELTA)
            assert report[k]["epsilon_pld"] == pytest.approx(eps_pld, rel=1e-2)
            assert eps_pld <= eps_rdp
            # the engine's orders contain dp_accounting's default ones: never looser
            eps_default = _rdp_eps(event, DELTA)
            assert eps_rdp <= eps_default * (1 + 1e-9)


def test_reported_epsilon_with_epochs_and_pld_accountant(gather_log):
    """Fractional epochs and calibration against PLD: the ledger still reports the ε of
    the steps that were executed, and the PLD figure respects the target."""
    fed = _fed(eps=1.5, sizes=[50, 120])
    cfg = _cfg(rounds=3, local_epochs=1.5, batch_size=7, accountant="pld")
    res = simulate(fed, make_model("linear", 3), make_algorithm("fedavg"), cfg)
    touched = _touches(gather_log, 2)
    for k, s in enumerate(fed.silos):
        expected_steps = cfg.rounds * max(1, round(1.5 * s.n_train / 7))
        assert touched[k] == expected_steps
        event = _ref_event(7 / s.n_train, res.plans[k].noise_multiplier, int(touched[k]))
        grid = A.pld_grid(event, DELTA)
        assert res.ledgers[k].epsilon("pld") == pytest.approx(
            _pld_eps(event, DELTA, grid), rel=1e-9)
        assert res.ledgers[k].epsilon("pld") == pytest.approx(_pld_eps(event, DELTA), rel=1e-2)
        assert res.ledgers[k].epsilon() <= 1.5 * (1 + 1e-9)
        assert res.ledgers[k].epsilon("rdp") == pytest.approx(
            _rdp_eps(event, DELTA, RDP_ORDERS), rel=1e-9)


# --- calibration -------------------------------------------------------------------------------

CAL_CASES = [(1.0, 1e-5, 64 / 1000, 156), (0.5, 1e-4, 0.1, 50), (4.0, 1e-6, 0.02, 2000),
             (8.0, 1e-3, 0.5, 3)]


@pytest.mark.parametrize("target,delta,q,steps", CAL_CASES)
def test_calibrated_sigma_is_just_enough_rdp(target, delta, q, steps):
    sigma = A.calibrate_dpsgd(target, delta, q, steps, "rdp")
    eps = _rdp_eps(_ref_event(q, sigma, steps), delta, RDP_ORDERS)
    assert eps <= target * (1 + 1e-9)
    assert _rdp_eps(_ref_event(q, 0.99 * sigma, steps), delta, RDP_ORDERS) > target
    assert A.epsilon(A.dpsgd_event(q, sigma, steps), delta, "rdp") == pytest.approx(eps, rel=1e-12)


@pytest.mark.parametrize("target,delta,q,steps", CAL_CASES[:1])
def test_calibrated_sigma_is_just_enough_pld(target, delta, q, steps):
    sigma = A.calibrate_dpsgd(target, delta, q, steps, "pld")
    assert _pld_eps(_ref_event(q, sigma, steps), delta) <= target
    assert _pld_eps(_ref_event(q, 0.99 * sigma, steps), delta) > target


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_generic_calibrate_without_guess_is_just_enough(kind):
    """`calibrate` on an arbitrary event family (no fast guess is involved)."""
    def make(s):
        return dpa.ComposedDpEvent([dpa.GaussianDpEvent(s),
                                    dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2 * s), 3)])

    sigma = A.calibrate(make, 2.0, 1e-5, kind)
    assert A.epsilon(make(sigma), 1e-5, kind) <= 2.0
    assert A.epsilon(make(0.99 * sigma), 1e-5, kind) > 2.0


def test_calibration_for_impossible_target_raises():
    # RDP with orders ≤ 1024 cannot certify ε below ≈ log(1/δ)/1023 short of ε = 0
    with pytest.raises(CalibrationError, match="too strict"):
        A.calibrate_dpsgd(1e-3, 1e-5, 0.1, 1000, "rdp")
    # PLD reaches ε = 1e-3 there (σ ≈ 5500) but not 1e-6 with σ ≤ 1e4
    with pytest.raises(CalibrationError, match="too strict"):
        A.calibrate_dpsgd(1e-6, 1e-5, 0.1, 1000)
    with pytest.raises(CalibrationError):
        A.calibrate(lambda s: A.dpsgd_event(0.1, s, 100), 1e-6, 1e-5, "pld")
    with pytest.raises(PrivacyError, match="positive"):
        A.calibrate(lambda s: A.dpsgd_event(0.1, s, 100), 0.0, 1e-5)
    fed = _fed(eps=1e-6)
    with pytest.raises(CalibrationError, match="silo-00"):
        plan_silos(fed, make_algorithm("local"), _cfg(rounds=50))


def test_accounting_helpers():
    assert A.steps_for_epochs(1000, 64, 10) == 156
    assert A.steps_for_epochs(10, 64, 0.01) == 1
    assert A.epsilon(dpa.NoOpDpEvent(), 1e-5) == 0.0
    e = A.epsilons(A.dpsgd_event(0.1, 1.0, 20), 1e-5)
    assert set(e) == {"rdp", "pld"} and 0 < e["pld"] < e["rdp"]
    assert A.dpsgd_event(0.1, 1.0, 1) == dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.0))
    for q, s in [(0.0, 1.0), (1.5, 1.0), (0.1, 0.0), (0.1, -1.0)]:
        with pytest.raises(PrivacyError):
            A.dpsgd_event(q, s)
    with pytest.raises(PrivacyError, match="accountant"):
        A.epsilon(A.dpsgd_event(0.1, 1.0), 1e-5, "moments")
    # more noise, fewer steps or a lower sampling rate never cost more
    base = A.epsilon(A.dpsgd_event(0.1, 1.0, 20), 1e-5)
    assert A.epsilon(A.dpsgd_event(0.1, 1.5, 20), 1e-5) < base
    assert A.epsilon(A.dpsgd_event(0.1, 1.0, 10), 1e-5) < base
    assert A.epsilon(A.dpsgd_event(0.05, 1.0, 20), 1e-5) < base


# --- ledgers ------------------------------------------------------------------------------------

def test_budget_exceeded_before_any_data_is_touched(gather_log, tmp_path):
    fed, cfg = _fed(eps=2.0), _cfg()
    alg = make_algorithm("local")
    plans = plan_silos(fed, alg, cfg)
    # silo 1's ledger gets a smaller budget than its plan was calibrated for
    plans[1] = dataclasses.replace(plans[1], target=PrivacyTarget(1.0, DELTA))
    with pytest.raises(BudgetExceeded, match="silo-01"):
        simulate(fed, make_model("linear", 3), alg, cfg, plans=plans, ledger_dir=tmp_path / "led")
    assert gather_log == []
    files = list((tmp_path / "led").glob("*")) if (tmp_path / "led").exists() else []
    assert all(f.stat().st_size == 0 for f in files)


def _trainer(ledgers, sigmas, sizes=(40, 60), b=8, seed=0):
    fed = linear_silos(num_silos=len(sizes), sizes=list(sizes), dim=2, seed=seed)
    data = SiloArrays.stack([s.X_train for s in fed.silos], [s.y_train for s in fed.silos])
    steps = np.array([A.steps_for_epochs(n, b, 1.0) for n in sizes])
    return LocalTrainer(model=make_model("linear", 2), data=data,
                        rule=GradientRule(1.0, np.asarray(sigmas, float)), batch_size=b,
                        steps_per_round=steps, lr=0.1, l2=0.0, rng=Randomness.seeded(seed),
                        ledgers=ledgers), steps


def test_trainer_refuses_round_beyond_budget_and_records_nothing(gather_log, tmp_path):
    n, b, sigma = 40, 8, 1.2
    steps = A.steps_for_epochs(n, b, 1.0)
    e2 = tightest(A.dpsgd_event(b / n, sigma, 2 * steps), DELTA)[0]
    e3 = tightest(A.dpsgd_event(b / n, sigma, 3 * steps), DELTA)[0]
    led = Ledger("a", PrivacyTarget((e2 + e3) / 2, DELTA), path=tmp_path / "a.jsonl")
    trainer, _ = _trainer([led], [sigma], sizes=(n,), b=b)
    W = np.zeros((1, 3))
    for t in (1, 2):
        W = trainer.run(W, round=t)
    reads = len(gather_log)
    assert reads == 2 * steps
    with pytest.raises(BudgetExceeded, match="round 3"):
        trainer.run(W, round=3)
    assert len(gather_log) == reads  # the refused round read nothing
    assert len(led.entries) == 2 and led.spent_counts() == Counter(
        {A.dpsgd_event(b / n, sigma): 2 * steps})
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 2
    assert led.epsilon() == pytest.approx(e2, rel=1e-12)
    assert trainer.steps_done.tolist() == [2 * steps]


def test_refused_round_is_recorded_in_no_silo_ledger(gather_log):
    n0, n1, b, sigma = 40, 60, 8, 1.2
    s1 = A.steps_for_epochs(n1, b, 1.0)
    tight = A.epsilon(A.dpsgd_event(b / n1, sigma, s1), DELTA) * 1.01  # one round only
    leds = [Ledger("a", PrivacyTarget(100.0, DELTA)), Ledger("b", PrivacyTarget(tight, DELTA))]
    trainer, _ = _trainer(leds, [sigma, sigma], sizes=(n0, n1), b=b)
    W = trainer.run(np.zeros((2, 3)), round=1)
    with pytest.raises(BudgetExceeded):
        trainer.run(W, round=2)
    assert [len(led.entries) for led in leds] == [1, 1]


def test_ledger_charge_beyond_budget_refuses_and_records_nothing(tmp_path):
    target = PrivacyTarget(1.0, 1e-5)
    path = tmp_path / "s.jsonl"
    led = Ledger("s", target, "rdp", path)
    ev = A.dpsgd_event(0.05, 2.0, 25)
    accepted = 0
    with pytest.raises(BudgetExceeded, match="nothing was executed"):
        for r in range(1, 100):
            led.charge(ev, round=r)
            accepted += 1
    assert accepted >= 2  # ε after 1, 2, 3 charges ≈ 0.65, 0.89, 1.07 under RDP
    assert len(led.entries) == accepted
    assert len(path.read_text().splitlines()) == accepted
    assert led.spent_counts() == Counter({A.dpsgd_event(0.05, 2.0): 25 * accepted})
    # the refusal was needed, and nothing that fit was refused (the check's figure is the
    # tightest valid bound, RDP or PLD)
    ok = tightest(_ref_event(0.05, 2.0, 25 * accepted), 1e-5)[0]
    over = tightest(_ref_event(0.05, 2.0, 25 * (accepted + 1)), 1e-5)[0]
    assert ok <= 1.0 < over
    assert led.report()["within_target"] is True
    # a small event that still fits is accepted after the refusal
    small = A.dpsgd_event(0.05, 2.0, 5)
    assert tightest(A.dpsgd_event(0.05, 2.0, 25 * accepted + 5), 1e-5)[0] <= 1.0
    led.charge(small, round=999)
    assert len(led.entries) == accepted + 1
    assert len(path.read_text().splitlines()) == accepted + 1


def test_ledger_preflight_refuses_plan_and_records_nothing():
    led = Ledger("s", PrivacyTarget(0.5, 1e-5))
    with pytest.raises(BudgetExceeded, match="planned training"):
        led.preflight(A.dpsgd_event(0.1, 0.8, 500))
    assert led.entries == [] and led.spent_counts() == Counter() and led.epsilon() == 0.0
    led.preflight(A.dpsgd_event(0.1, 20.0, 10))  # fits: no exception, still nothing spent
    assert led.entries == []


def test_ledger_file_has_one_line_per_round_with_executed_event(gather_log, tmp_path):
    fed, cfg = _fed(), _cfg(rounds=5)
    res = simulate(fed, make_model("linear", 3), make_algorithm("fedavg"), cfg,
                   ledger_dir=tmp_path)
    touched = _touches(gather_log, fed.num_silos)
    files = [tmp_path / f"{silo_file_id(n)}.jsonl" for n in fed.names]
    assert sorted(files) == sorted(tmp_path.glob("*.jsonl"))
    for k, (f, s) in enumerate(zip(files, fed.silos)):
        lines = [json.loads(x) for x in f.read_text().splitlines()]
        assert [x["round"] for x in lines] == list(range(1, cfg.rounds + 1))
        total = 0
        for x in lines:
            assert x["silo"] == s.name and x["label"] == "dpsgd"
            ev = x["event"]
            assert ev["type"] == "SelfComposedDpEvent"
            assert ev["event"]["sampling_probability"] == pytest.approx(cfg.batch_size / s.n_train)
            assert ev["event"]["event"]["noise_multiplier"] == res.plans[k].noise_multiplier
            total += ev["count"]
        assert total == touched[k] == cfg.rounds * res.plans[k].steps_per_pass


# --- noise scale --------------------------------------------------------------------------------

def _check_std(z, expected):
    """z ~ N(0, expected²): chi-square test on Σz² (two-sided, p > 1e-6) and a 2% check."""
    z = np.asarray(z, float).ravel()
    n = z.size
    stat = float(np.sum(z ** 2)) / expected ** 2
    p = stats.chi2.cdf(stat, n)
    assert 1e-6 < p < 1 - 1e-6, (z.std(), expected)
    assert abs(np.sqrt(np.mean(z ** 2)) / expected - 1) < 0.02
    assert abs(z.mean()) < 6 * expected / np.sqrt(n)


@pytest.mark.statistical
@pytest.mark.parametrize("rng_kind", ["seeded", "secure"])
def test_add_noise_has_requested_std(rng_kind):
    rng = Randomness.seeded(11) if rng_kind == "seeded" else Randomness.os_entropy()
    std = np.array([0.5, 2.0, 7.5])
    out = dpsgd.add_noise(np.zeros((3, 40000)), std, rng)
    for k in range(3):
        _check_std(out[k], std[k])
    assert stats.kstest(out[1] / std[1], "norm").pvalue > 1e-6
    base = np.arange(6.0).reshape(2, 3)
    shifted = dpsgd.add_noise(base, np.array([0.0, 0.0]), rng)
    np.testing.assert_array_equal(shifted, base)


@pytest.mark.parametrize("rng_kind", ["seeded", "secure"])
def test_gradient_rule_noise_on_zero_gradients(rng_kind):
    """Linear model at w = 0 on labels y = 0: every residual is zero, so the rule's output is
    pure noise N(0, (σ_k C / (q_k n_k))² I) for the silos in the step."""
    rng = Randomness.seeded(5) if rng_kind == "seeded" else Randomness.os_entropy()
    d, B, clip = 999, 6, 0.7
    model = make_model("linear", d)
    sigmas = np.array([0.8, 3.0, 1.7])
    rule = GradientRule(clip, sigmas)
    silos = np.array([2, 0])  # a subset, out of order
    X = np.random.default_rng(0).normal(size=(2, B, d))
    y = np.zeros((2, B))
    mask = np.ones((2, B), bool)
    expected_batch = np.array([4.0, 2.5])
    draws = np.stack([rule(model, np.zeros((2, d + 1)), X, y, mask, expected_batch, silos, rng)
                      for _ in range(40)])  # (40, 2, P)
    for j, k in enumerate(silos):
        _check_std(draws[:, j] * expected_batch[j], sigmas[k] * clip)


@pytest.mark.parametrize("noise", ["seeded", "secure"])
def test_training_noise_has_calibrated_scale(monkeypatch, noise):
    """End to end: with zero data and lr = 0 every gradient estimate the trainer computes is
    pure noise; its std must be σ_k·C / b with σ_k the plan's calibrated multiplier."""
    d, b = 499, 8
    sizes = [40, 80]
    silos = [Silo(f"s{k}", np.zeros((n, d)), np.zeros(n), np.zeros((2, d)), np.zeros(2))
             for k, n in enumerate(sizes)]
    fed = Federation(silos, [f"x{j}" for j in range(d)], "regression").with_targets(
        PrivacyTarget(1.0, 1e-3))
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    orig = GradientRule.__call__

    def spy(self, model, W, X, y, mask, expected_batch, silo_idx, rng, **aux):
        g = orig(self, model, W, X, y, mask, expected_batch, silo_idx, rng, **aux)
        seen.append((np.array(silo_idx), g.copy()))
        return g

    monkeypatch.setattr(GradientRule, "__call__", spy)
    cfg = TrainingConfig(rounds=6, batch_size=b, lr=0.0, clip=0.5, noise=noise, seed=2,
                         eval_every=6)
    res = simulate(fed, make_model("linear", d), make_algorithm("local"), cfg)
    assert np.all(res.params == 0)
    for k in range(2):
        z = np.concatenate([g[list(idx).index(k)] for idx, g in seen if k in idx])
        assert z.size == cfg.rounds * res.plans[k].steps_per_pass * (d + 1)
        _check_std(z, res.plans[k].noise_multiplier * cfg.clip / b)
    assert res.plans[0].noise_multiplier > res.plans[1].noise_multiplier  # q differs


# --- randomness -------------------------------------------------------------------------------

def test_secure_draws_differ_between_instances_seeded_reproduce():
    a, b = Randomness.os_entropy(), Randomness.os_entropy()
    assert a.secure and not Randomness.seeded(0).secure
    assert not np.array_equal(a.normal(64), b.normal(64))
    assert not np.array_equal(a.uniform(64), b.uniform(64))
    assert not np.array_equal(a.normal(64), a.normal(64))
    s1, s2 = Randomness.seeded(42), Randomness.seeded(42)
    np.testing.assert_array_equal(s1.normal(64), s2.normal(64))
    np.testing.assert_array_equal(s1.uniform((3, 5)), s2.uniform((3, 5)))
    assert not np.array_equal(Randomness.seeded(1).normal(64), Randomness.seeded(2).normal(64))
    # spawned streams are reproducible too, and independent of the parent's next draws
    p1, p2 = Randomness.seeded(9), Randomness.seeded(9)
    np.testing.assert_array_equal(p1.spawn().normal(8), p2.spawn().normal(8))
    assert a.spawn().secure


@pytest.mark.statistical
def test_secure_uniform_and_normal_shapes_and_ranges():
    r = Randomness.os_entropy()
    u = r.uniform((200, 50))
    assert u.shape == (200, 50) and u.min() > 0 and u.max() <= 1
    assert abs(u.mean() - 0.5) < 6 * np.sqrt(1 / 12 / u.size)
    assert stats.kstest(u.ravel(), "uniform").pvalue > 1e-6
    z = r.normal((7, 3))
    assert z.shape == (7, 3)
    assert r.normal(5).shape == (5,)
    s = Randomness.seeded(0).uniform(100000)
    assert s.min() > 0 and s.max() <= 1


def test_simulation_reproducible_when_seeded_not_when_secure():
    fed = _fed(sizes=[40, 60])
    model = make_model("linear", 3)
    runs = {}
    for noise in ("seeded", "secure"):
        cfg = _cfg(rounds=2, noise=noise)
        runs[noise] = [simulate(fed, model, make_algorithm("local"), cfg).params for _ in range(2)]
    np.testing.assert_array_equal(runs["seeded"][0], runs["seeded"][1])
    assert not np.array_equal(runs["secure"][0], runs["secure"][1])
    assert not np.array_equal(runs["secure"][0], runs["seeded"][0])


@functools.cache
def _dp_rdp_curve(event):
    acc = rdp.RdpAccountant(list(RDP_ORDERS))
    acc.compose(event)
    return acc.rdp


def test_ledger_decisions_equal_a_naive_recomputation():
    """The ledger's fast path (identity-keyed counts, verified-composition cache, pending
    charges) takes exactly the accept/refuse decisions of recomputing ε from scratch for
    every charge, over a random mix of events, equal-but-distinct objects, checks,
    preflights and refusals."""
    rng = np.random.default_rng(5)
    target = PrivacyTarget(2.0, 1e-5)
    pool = [A.dpsgd_event(0.05, 1.1, 10), A.dpsgd_event(0.1, 2.0, 5), dpa.ZCDpEvent(0.002),
            dpa.SelfComposedDpEvent(dpa.ZCDpEvent(0.001), 3)]
    led, spent, accepted, refused = Ledger("s", target), Counter(), 0, 0
    led.preflight(pool[0])  # a verified plan: the covered path
    for i in range(120):
        j = int(rng.integers(len(pool)))
        # sometimes an equal event built anew (a different object), as plans and trainers do
        ev = pool[j] if rng.random() < 0.7 else [
            A.dpsgd_event(0.05, 1.1, 10), A.dpsgd_event(0.1, 2.0, 5), dpa.ZCDpEvent(0.002),
            dpa.SelfComposedDpEvent(dpa.ZCDpEvent(0.001), 3)][j]
        total = spent + E.flatten(ev)
        # RDP composes additively: Σ count × dp_accounting's curve of each base event
        # (computed once: fractional orders cost ~0.1 s per event), converted afresh
        curve = sum(c * _dp_rdp_curve(e) for e, c in total.items())
        fits = compute_epsilon(RDP_ORDERS, curve, target.delta)[0] <= target.epsilon * (1 + 1e-9)
        if rng.random() < 0.2:  # a bare check must agree and record nothing
            if fits:
                led.check(ev, round=i)
            else:
                with pytest.raises(BudgetExceeded):
                    led.check(ev, round=i)
            continue
        if fits:
            led.charge(ev, round=i)
            spent, accepted = total, accepted + 1
        else:
            with pytest.raises(BudgetExceeded):
                led.charge(ev, round=i)
            refused += 1
        assert led.spent_counts() == spent
    assert accepted > 5 and refused > 5
    assert led.epsilon() <= target.epsilon * (1 + 1e-9)
