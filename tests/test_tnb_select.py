"""Repeat-and-select with TNB η ∈ (−1, 0) (`privacy.tnb_select`): its bound against an
independent transcription of Papernot & Steinke's Theorem 2 and against dp_accounting at
η = 0 and 1, and its charge in ledgers and the lifetime store (the default tuning)."""

from __future__ import annotations

import json
import logging
import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import rdp
from dp_accounting.dp_event import RepeatAndSelectDpEvent
from scipy.optimize import brentq
from typer.testing import CliRunner

from silofl.cli import app
from silofl.errors import BudgetExceeded, PrivacyError
from silofl.privacy import accounting, events
from silofl.privacy import selection as TA
from silofl.privacy.budget import BudgetStore
from silofl.privacy.tnb_select import TnbRepeatAndSelectDpEvent, tnb_gamma
from silofl.runtime.simulator import simulate
from silofl.tuning import distributions as D
from silofl.tuning.subsample import SubsampleTuned
from test_tuning_modes import _spent, _sub, _toml

logging.getLogger("absl").setLevel(logging.ERROR)
ORDERS = list(accounting.RDP_ORDERS)


def _trial(q: float = 0.05, sigma: float = 1.5, steps: int = 600, score: float = 20.0):
    return dpa.ComposedDpEvent((events.hashable(dpa.SelfComposedDpEvent(
        events.dpsgd_event(q, sigma, 1), steps)), dpa.GaussianDpEvent(score)))


def _by_hand(trial: dpa.DpEvent, mean: float, eta: float, delta: float) -> float:
    """Theorem 2 written out order by order: γ from the TNB mean by brentq, ε' at each λ
    minimised over λ̂ in the same orders, RDP made monotone, then dp_accounting's
    conversion. The one run's curve is dp_accounting's RdpAccountant."""
    acc = rdp.RdpAccountant(ORDERS)
    acc.compose(trial)
    inner = list(acc._rdp)

    def mean_of(g: float) -> float:
        if eta == 0:
            return (1 / g - 1) / math.log(1 / g)
        return eta * (1 - g) / (g * (1 - g ** eta))

    gamma = brentq(lambda g: mean_of(g) - mean, 1e-12, 1 - 1e-12, xtol=1e-15, rtol=1e-14)
    const = min((1 + eta) * ((1 - 1 / lh) * eh + math.log(1 / gamma) / lh)
                for lh, eh in zip(ORDERS, inner))
    out = [e + const + math.log(mean) / (lam - 1) for lam, e in zip(ORDERS, inner)]
    mono = [min(out[j:]) for j in range(len(out))]
    return float(rdp.rdp_privacy_accountant.compute_epsilon(ORDERS, mono, delta)[0])


@pytest.mark.parametrize("eta", [-0.9, -0.5, -0.2])
@pytest.mark.parametrize("q, sigma", [(0.05, 1.5), (0.3, 8.0)])
def test_bound_equals_independent_transcription(eta, q, sigma):
    trial = _trial(q, sigma)
    ours = accounting.epsilon(TnbRepeatAndSelectDpEvent(trial, 10.0, eta), 1e-4, "rdp")
    assert ours == pytest.approx(_by_hand(trial, 10.0, eta, 1e-4), rel=1e-6)


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_bound_equals_dp_accounting_where_it_has_one(eta):
    """At η = 0 and 1, the same figure as dp_accounting's RepeatAndSelectDpEvent (both
    with RdpAccountant at silofl's orders): relative 1e-7 (γ is solved to 1e-13 here,
    to 1e-9 by dp_accounting)."""
    trial = _trial()
    acc = rdp.RdpAccountant(ORDERS)
    acc.compose(RepeatAndSelectDpEvent(trial, 10.0, eta))
    ours = accounting.epsilon(TnbRepeatAndSelectDpEvent(trial, 10.0, eta), 1e-4, "rdp")
    assert ours == pytest.approx(acc.get_epsilon(1e-4), rel=1e-7)
    assert tnb_gamma(eta, 10.0) == pytest.approx(
        rdp.rdp_privacy_accountant._gamma_truncated_negative_binomial(eta, 10.0), rel=1e-8)


def test_cheaper_as_eta_falls_and_more_than_one_run():
    trial = _trial()
    one = accounting.epsilon(trial, 1e-4, "rdp")
    eps = [accounting.epsilon(TnbRepeatAndSelectDpEvent(trial, 10.0, eta), 1e-4, "rdp")
           for eta in (1.0, 0.0, -0.5, -0.9)]
    assert all(a > b for a, b in zip(eps, eps[1:])) and eps[-1] > one


@pytest.mark.parametrize("mean, shape", [(10.0, -1.0), (10.0, math.inf), (0.5, -0.5),
                                         (math.nan, -0.5)])
def test_bad_parameters_refused(mean, shape):
    with pytest.raises(PrivacyError):
        TnbRepeatAndSelectDpEvent(_trial(), mean, shape)


def test_event_round_trips_and_is_rdp_only():
    ev = dpa.ComposedDpEvent([events.dpsgd_event(0.01, 1.3, 7),
                              TnbRepeatAndSelectDpEvent(_trial(), 10.0, -0.5)])
    text = events.to_json(ev)
    assert "tnb_repeat_and_select" in text
    back = events.from_json(events.to_json(events.from_dict(json.loads(text))))
    assert back == ev
    (tnb,) = [e for e in events.flatten(back) if isinstance(e, TnbRepeatAndSelectDpEvent)]
    assert hash(tnb) == hash(ev.events[1])  # a ledger's base event: hashable, stable
    assert accounting.accountant_for(ev, "pld") == "rdp"
    assert accounting.epsilon(back, 1e-5, "rdp") == accounting.epsilon(ev, 1e-5, "rdp")


def test_select_event_uses_it_below_zero_only():
    rev = events.dpsgd_event(0.05, 1.5, 30)
    assert isinstance(TA.select_event(rev, 2, D.tnb(-0.5, mean=10), 5.0),
                      TnbRepeatAndSelectDpEvent)
    assert isinstance(TA.select_event(rev, 2, D.tnb(0.0, mean=10), 5.0),
                      RepeatAndSelectDpEvent)
    # the σ search's closed-form aid agrees with the accountant (it only guides it)
    ev = TA.tuned_event(rev, 2, D.tnb(-0.5, mean=10), 5.0)
    aid = accounting.rdp_to_epsilon(accounting.RDP_ORDERS, TA.fast_rdp(ev), 1e-4)[0]
    assert aid == pytest.approx(TA.epsilon_of(ev, 1e-4), rel=1e-3)


# --- the charge in a run ------------------------------------------------------------------

def _sub_neg(**kw):
    fed, alg, cfg, model = _sub(**kw)
    alg = SubsampleTuned(alg.lams, D.tnb(-0.5, mean=4), alg.validation, lrs=alg.lrs,
                         pivot_lam=0.1, fraction=alg.fraction)
    return fed, alg, cfg, model


def test_ledger_charges_it_first_and_meets_the_target():
    fed, alg, cfg, model = _sub_neg()
    res = simulate(fed, model, alg, cfg)
    for led, p in zip(res.ledgers, res.plans):
        first = led.entries[0]
        assert first.label == "tuning"  # before any pass read a row
        assert any(isinstance(e, TnbRepeatAndSelectDpEvent)
                   for e in events.flatten(first.event))
        T = p.steps_per_pass * cfg.rounds
        sigma, q = p.noise_multiplier, p.q
        thin = events.dpsgd_event(0.2 * q, sigma, T)
        score = dpa.GaussianDpEvent(2.0 * sigma / (q * math.sqrt(T)))
        by_hand = dpa.ComposedDpEvent([thin, TnbRepeatAndSelectDpEvent(
            dpa.ComposedDpEvent([thin, score]), 4.0, -0.5), events.dpsgd_event(q, sigma, T)])
        rep = led.report()
        assert rep["epsilon"] == pytest.approx(accounting.epsilon(by_hand, 1e-4, "rdp"),
                                               rel=1e-6)
        assert rep["within_target"] and rep["epsilon"] > 0.95 * led.target.epsilon


def test_refused_over_budget_charges_nothing():
    from silofl.privacy.ledger import Ledger
    from silofl.privacy.randomness import Randomness
    from silofl.privacy.targets import PrivacyTarget
    from silofl.runtime.plan import plan_silos
    from silofl.training.dpsgd import GradientRule
    from silofl.training.silo_data import SiloArrays
    from silofl.training.trainer import LocalTrainer
    fed, alg, cfg, model = _sub_neg()
    plans = plan_silos(fed, alg, cfg)
    ledgers = [Ledger(p.name, PrivacyTarget(p.target.epsilon if k else 0.5, 1e-4), "rdp")
               for k, p in enumerate(plans)]
    tr = LocalTrainer(model, SiloArrays.stack([s.X_train for s in fed.silos],
                                              [s.y_train for s in fed.silos]),
                      GradientRule(1.0, np.array([p.noise_multiplier for p in plans])), 8,
                      np.array([p.steps_per_pass for p in plans]), 0.1, 0.0,
                      Randomness.seeded(1), ledgers)
    silos, server = alg.init(model.init_params(), fed.num_silos, rounds=cfg.rounds)
    with pytest.raises(BudgetExceeded):
        alg.silo_step(silos, server.params, tr, 1)
    assert all(not led.entries for led in ledgers)
    assert tr.steps_done.sum() == 0


def test_negative_eta_through_the_store(tmp_path):
    """`silofl run` with the default select (subsample) and η = −0.5: the lifetime store
    holds the charge, re-read from disk, within the target."""
    p = _toml(tmp_path, {"mode": "private", "lam": [0.1, 1.0], "mean_trials": 3,
                         "eta": -0.5})
    res = CliRunner().invoke(app, ["run", "-c", str(p)])
    assert res.exit_code == 0, res.output
    spent = _spent(tmp_path)
    assert all(0 < e <= 2.0 + 1e-9 for e in spent)
    with BudgetStore(tmp_path / "budget.sqlite") as st:
        text = json.dumps(st.charges("Cleveland"))
    assert "tnb_repeat_and_select" in text
    run_dir = next((tmp_path / "runs").iterdir())
    tuned = json.loads((run_dir / "summary.json").read_text())["methods"][1]
    assert tuned["select"] == "subsample"


def test_default_select_is_subsample_for_mrmtl_random_for_ditto():
    from silofl.config.run import TuningConfig
    from silofl.tuning.setup import select_of
    assert select_of(TuningConfig()) == "subsample"
    assert select_of(TuningConfig(method="ditto")) == "random"
    assert select_of(TuningConfig(method="ditto", select="subsample")) == "subsample"
