"""The audit of the private preprocessing release (`silofl.audit.release`): the honest
release is not flagged, the release without noise (an uncharged standardization under the
honest claim) and the seeded (replayed) noise are; every run is charged before its data is
read, and bad input is refused before any run."""

from __future__ import annotations

import numpy as np
import pytest

from silofl.audit import release
from silofl.audit.canaries import Canaries
from silofl.config import config_from_dict
from silofl.data.federation import Silo
from silofl.data.preprocess import PreprocessSpec, plan_preprocessing, weakened_for_audit
from silofl.data.raw import RawFederation
from silofl.data.schema import ColumnSpec
from silofl.errors import ConfigError, DataError, PrivacyError
from silofl.privacy.budget import BudgetStore
from silofl.privacy.targets import PrivacyTarget

RUNS = 60  # per neighbour; every run is a release only (no training): ~2 ms each
PRIVATE = PreprocessSpec("private", "private")


def _raw(seed: int = 0, epsilon: float = 1.0) -> RawFederation:
    """Two silos, a numeric column in [0, 10] (nullable) and one in [-5, 5], ε each."""
    rng = np.random.default_rng(seed)
    silos = []
    for name, n in (("north", 80), ("south", 50)):
        X = np.column_stack([rng.uniform(2, 8, n), rng.normal(0, 1, n)])
        X[rng.random(n) < 0.1, 0] = np.nan
        y = rng.integers(0, 2, n)
        silos.append(Silo(name, X[:-10], y[:-10], X[-10:], y[-10:],
                          PrivacyTarget(epsilon, 1e-5)))
    specs = {0: ColumnSpec("a", "numeric", 0, 10, nullable=True),
             1: ColumnSpec("b", "numeric", -5, 5)}
    return RawFederation(silos, ["a", "b"], "binary", 2, specs, name="test")


@pytest.fixture
def jobs(monkeypatch):
    """Every job the audit opens (wrapping `open_job`), to check what was charged."""
    opened = []
    real = release.open_job

    def spy(*a, **k):
        job = real(*a, **k)
        opened.append(job)
        return job
    monkeypatch.setattr(release, "open_job", spy)
    return opened


def _audit(raw=None, **kw):
    kw = {"spec": PRIVATE, "store": BudgetStore(None), "runs": RUNS,
          "rng": np.random.default_rng(1), **kw}
    return release.audit_release(raw if raw is not None else _raw(), **kw)


@pytest.mark.statistical
def test_the_honest_release_is_not_flagged_and_every_run_is_charged(jobs):
    rows = _audit()
    assert [r.silo for r in rows] == ["north", "south"]
    for r in rows:
        # the release's own claim: GaussianDpEvent(σ) at δ, calibrated to 0.1 · ε
        assert r.claimed_epsilon == pytest.approx(0.1, rel=1e-3)
        assert r.target_epsilon == pytest.approx(0.1)
        assert not r.violation and r.lower_bound < 0.1, r.details
        assert r.details["runs"] == RUNS and not r.details["weakened"]
        assert r.details["noise_multiplier"] == r.details["claimed_noise_multiplier"] > 0
    # one job per release, each on its own scratch store, settled with one "preprocess"
    # charge per silo recorded before the release read the data
    assert len(jobs) == 2 * RUNS * 2
    for job in jobs:
        assert job.store.scratch and job.settled
        assert sorted(c.silo for c in job.executed()) == ["north", "south"]
        assert {c.label for c in job.executed()} == {"preprocess"}
    assert len({id(j.store) for j in jobs}) == len(jobs)


@pytest.mark.statistical
def test_the_release_without_noise_is_flagged():
    rows = _audit(weaken=True)
    for r in rows:
        # perfect separation of 30 + 30 held-out runs at 1 − 0.05/2 per silo gives
        # ln(q/(1 − q)), q = 0.0125^(1/30): 1.85, 18× the claim
        assert r.violation and r.lower_bound > 1.5, r.details
        assert r.claimed_epsilon == pytest.approx(0.1, rel=1e-3)  # the claim is unchanged
        assert r.details["weakened"] and r.details["noise_multiplier"] == 0.0
        assert r.details["claimed_noise_multiplier"] > 0
        assert r.details["statistic"].startswith(f"{r.silo}: ")  # its own statistics moved


@pytest.mark.statistical
def test_seeded_noise_replays_one_draw_and_is_flagged():
    # `silofl run` seeds the release's noise from the training seed: every re-run of a
    # seeded job releases the same noise, so D and D′ differ deterministically. (At ε = 10
    # the release's 1.0 leaves noise small enough that the clamps of post-processing do not
    # swallow the difference; at ε = 1 they may, and then nothing is released that differs.)
    (row,) = _audit(_raw(epsilon=10.0), silos=["south"], noise="seeded", seed=3, runs=100)
    assert row.claimed_epsilon == pytest.approx(1.0, rel=1e-3)
    assert row.violation and row.lower_bound > 2.0, row.details


def test_a_given_canary_is_used_and_checked():
    c = Canaries(np.array([[10.0, -5.0]]), np.array([1]))
    (row,) = _audit(silos=["north"], canary=c, weaken=True, runs=20)
    assert row.details["canary"] == {"X": [10.0, -5.0], "y": 1.0}
    assert row.details["runs"] == 20 and row.violation
    with pytest.raises(DataError, match="do not fit"):
        _audit(canary=Canaries(np.zeros((1, 3)), np.array([1])))


@pytest.mark.parametrize("change,error,match", [
    ({"store": "file"}, ConfigError, "scratch store"),
    ({"spec": PreprocessSpec("declared", "declared")}, ConfigError, "no DP release to audit"),
    ({"spec": PreprocessSpec("uncharged", "uncharged")}, ConfigError, "no DP release"),
    ({"silos": ["west"]}, DataError, "unknown silo 'west'"),
    ({"silos": []}, ConfigError, "no silo to audit"),
    ({"runs": 3}, ConfigError, "at least 8 runs"),
    ({"confidence": 1.0}, ConfigError, "confidence must be in"),
    ({"accountant": "moments"}, PrivacyError, "unknown accountant 'moments'"),
])
def test_bad_input_is_refused_before_any_run(jobs, tmp_path, change, error, match):
    if change.get("store") == "file":
        change = {"store": BudgetStore(tmp_path / "budget.db")}
    with pytest.raises(error, match=match):
        _audit(**change)
    assert jobs == []  # nothing reserved, nothing read


def test_a_silo_without_a_target_is_refused(jobs):
    raw = _raw()
    raw.silos[1] = Silo("south", raw.silos[1].X_train, raw.silos[1].y_train,
                        raw.silos[1].X_test, raw.silos[1].y_test, None)
    with pytest.raises(ConfigError, match="no ε claim"):
        _audit(raw)
    assert jobs == []


def test_the_job_form_needs_privacy_and_a_scratch_store(jobs):
    base = {"data": {"standardize": "private"}, "output": {"dir": ""}}
    with pytest.raises(ConfigError, match="privacy is disabled"):
        release.audit_job_release(config_from_dict({**base, "privacy": {"enabled": False}}))
    private = {**base, "privacy": {"epsilon": 1.0, "delta": 1e-5}}
    with pytest.raises(ConfigError, match="scratch store"):
        release.audit_job_release(config_from_dict(private))
    assert jobs == []


@pytest.mark.statistical
def test_the_heart_jobs_release_through_the_config(jobs):
    cfg = config_from_dict({"data": {"standardize": "private", "impute": "private"},
                            "privacy": {"epsilon": 1.0, "delta": 1e-5},
                            "budget": {"scratch": True}, "output": {"dir": ""}})
    honest = release.audit_job_release(cfg, silo="Switzerland", runs=100, seed=0)
    weak = release.audit_job_release(cfg, silo="Switzerland", runs=100, seed=0,
                                     weaken=True)
    assert not honest[0].violation and weak[0].violation, (honest, weak)
    assert weak[0].lower_bound > 2.5
    assert len(jobs) == 400


def test_the_aligned_statistic_sums_the_released_means_along_the_canary():
    raw = _raw()
    plan = plan_preprocessing(raw, PRIVATE, accountant="pld")
    c = Canaries(np.array([[10.0, -5.0]]), np.array([1]))  # u = (+1, −1)
    # column a is standardized and imputed: its center is read; b is standardized only
    stats = {"north: center of a": [5.0, 7.5], "north: fill of a": [0.0, 0.0],
             "north: center of b": [0.0, -2.5]}
    # run 1: m = (0, 0) → 0; run 2: m = (0.5, −0.5) → 1·0.5 + (−1)·(−0.5) = 1
    assert release._aligned(raw, "north", c, plan, stats) == pytest.approx([0.0, 1.0])


def test_the_weakened_plan_keeps_the_claim_and_states_its_noise():
    raw = _raw()
    plan = plan_preprocessing(raw, PRIVATE, accountant="pld")
    weak = weakened_for_audit(plan, 0.25)
    assert weak.events == plan.events  # the honest claim, unchanged
    for name, sigma in plan.noise_multipliers.items():
        assert weak.noise_multipliers[name] == pytest.approx(0.25 * sigma)
        assert weak.to_meta()["noise_multiplier"][name] == pytest.approx(0.25 * sigma)
    assert all(st.noise["north"] == pytest.approx(0.25 * plan.sensitivity *
                                                  plan.noise_multipliers["north"])
               for st in weak.steps if st.mode == "private")
    assert plan.noise_multipliers["north"] > 0 and weak is not plan  # plan unchanged
    for bad in (1.0, -0.1, True):
        with pytest.raises(ConfigError, match="noise_factor"):
            weakened_for_audit(plan, bad)
    declared = plan_preprocessing(raw, PreprocessSpec("declared", "declared"))
    with pytest.raises(ConfigError, match="no noise to weaken"):
        weakened_for_audit(declared)


def test_the_rows_report_no_value_of_a_released_statistic(jobs):
    # the bound's threshold is a silo's (noisy) released mean from an uncharged scratch
    # release: a data-dependent number, so the row keeps only the statistic's name
    cfg = config_from_dict({"data": {"standardize": "private"},
                            "privacy": {"epsilon": 1.0, "delta": 1e-5},
                            "budget": {"scratch": True}, "output": {"dir": ""}})
    (row,) = release.audit_job_release(cfg, silo="Switzerland", runs=10, seed=1)
    assert "threshold" not in row.details and row.details["statistic"]
