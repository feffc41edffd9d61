"""ULDP-FL weighting (`algorithms.uldp`, `privacy.uldp`, `training.uldp`): persons who
appear in several silos, each person's weights summing to ≤ 1 over the silos, so the
SecAgg+ aggregate has person-level sensitivity C; its accounting against an independent
analytic-Gaussian computation; uniform and linked weights through the public API."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from silofl.algorithms import ALGORITHMS, make_algorithm
from silofl.algorithms.uldp import ULDP, person_totals, record_proportion_weights
from silofl.data.federation import Federation, Silo
from silofl.errors import ConfigError
from silofl.models import make_model
from silofl.privacy import uldp as uacc
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig
from silofl.runtime.simulator import simulate
from silofl.runtime.sources import training_source
from silofl.training.uldp import consortium_sample, weighted_sums

DIM = 3
CLIP = 1.0


def _federation(persons=60, silos=4, seed=0, eps=4.0, delta=1e-4) -> Federation:
    """Persons with 1–6 visits each; 30% of them are treated at 2–3 of the silos. Labels
    depend on a person-level feature vector (binary task)."""
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=DIM)
    rows = {k: ([], [], []) for k in range(silos)}
    for p in range(persons):
        z = rng.normal(size=DIM)  # the person's own features
        where = rng.choice(silos, size=int(rng.choice([2, 3])) if rng.random() < 0.3 else 1,
                           replace=False)
        for k in where:
            for _ in range(1 + rng.poisson(1.5)):
                x = z + 0.3 * rng.normal(size=DIM)
                rows[k][0].append(x)
                rows[k][1].append(int(x @ beta + 0.3 * rng.normal() > 0))
                rows[k][2].append(f"p{p:04d}")
    out = []
    for k, (X, y, ids) in rows.items():
        X, y, ids = np.array(X), np.array(y), np.array(ids)
        y[:2] = [0, 1]  # both classes in every silo
        Xt = rng.normal(size=(200, DIM)) * math.sqrt(1.09)  # other persons' visits
        yt = (Xt @ beta + 0.3 * rng.normal(size=200) > 0).astype(int)
        out.append(Silo(f"h{k}", X, y, Xt, yt, PrivacyTarget(eps, delta),
                        person_train=ids, person_test=np.array([f"t{k}-{i}" for i in
                                                                range(200)])))
    return Federation(out, [f"x{i}" for i in range(DIM)], "binary", 2)


def _cfg(**kw) -> TrainingConfig:
    base = dict(rounds=5, batch_size=8, lr=0.5, clip=CLIP, seed=3, noise="seeded",
                privacy_unit="person")
    base.update(kw)
    return TrainingConfig(**base)


# --- weights ---------------------------------------------------------------------------

def test_weights_sum_to_at_most_one_per_person_across_silos():
    fed = _federation()
    ids = [s.person_train for s in fed.silos]
    linked = record_proportion_weights(ids)
    totals = person_totals(ids, linked)
    assert np.allclose(totals, 1.0, atol=1e-12)  # record proportions: exactly one
    multi = [np.isin(np.unique(a), np.concatenate([np.unique(b) for j, b in enumerate(ids)
                                                   if j != k])) for k, a in enumerate(ids)]
    assert sum(m.sum() for m in multi) > 10  # the federation does have shared persons
    for weighting in ("uniform", "linked"):
        alg = ULDP(weighting)
        alg.bind_data(fed, make_model("logistic", DIM))
        t = person_totals(ids, alg.weights)
        assert t.max() <= 1.0 + 1e-12 and t.min() > 0
    # uniform with a declared M smaller than the true overlap is refused before any run
    with pytest.raises(ConfigError, match="more than persons_in_silos = 2 silos"):
        ULDP("uniform", persons_in_silos=2).bind_data(fed, make_model("logistic", DIM))
    unnormalised = [np.ones_like(w) for w in linked]
    with pytest.raises(ConfigError, match="not normalised"):
        ULDP("linked", person_weights=unnormalised).bind_data(fed, make_model("logistic", DIM))


# --- sensitivity: removing a person from every silo moves the aggregate by ≤ C ---------

def _aggregate(fed, weights_of, model, w):
    """Σ_k (silo k's weighted clipped sum) at the model w (no noise): the SecAgg+ sum."""
    src = training_source(fed.silos, "person")
    W = np.tile(w, (fed.num_silos, 1))
    return weighted_sums(model, W, src, weights_of(fed), CLIP).sum(0)


def _without(fed, person):
    silos = []
    for s in fed.silos:
        keep = s.person_train != person
        silos.append(Silo(s.name, s.X_train[keep], s.y_train[keep], s.X_test, s.y_test,
                          s.target, person_train=s.person_train[keep],
                          person_test=s.person_test))
    return Federation(silos, fed.feature_names, fed.task, fed.num_classes)


def _in_three(fed):
    """Persons present in exactly three silos."""
    ids = [set(np.unique(s.person_train)) for s in fed.silos]
    every = set().union(*ids)
    return sorted(p for p in every if sum(p in i for i in ids) == 3)


def _linked(fed):
    return record_proportion_weights([s.person_train for s in fed.silos])


def _uniform(fed):
    return [np.full(s.n_persons, 1.0 / fed.num_silos) for s in fed.silos]


def _linked_sampled(fed):  # linked, the persons of round 1 sampled at q = 0.5
    return [w * consortium_sample(b"k" * 32, np.unique(s.person_train), 1, 0.5)
            for w, s in zip(_linked(fed), fed.silos)]


def _broken(fed):  # not normalised: every person weighs 1 in every silo
    return [np.ones(s.n_persons) for s in fed.silos]


def _max_shift(fed, weights_of):
    """The largest ‖aggregate(D) − aggregate(D − person)‖ over persons in 3 silos and
    several models (large ones push every row gradient to the clip)."""
    model = make_model("logistic", DIM)
    rng = np.random.default_rng(1)
    worst = 0.0
    for p in _in_three(fed)[:6]:
        cut = _without(fed, p)
        for scale in (0.1, 10.0, 100.0):
            w = rng.normal(size=model.init_params().shape) * scale
            d = _aggregate(fed, weights_of, model, w) - _aggregate(cut, weights_of, model, w)
            worst = max(worst, float(np.linalg.norm(d)))
    return worst


@pytest.mark.parametrize("weights_of", [_linked, _uniform, _linked_sampled])
def test_removing_a_person_in_three_silos_moves_the_aggregate_by_at_most_C(weights_of):
    fed = _federation(persons=40, seed=2)
    assert len(_in_three(fed)) >= 2
    shift = _max_shift(fed, weights_of)
    assert 0.05 * CLIP < shift <= CLIP  # moves, and by no more than C (clip_bound < C)


def test_unnormalised_weights_are_caught_by_the_sensitivity_test():
    fed = _federation(persons=40, seed=2)
    # every person in 3 silos adds up to 3·C: the same check fails
    assert _max_shift(fed, _broken) > 1.5 * CLIP


# --- accounting against an independent computation -------------------------------------

def _analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """ε(δ) of a Gaussian mechanism with sensitivity/std ratio μ (Balle & Wang 2018, Thm 8):
    δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ), solved for ε."""
    def d(eps):
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu) \
            - delta
    return brentq(d, 0.0, 500.0, xtol=1e-12)


@pytest.mark.parametrize("sigma,rounds", [(2.0, 10), (8.0, 200), (1.0, 1)])
def test_accounting_equals_the_analytic_gaussian_composition(sigma, rounds):
    """R Gaussian rounds with σ are one Gaussian with σ/√R (μ = √R/σ). dp_accounting's PLD
    (pessimistic discretisation) and RDP are upper bounds: the reported figure (the tighter
    of both) must lie within [exact, exact·(1 + 2%) + 0.01]."""
    delta = 1e-5
    exact = _analytic_gaussian_epsilon(math.sqrt(rounds) / sigma, delta)
    rep = uacc.consortium_report(sigma, 4, rounds, PrivacyTarget(50.0, delta))
    assert exact - 1e-9 <= rep["consortium_epsilon"] <= exact * 1.02 + 0.01
    # the silo's own share (no SecAgg+): σ/√K, i.e. μ = √(R·K)/σ
    share = _analytic_gaussian_epsilon(math.sqrt(rounds * 4) / sigma, delta)
    assert share - 1e-9 <= rep["share_epsilon"] <= share * 1.02 + 0.01
    assert rep["share_epsilon"] > rep["consortium_epsilon"]


def test_calibrated_sigma_meets_the_strictest_target_and_no_less():
    targets = [PrivacyTarget(3.0, 1e-5), PrivacyTarget(1.0, 1e-6), PrivacyTarget(8.0, 1e-5)]
    sigma = uacc.calibrate_sigma(targets, 20)
    exact = _analytic_gaussian_epsilon(math.sqrt(20) / sigma, 1e-6)
    assert exact <= 1.0 and exact > 0.98  # the strictest target decides, nearly tight
    assert sigma >= uacc.calibrate_sigma(targets[:1], 20)


# --- the method through the API ---------------------------------------------------------

@pytest.mark.parametrize("weighting", ["uniform", "linked"])
def test_uniform_and_linked_run_from_the_api(weighting):
    fed = _federation(persons=80, seed=4)
    model = make_model("logistic", DIM)
    cfg = _cfg()
    res = simulate(fed, model, make_algorithm("uldp", uldp_weighting=weighting), cfg)
    sigma = res.plans[0].noise_multiplier
    assert all(p.noise_multiplier == sigma for p in res.plans)  # one σ for the consortium
    for led, plan in zip(res.ledgers, res.plans):
        ev = uacc.round_event(sigma)
        assert led.spent_counts() == {ev: cfg.rounds}  # one Gaussian(σ) per round, charged
        assert {e.label for e in led.entries} == {"uldp"}
        assert led.epsilon() <= plan.target.epsilon
        report = plan.to_dict()["consortium"]
        assert report["consortium_epsilon"] == pytest.approx(led.epsilon(), rel=1e-9)
        assert report["share_epsilon"] > report["consortium_epsilon"]  # never hidden
        assert plan.steps_per_pass == 1 and plan.q == 1.0
    assert res.method["weighting"] == weighting
    assert np.all(np.isfinite(res.params)) and np.allclose(res.params, res.params[0])


def test_uldp_learns_without_noise_and_is_refused_where_the_bound_would_not_hold():
    fed = _federation(persons=80, seed=4)
    model = make_model("logistic", DIM)
    res = simulate(fed, model, make_algorithm("uldp", uldp_weighting="linked"),
                   _cfg(private=False, rounds=30, lr=2.0))
    assert res.final_pooled >= 0.85  # the shared model learns the signal (chance ≈ 0.5)
    with pytest.raises(ConfigError, match="unit = \"person\""):
        simulate(fed, model, make_algorithm("uldp"), _cfg(privacy_unit="example"))
    with pytest.raises(ConfigError, match="clip = \"auto\""):
        simulate(fed, model, make_algorithm("uldp"), _cfg(clip="auto"))
    with pytest.raises(ConfigError, match="persons_in_silos = 9 exceeds"):
        simulate(fed, model, make_algorithm("uldp", persons_in_silos=9), _cfg())
    with pytest.raises(ConfigError, match="joint hosting"):
        simulate(fed, model, make_algorithm("uldp"), _cfg(), hosting="per_silo")
    assert ALGORITHMS["uldp"] is ULDP


def test_the_network_names_uldp_as_secagg_only():
    """uldp is a network method only inside SecAgg+ (the refusals without it:
    tests/test_uldp_network.py)."""
    from silofl.runtime.network.hosting import check_network_method
    check_network_method("uldp")
    with pytest.raises(ConfigError, match="uldp with \\[server\\] secagg = true"):
        check_network_method("nosuch")


def test_secure_noise_and_the_config_path():
    """The default (secure) noise draws each silo's share from the OS-keyed stream, and
    `[privacy] persons_in_silos` reaches the method through the config."""
    from silofl.config import config_from_dict
    from silofl.experiments.build import build_algorithms
    fed = _federation(persons=50, seed=6)
    a = simulate(fed, make_model("logistic", DIM), make_algorithm("uldp"),
                 _cfg(noise="secure", rounds=2))
    b = simulate(fed, make_model("logistic", DIM), make_algorithm("uldp"),
                 _cfg(noise="secure", rounds=2))
    assert np.all(np.isfinite(a.params)) and not np.allclose(a.params, b.params)
    cfg = config_from_dict({"training": {"methods": ["uldp"]},
                            "privacy": {"persons_in_silos": 3}})
    alg = build_algorithms(cfg)[0]
    alg.bind_data(fed, make_model("logistic", DIM))
    assert alg.m == 3 and all(np.all(w == 1 / 3) for w in alg.weights)


# --- consortium-consistent Poisson sampling of persons -----------------------------------

def test_sampling_takes_a_person_in_every_silo_or_in_none_at_rate_q():
    fed = _federation(persons=300, seed=7)
    alg = ULDP("linked", sample_rate=0.3)
    alg.bind_data(fed, make_model("logistic", DIM))
    alg._key = bytes(range(32))  # the consortium secret (drawn from the stream in a run)
    ids = [np.unique(s.person_train) for s in fed.silos]
    every = np.unique(np.concatenate(ids))
    rates = []
    for t in range(1, 21):
        taken = {}
        for k, w in enumerate(alg.round_weights(None, t)):  # type: ignore[arg-type]
            for pid, on in zip(ids[k], w > 0):
                assert taken.setdefault(pid, on) == on  # the same decision in every silo
        rates.append(np.mean([taken[p] for p in every]))
    # 20 rounds × 300 persons at q = 0.3: the mean within 4 binomial standard deviations
    assert abs(np.mean(rates) - 0.3) < 4 * math.sqrt(0.3 * 0.7 / (20 * len(every)))
    assert np.std(rates) > 0  # every round draws afresh


def test_sampled_accounting_matches_dp_accounting_directly():
    """q < 1: the aggregate is a Poisson-subsampled Gaussian per round; silofl's figure
    (the tighter of its PLD and RDP) against dp_accounting's own PLD accountant at a fine
    grid (both upper bounds; within 2%), and amplification makes it smaller than q = 1."""
    import dp_accounting as dpa
    sigma, rounds, q, delta = 1.2, 50, 0.2, 1e-5
    rep = uacc.consortium_report(sigma, 4, rounds, PrivacyTarget(50.0, delta), q)
    acc = dpa.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), rounds)
    direct = acc.get_epsilon(delta)
    assert rep["consortium_epsilon"] == pytest.approx(direct, rel=0.02)
    full = uacc.consortium_report(sigma, 4, rounds, PrivacyTarget(50.0, delta))
    assert rep["consortium_epsilon"] < 0.5 * full["consortium_epsilon"]


def test_a_sampled_run_charges_subsampled_rounds_and_needs_less_noise():
    fed = _federation(persons=80, seed=4)
    model = make_model("logistic", DIM)
    full = simulate(fed, model, make_algorithm("uldp", uldp_weighting="linked"), _cfg())
    res = simulate(fed, model, make_algorithm("uldp", uldp_weighting="linked",
                                              uldp_sample_rate=0.3), _cfg())
    sigma = res.plans[0].noise_multiplier
    assert sigma < full.plans[0].noise_multiplier and res.plans[0].q == 0.3
    ev = uacc.round_event(sigma, 0.3)
    assert isinstance(ev, __import__("dp_accounting").PoissonSampledDpEvent)
    for led in res.ledgers:
        assert led.spent_counts() == {ev: 5} and led.epsilon() <= led.target.epsilon
    with pytest.raises(ConfigError, match="uldp_sample_rate"):
        make_algorithm("uldp", uldp_sample_rate=0.0)


def test_every_run_samples_with_a_fresh_secret():
    """Two runs sharing a sampling secret would sample the same persons in the same rounds
    (not the independent mechanisms their composition assumes): init draws a new one."""
    fed = _federation(persons=50, seed=6)
    alg = make_algorithm("uldp", uldp_sample_rate=0.5)
    model = make_model("logistic", DIM)
    simulate(fed, model, alg, _cfg(rounds=2, noise="secure"))
    first = alg._key
    simulate(fed, model, alg, _cfg(rounds=2, noise="secure"))
    assert first is not None and alg._key is not None and alg._key != first
