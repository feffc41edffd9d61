"""Robust MR-MTL under DP with attacking silos (issue 10's checks; README "Byzantine-robust
aggregation"; benchmarks/bench_robust.py prints the full rule × attack tables).

Every run is DP-SGD with SEEDED noise (reproducible: an experiment, not a guarantee) and
σ calibrated per silo; the metric is the honest silos' test metric (test-count weighted).
An attack's harm is measured against the same rule's honest run: accuracy points, or % of
the MSE ("2 points" ↔ 2%). Settings are the benchmark's, with fewer rounds/repeats where
that keeps the margins (the figures in comments are from these exact settings).

What holds and is asserted here:
* 23 synthetic silos, 5 attackers: median, trimmed mean, Krum, multi-Krum and centered
  clipping stay within 2 points for sign_flip, scaled, gaussian, nan and label_flip; the
  plain mean loses > 5 points to scaled and gaussian attackers.
* heart, 1 attacking hospital of 4: median and trimmed mean within 2 points for the same
  five attacks; the mean fails on scaled and gaussian.
* School (all 139 schools), 28 attackers: only what holds — multi-Krum within 2% for scaled,
  gaussian and nan; median, trimmed mean and centered clipping within 2% for nan; the plain
  mean +57% (scaled) and diverged (gaussian). Without attackers every robust rule is worse
  than the mean (which averages the silos' DP noise best).
* NaN updates never reach the model: the server's model is finite after every round and
  `aggregation.rejected` counts every NaN row.

What does NOT hold (not asserted as holding; README and benchmark give the numbers): "a
little is enough" (little) beats every rule but centered clipping on heart — the median and
trimmed mean lose more than 4 points on the synthetic task, more than the plain mean
(asserted below as the known weak spot); on School sign_flip and label_flip harm every rule
beyond 2% except Krum (which starts from a poor honest run, +35% MSE), little harms every
rule, and scaled harms the median, trimmed mean and centered clipping by 10–18%.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from silofl import data as D
from silofl.algorithms import make_algorithm
from silofl.algorithms.robust import Attack, Attacked, flip_labels
from silofl.models import make_model
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig, plan_silos
from silofl.runtime.simulator import simulate

MARGIN = 2.0  # accuracy points, or % of the MSE
TRIM = 0.25   # ⌊0.25·K⌋ ≥ ⌈0.2·K⌉ attackers for K = 4, 23, 139
SCREENED = ("sign_flip", "scaled", "gaussian", "nan", "label_flip")


class _Watch:
    """Runs `alg`, recording after every server step whether the server's model is finite."""

    def __init__(self, alg):
        self.alg, self.finite = alg, []

    def __getattr__(self, name):
        if name == "alg":
            raise AttributeError(name)
        return getattr(self.alg, name)

    def server_step(self, server, update, weights):
        out = self.alg.server_step(server, update, weights)
        self.finite.append(bool(np.isfinite(out.params).all()))
        return out


@dataclasses.dataclass
class Setting:
    """A federation, its DP plan and attackers; `score` runs (and caches) MR-MTL."""
    fed: object
    model: object
    cfg: TrainingConfig
    lam: float
    f: int
    seeds: tuple
    runs: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.plans = plan_silos(self.fed, make_algorithm("mrmtl", lam=self.lam), self.cfg)
        c, P = self.cfg, self.model.num_params
        # centered clipping's τ from public quantities: ≈ one silo's noisy round update
        self.tau = float(np.median([c.lr * math.sqrt(p.steps_per_pass) * c.clip * math.sqrt(
            1 + (p.noise_multiplier / c.batch_size) ** 2 * P) for p in self.plans]))
        K = self.fed.num_silos
        self.bad = Attack("nan", count=self.f, seed=0).attackers(K)
        self.honest = np.setdiff1d(np.arange(K), self.bad)
        self.poisoned = flip_labels(self.fed, self.bad)

    def run(self, rule: str, attack: str, seed: int) -> dict:
        key = rule, attack, seed
        if key not in self.runs:
            alg = make_algorithm("mrmtl", lam=self.lam, aggregation=rule,
                                 attackers=0 if rule == "mean" else self.f,
                                 trim_fraction=TRIM, clip_radius=self.tau)
            if attack not in ("none", "label_flip"):
                alg = Attacked(alg, Attack(attack, count=self.f, seed=0))
            w = _Watch(alg)
            res = simulate(self.poisoned if attack == "label_flip" else self.fed, self.model,
                           w, dataclasses.replace(self.cfg, seed=seed), plans=self.plans)
            tc = np.array([s.n_test for s in self.fed.silos], float)[self.honest]
            per = np.array(res.final_per_silo)[self.honest]
            self.runs[key] = {"score": float((per * tc).sum() / tc.sum()),
                              "finite": w.finite, "params": res.params,
                              "rejected": res.method.get("aggregation", {}).get("rejected", 0)}
        return self.runs[key]

    def score(self, rule: str, attack: str) -> float:
        return float(np.mean([self.run(rule, attack, s)["score"] for s in self.seeds]))

    def harm(self, rule: str, attack: str, ref_rule: str | None = None) -> float:
        """How much worse than `ref_rule`'s (default: the same rule's) honest run."""
        value, ref = self.score(rule, attack), self.score(ref_rule or rule, "none")
        if self.fed.task == "regression":
            return 100 * (value - ref) / ref
        return 100 * (ref - value)


def _cfg(rounds, batch_size, lr=0.03, accountant="pld"):
    return TrainingConfig(rounds=rounds, batch_size=batch_size, lr=lr, clip=1.0,
                          accountant=accountant, noise="seeded", eval_every=rounds)


@pytest.fixture(scope="module")
def synthetic23():
    fed = D.vehicle_like().with_targets(PrivacyTarget(1.0, 1e-5))
    return Setting(fed, make_model("logistic", fed.dim), _cfg(20, 64), lam=0.1, f=5,
                   seeds=(0,))


@pytest.fixture(scope="module")
def heart():
    fed = D.load_heart_disease().with_targets(PrivacyTarget(1.0, 1e-4))
    return Setting(fed, make_model("logistic", fed.dim), _cfg(30, 16), lam=0.3, f=1,
                   seeds=(0, 1, 2, 3))


@pytest.fixture(scope="module")
def school():
    fed = D.load_school().with_targets(PrivacyTarget(6.0, 1e-3))  # b = 16 keeps all 139
    return Setting(fed, make_model("linear", fed.dim), _cfg(50, 16), lam=1.0, f=28,
                   seeds=(0,))


# --- the label-flipping attack -----------------------------------------------------------

def test_flip_labels_poisons_only_the_attackers_training_rows():
    fed = D.linear_silos(num_silos=3, sizes=[20, 20, 20], dim=2, task="binary")
    out = flip_labels(fed, [1])
    np.testing.assert_array_equal(out.silos[1].y_train, 1 - fed.silos[1].y_train)
    assert out.silos[1].y_train.dtype == fed.silos[1].y_train.dtype
    for k in (0, 2):
        np.testing.assert_array_equal(out.silos[k].y_train, fed.silos[k].y_train)
    for k in range(3):  # test rows untouched, the original federation too
        np.testing.assert_array_equal(out.silos[k].y_test, fed.silos[k].y_test)
    assert not np.array_equal(fed.silos[1].y_train, out.silos[1].y_train)
    reg = D.linear_silos(num_silos=2, sizes=[20, 20], dim=2)
    np.testing.assert_allclose(flip_labels(reg, [0], bounds=(1.0, 3.0)).silos[0].y_train,
                               4.0 - reg.silos[0].y_train)


# --- 23 synthetic silos, 5 attackers ------------------------------------------------------

@pytest.mark.parametrize("rule", ["median", "trimmed_mean", "krum", "multi_krum",
                                  "centered_clipping"])
def test_synthetic23_robust_rules_stay_within_2_points(synthetic23, rule):
    # largest harm at these settings: centered clipping under scaled, 1.2 points
    harms = {a: synthetic23.harm(rule, a) for a in SCREENED}
    assert max(harms.values()) <= MARGIN, harms


def test_synthetic23_plain_mean_fails(synthetic23):
    # scaled −10·u: −10 points; gaussian N(0, 10²): −23 points
    for attack in ("scaled", "gaussian"):
        assert synthetic23.harm("mean", attack) > 5, attack


@pytest.mark.slow
def test_synthetic23_a_little_is_enough_is_the_known_weak_spot(synthetic23):
    # honest updates are mostly DP noise, so "mean − 1·std" hides in it and pulls the
    # median/trimmed mean the same way every round; the harm grows with the rounds (30
    # rounds: −8 points, the mean −4): NOT within 2, and worse than the plain mean
    s = Setting(synthetic23.fed, synthetic23.model, _cfg(30, 64), lam=0.1, f=5, seeds=(0,))
    for rule in ("median", "trimmed_mean"):
        assert s.harm(rule, "little") > max(2 * MARGIN, s.harm("mean", "little") + 1), rule


# --- heart: 1 attacking hospital of 4 ------------------------------------------------------

@pytest.mark.parametrize("rule", ["median", "trimmed_mean"])
def test_heart_one_attacker_median_or_trimmed_mean(heart, rule):
    harms = {a: heart.harm(rule, a) for a in SCREENED}
    assert max(harms.values()) <= MARGIN, harms


def test_heart_plain_mean_fails(heart):
    assert heart.harm("mean", "scaled") > 5 and heart.harm("mean", "gaussian") > 20


# --- School: all 139 schools, 28 attackers -------------------------------------------------

@pytest.mark.slow
def test_school_what_holds(school):
    # multi-Krum keeps exactly the 111 honest updates (−2.1%: below its own honest run);
    # the mean: +57% (scaled), MSE ≈ 10³ (gaussian)
    for attack in ("scaled", "gaussian", "nan"):
        assert school.harm("multi_krum", attack) <= MARGIN, attack
    for rule in ("median", "trimmed_mean", "centered_clipping"):
        assert school.harm(rule, "nan") <= MARGIN, rule
    assert school.harm("mean", "scaled") > 20
    assert not school.score("mean", "gaussian") < 1.0  # diverged (or inf)


def test_school_without_attackers_the_mean_is_best(school):
    # the mean averages the silos' DP noise best: median +1.6%, trimmed mean +1.3%,
    # multi-Krum +3.7%, centered clipping +2.2% MSE
    mean = school.score("mean", "none")
    for rule in ("median", "trimmed_mean", "multi_krum", "centered_clipping"):
        assert school.score(rule, "none") > mean, rule


# --- NaN updates never reach the model -----------------------------------------------------

def test_nan_updates_never_reach_the_model(synthetic23, heart):
    for s, rules in ((synthetic23, ("mean", "median", "trimmed_mean", "krum", "multi_krum",
                                    "centered_clipping")),
                     (heart, ("mean", "median", "trimmed_mean"))):
        for rule in rules:
            r = s.run(rule, "nan", 0)
            assert len(r["finite"]) == s.cfg.rounds and all(r["finite"]), rule
            assert np.isfinite(r["params"]).all()
            assert r["rejected"] == s.f * s.cfg.rounds, (rule, r["rejected"])
