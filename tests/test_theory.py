"""MR-MTL mean-estimation theory (thesis §1.6, App. D) against a Monte-Carlo simulation of
the same model with the library's own Gaussian mechanism; λ*, the conditions under which
MR-MTL beats Local and FedAvg, silo-specific λ_k*, the tuning cost of Fig. 1.7, bad input
and the CLI. Simulations are seeded; CIs are 99.9% normal intervals over repetitions."""

from __future__ import annotations

import json
import logging
import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import rdp
from typer.testing import CliRunner

from silofl.cli import app
from silofl.errors import ConfigError, PrivacyError
from silofl.theory import model as me
from silofl.theory import tuning_cost as tc
from silofl.theory.figures import FIG17_PANELS, fig17_numbers
from silofl.theory.montecarlo import simulate

logging.getLogger("absl").setLevel(logging.ERROR)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _model(tau2, sigma2, eps, K=8, n=40, **kw):
    clip = 5.0 * math.sqrt(tau2 + sigma2)  # public bound: clipping mass ≈ 6e-7 per point
    return me.mean_estimation(K, n, sigma2, tau2, clip, eps, 1e-5, **kw)


GRID = [(t, s, e) for t in (0.005, 0.1) for s in (0.5, 2.0) for e in (1.0, 4.0)]


@pytest.mark.parametrize("tau2,sigma2,eps", GRID)
def test_closed_forms_within_simulation_ci(tau2, sigma2, eps):
    m = _model(tau2, sigma2, eps)
    s, K = float(m.local_var[0]), m.K
    lam_star = me.optimal_lambda(s, tau2)
    lams = [lam_star, lam_star / 10, lam_star * 10]
    sim = simulate(m, lams, reps=1500, seed=[7, int(tau2 * 1e3), int(sigma2), int(eps)])
    closed = np.array([me.local_error(s), me.fedavg_error(s, tau2, K),
                       *me.mrmtl_error(s, tau2, K, lams)])
    mean, ci = sim.mean(), sim.ci()
    assert np.all(np.abs(closed - mean) <= ci), (closed, mean, ci)
    assert np.all(ci / mean < 0.12)  # the check has power: intervals are narrow
    # the DP term matters: σ_DP²/n in place of σ_DP²/n² (a plausible slip) is rejected
    s_wrong = m.sigma2[0] / m.n[0] + m.sigma_dp[0] ** 2 / m.n[0]
    assert abs(me.local_error(s_wrong) - mean[0]) > ci[0]
    assert me.optimal_error(s, tau2, K) == pytest.approx(float(closed[2]), rel=1e-12)


def test_closed_forms_are_consistent():
    """The thesis's statements agree with each other (Lemma 1.6.7 ↔ Cor. 1.6.4 ↔ Props.
    1.6.5–1.6.6 ↔ Thm 1.6.8 ↔ the silo-specific forms of App. D.5)."""
    m = _model(0.03, 1.0, 2.0, K=10, n=50)
    s, t2, K = float(m.local_var[0]), 0.03, 10
    lam = np.array([0.0, 0.01, 0.3, 1.0, 7.0, np.inf])
    e = me.mrmtl_error(s, t2, K, lam)
    assert e[0] == pytest.approx(me.local_error(s)) and e[-1] == pytest.approx(
        me.fedavg_error(s, t2, K))
    np.testing.assert_allclose(me.silo_errors(m.local_var, t2, lam[:, None])[:, 0], e)
    ls = me.optimal_lambda(s, t2)
    assert me.mrmtl_error(s, t2, K, ls) == pytest.approx(me.optimal_error(s, t2, K))
    assert me.local_error(s) - me.optimal_error(s, t2, K) == pytest.approx(
        me.gap_to_local(s, t2, K))
    assert me.fedavg_error(s, t2, K) - me.optimal_error(s, t2, K) == pytest.approx(
        me.gap_to_fedavg(s, t2, K))
    s_np = float(m.non_private().local_var[0])
    np.testing.assert_allclose(me.mrmtl_error(s, t2, K, lam) - me.mrmtl_error(s_np, t2, K, lam),
                               me.privacy_gap(float(m.sigma_dp[0]) ** 2, 50, K, lam))
    np.testing.assert_allclose(me.silo_optimal_lambdas(m.local_var, t2), ls)
    # D.28: the error at λ_k* is the posterior variance (1/s_k + 1/v_k)⁻¹
    v = me.nonlocal_var(m.local_var, t2)
    np.testing.assert_allclose(me.silo_optimal_errors(m.local_var, t2),
                               1 / (1 / m.local_var + 1 / v))
    # the calibration is the library's: (ε, δ) met, and not by a wide margin
    z = m.noise_multiplier[0]
    from silofl.privacy import accounting
    assert accounting.epsilon(dpa.GaussianDpEvent(z), 1e-5, "pld") <= 2.0
    assert accounting.epsilon(dpa.GaussianDpEvent(0.97 * z), 1e-5, "pld") > 2.0


def test_lambda_star_minimizes_simulated_error():
    m = _model(0.02, 1.0, 2.0, K=10, n=50)
    s = float(m.local_var[0])
    ls = me.optimal_lambda(s, 0.02)
    factors = [1 / 16, 1 / 4, 1 / 2, 1.0, 2, 4, 16]
    sim = simulate(m, [ls * f for f in factors], reps=3000, seed=11)
    i_star = 2 + factors.index(1.0)
    for j, f in enumerate(factors):
        d, ci = sim.diff(2 + j, i_star)  # paired: error(λ) − error(λ*)
        assert d >= -ci, f"λ*·{f} beats λ* significantly"
        if f in (1 / 16, 16):
            assert d > ci, f"λ*·{f} is not significantly worse than λ*"
    assert int(np.argmin(sim.mean()[2:])) in (i_star - 3, i_star - 2, i_star - 1, i_star,
                                              i_star + 1)  # near-flat around λ*


def test_fixed_lambda_beats_both_endpoints_exactly_inside_the_interval():
    # τ² > s: finite upper end; s > τ²: positive lower end
    for tau2, eps in ((0.1, 4.0), (0.005, 1.0)):
        m = _model(tau2, 1.0, eps, K=10, n=50)
        s = float(m.local_var[0])
        lo, hi = me.beating_interval(s, tau2)
        inside = math.sqrt(max(lo, 1e-3) * (hi if math.isfinite(hi) else 1e3 * max(lo, 1)))
        outside = hi * 6 if math.isfinite(hi) else lo / 20
        sim = simulate(m, [inside, outside], reps=3000, seed=[3, int(eps)])
        for j in (0, 1):  # inside beats Local (0) and FedAvg (1), significantly
            d, ci = sim.diff(2, j)
            assert d < -ci, (tau2, j, d, ci)
        worse_than = 0 if math.isfinite(hi) else 1  # past hi: Local wins; below lo: FedAvg
        d, ci = sim.diff(3, worse_than)
        assert d > ci, (tau2, d, ci)
        e_out = me.mrmtl_error(s, tau2, 10, outside)
        assert e_out > (me.local_error(s) if math.isfinite(hi) else me.fedavg_error(s, tau2, 10))
    assert me.beating_interval(0.02, 0.0) is None and not me.optimum_beats_both(0.02, 0.0)


def test_no_heterogeneity_fedavg_is_optimal():
    m = _model(0.0, 1.0, 1.0, K=6, n=30)
    s = float(m.local_var[0])
    assert me.optimal_lambda(s, 0.0) == math.inf
    assert me.optimal_error(s, 0.0, 6) == pytest.approx(me.fedavg_error(s, 0.0, 6))
    sim = simulate(m, [1.0, 100.0], reps=2000, seed=5)
    d, ci = sim.diff(3, 1)  # λ = 100 vs FedAvg: FedAvg no worse
    assert d > -ci
    d, ci = sim.diff(2, 1)  # λ = 1 is significantly worse than FedAvg
    assert d > ci


def test_tuned_mrmtl_beats_endpoints_where_the_condition_says():
    """Fig. 1.7's question on both sides: after paying for tuning (E[h] = 10, geometric),
    MR-MTL at its best λ loses to untuned FedAvg in panel (a) and beats both in (b)."""
    for panel, expect in ((FIG17_PANELS[0], False), (FIG17_PANELS[1], True)):
        m = me.mean_estimation(panel.K, panel.n, panel.sigma2, panel.tau2, panel.clip,
                               panel.epsilon, panel.delta)
        z = tc.tuned_noise_multiplier(panel.epsilon, panel.delta, 10.0, 1.0)
        mt = m.with_noise_multiplier(z)
        s, st = float(m.local_var[0]), float(mt.local_var[0])
        verdict = me.tuned_beats_both(s, st, panel.tau2, panel.K)
        assert verdict["beats_both"] is expect
        base = simulate(m, [], reps=4000, seed=21)
        tuned = simulate(mt, [me.optimal_lambda(st, panel.tau2)], reps=4000, seed=22)
        t_mean, t_ci = tuned.mean()[2], tuned.ci()[2]
        for j, key in ((0, "local_error"), (1, "fedavg_error")):
            gap = t_mean - base.mean()[j]  # independent runs: the CIs add in quadrature
            ci = math.hypot(t_ci, base.ci()[j])
            closed_gap = verdict["tuned_error"] - verdict[key]
            assert abs(gap - closed_gap) <= ci
            if expect:  # tuned MR-MTL significantly better than both endpoints
                assert gap < -ci, (panel.title, key, gap, ci)
            elif key == "fedavg_error":  # (a): significantly worse than FedAvg
                assert gap > ci, (panel.title, gap, ci)


def test_silo_specific_lambdas_match_simulation():
    """App. D.5: silos with their own (ε_k, n_k). Each λ_k* (D.30) minimizes that silo's
    simulated error; a silo far noisier than the rest gets λ_k* = ∞ (FedAvg)."""
    eps = [0.3, 1.0, 2.0, 4.0, 8.0, 8.0]
    n = [30, 40, 60, 60, 80, 80]
    tau2 = 0.01
    m = me.mean_estimation(6, n, 1.0, tau2, 5.0, eps, 1e-5)
    s = m.local_var
    lk = me.silo_optimal_lambdas(s, tau2)
    assert math.isinf(lk[0]) and np.all(np.isfinite(lk[1:]))
    assert len(set(np.round(lk[1:], 6))) > 2  # genuinely silo-specific
    common = me.optimal_lambda(float(s.mean()), tau2)
    rows = np.vstack([lk, lk / 4, lk * 4, np.full(6, common), np.full(6, 0.5)])
    sim = simulate(m, rows, reps=3000, seed=31)
    closed = me.silo_errors(s, tau2, sim.lambdas)  # (L, K)
    mean, ci = sim.mean(per_silo=True), sim.ci(per_silo=True)
    assert np.all(np.abs(closed - mean) <= ci)
    for j in (3, 4, 5, 6):  # λ_k*/4, 4λ_k*, a common λ, λ = 0.5: none significantly better
        d, c = sim.diff(j, 2, per_silo=True)
        assert np.all(d >= -c), (j, d, c)
    d, c = sim.diff(3, 2, per_silo=True)
    assert np.sum(d > c) >= 3  # λ_k*/4 is significantly worse for most silos
    d, c = sim.diff(6, 1, per_silo=True)  # silo 0 at λ = 0.5 vs FedAvg
    assert d[0] > c[0]
    assert np.all(np.diff(me.silo_errors(s, tau2, np.logspace(-2, 4, 40)[:, None])[:, 0]) < 0)


def test_tnb_distribution_and_tuned_noise():
    for eta in (0.0, 0.5, 1.0, 2.0):
        g = tc.tnb_gamma(eta, 10.0)
        pmf = tc.tnb_pmf(eta, g, 20000)
        h = np.arange(1, pmf.size + 1)
        assert pmf.sum() == pytest.approx(1.0, abs=1e-9)
        assert (h * pmf).sum() == pytest.approx(10.0, rel=1e-8)
    assert tc.tnb_gamma(1.0, 10.0) == pytest.approx(0.1)  # geometric
    # the tuned σ: the charged event equals an independent dp_accounting computation
    for eta in (0.0, 1.0, math.inf):
        z = tc.tuned_noise_multiplier(2.0, 1e-5, 10.0, eta)
        ev = dpa.dp_event.RepeatAndSelectDpEvent(dpa.GaussianDpEvent(z), 10.0, eta)
        acc = rdp.RdpAccountant()
        acc.compose(ev)
        eps_ref = acc.get_epsilon(1e-5)
        assert eps_ref <= 2.0 + 1e-3
        assert eps_ref > 1.9  # calibrated, not padded
        assert z > me.gaussian_noise_multiplier(2.0, 1e-5, "rdp")  # tuning costs noise
    # a fixed grid of 10 trials at the untuned noise costs far more than the target
    z0 = me.gaussian_noise_multiplier(2.0, 1e-5)
    assert tc.naive_grid_epsilon(z0, 10, 1e-5) > 5.0


@pytest.mark.parametrize("call,exc,words", [
    (lambda: me.mean_estimation(1, 50, 1.0, 0.1, 5.0, 1.0), ConfigError, "K ≥ 2"),
    (lambda: me.mean_estimation(2.5, 50, 1.0, 0.1, 5.0, 1.0), ConfigError, "K ≥ 2"),
    (lambda: me.mean_estimation(3, 50, -1.0, 0.1, 5.0, 1.0), ConfigError, "sigma2"),
    (lambda: me.mean_estimation(3, 50, 1.0, -0.1, 5.0, 1.0), ConfigError, "tau2"),
    (lambda: me.mean_estimation(3, 50, 1.0, 0.1, 0.0, 1.0), ConfigError, "clip"),
    (lambda: me.mean_estimation(3, [50, 50], 1.0, 0.1, 5.0, 1.0), ConfigError, "per silo"),
    (lambda: me.mean_estimation(3, 0, 1.0, 0.1, 5.0, 1.0), ConfigError, "integers ≥ 1"),
    (lambda: me.mean_estimation(3, 50, 1.0, 0.1, 5.0, 0.0), PrivacyError, "epsilon"),
    (lambda: me.mean_estimation(3, 50, 1.0, 0.1, 5.0, [1, -1, 1]), PrivacyError, "epsilon"),
    (lambda: me.mean_estimation(3, 50, 1.0, 0.1, 5.0, 1.0, 1.0), PrivacyError, "delta"),
    (lambda: me.mrmtl_error(0.1, 0.1, 3, -1.0), ConfigError, "λ must be ≥ 0"),
    (lambda: tc.tnb_gamma(-0.5, 10.0), PrivacyError, "η must be ≥ 0"),
    (lambda: tc.tnb_gamma(1.0, 1.0), ConfigError, "E[h]"),
    (lambda: tc.tnb_mean(1.0, 1.5), ConfigError, "γ"),
    (lambda: simulate(me.mean_estimation(3, 5, 1.0, 0.1, 5.0), [1.0], reps=1), ConfigError,
     "reps"),
    (lambda: fig17_numbers(etas=(), poisson=False), ConfigError, "at least one"),
])
def test_bad_input_is_refused_clearly(call, exc, words):
    with pytest.raises(exc, match=None) as e:
        call()
    assert words in str(e.value)


def test_cli_show_check_and_fig17(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["theory", "show", "--tau2", "0.03", "--epsilon", "4"])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "beats both Local and FedAvg for λ ∈ (" in flat and "add/remove" in flat
    r = runner.invoke(app, ["theory", "check", "--reps", "600", "--silos", "5", "--n", "30"])
    assert r.exit_code == 0, r.output
    assert "mrmtl(λ*)" in r.output and " NO" not in r.output
    r = runner.invoke(app, ["theory", "show", "--silos", "1"])
    assert r.exit_code == 2 and "K ≥ 2" in " ".join(r.output.split())
    bad_out = tmp_path / "never"
    r = runner.invoke(app, ["theory", "fig17", "--out", str(bad_out), "--etas", "-0.5"])
    assert r.exit_code == 2 and not bad_out.exists()
    out = tmp_path / "fig"
    r = runner.invoke(app, ["theory", "fig17", "--out", str(out), "--reps", "0",
                            "--etas", "0,1"])
    assert r.exit_code == 0, r.output
    assert (out / "fig17.png").read_bytes()[:8] == PNG_MAGIC
    num = json.loads((out / "fig17.json").read_text())
    a, b, c = num["panels"]
    tuned = lambda p: [x for x in p["curves"] if x["tuning"] is not None]  # noqa: E731
    assert [x["tuning"] for x in tuned(a)] == ["tnb", "tnb", "poisson"]  # η = 0, 1; Poisson
    assert all(not x["beats_fedavg"] for x in tuned(a))  # (a) tuning loses to FedAvg
    assert all(x["beats_both"] for x in tuned(b))        # (b) still wins, by less
    assert all(not x["beats_local"] for x in tuned(c))   # (c) tuning loses to Local
    untuned = [x for x in b["curves"] if x["label"] == "Private"][0]
    assert all(x["optimal_error"] > untuned["optimal_error"] for x in tuned(b))
