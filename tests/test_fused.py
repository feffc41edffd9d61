"""The fused GLM pass (`training.fused`): the same mechanism as the general path — the
same draws give the same update, the released noisy sum has the theoretical mean and
variance, every clipped per-example gradient has norm ≤ C — charged before any read, and
a round's ledger charges reach the budget store in one transaction."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from silofl.algorithms import make_algorithm
from silofl.data import linear_silos, vehicle_like
from silofl.errors import BudgetExceeded
from silofl.models import make_model
from silofl.privacy.budget import BudgetStore
from silofl.privacy.clipping import clip_bound
from silofl.privacy.ledger import Ledger, charge_all
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig
from silofl.runtime.simulator import simulate
from silofl.training import fused
from silofl.training.dpsgd import GradientRule
from silofl.training.silo_data import SiloArrays
from silofl.training.trainer import LocalTrainer


def _trainer(model_name: str, private: bool, seed: int, *, sizes=(60, 90, 75), dim=4,
             b=8.0, steps=(3, 5, 4), lr=0.3, l2=0.01, clip=0.7, data=None) -> LocalTrainer:
    fed = linear_silos(num_silos=len(sizes), sizes=list(sizes), dim=dim, seed=1)
    Xs = [s.X_train * 3.0 for s in fed.silos]  # large enough that clipping binds
    ys = [s.y_train if model_name == "linear" else (s.y_train > 0).astype(float)
          for s in fed.silos]
    data = SiloArrays.stack(Xs, ys) if data is None else data
    ledgers = [Ledger(f"s{k}", PrivacyTarget(1e6, 1e-5)) for k in range(len(sizes))] \
        if private else None
    rule = GradientRule(clip, np.array([0.8, 1.1, 1.4]) if private else None)
    return LocalTrainer(model=make_model(model_name, dim), data=data, rule=rule,
                        batch_size=b, steps_per_round=np.array(steps), lr=lr, l2=l2,
                        rng=Randomness.seeded(seed), ledgers=ledgers)


@pytest.mark.parametrize("model_name", ["linear", "logistic", "svm", "focal"])
@pytest.mark.parametrize("private", [True, False])
def test_fused_pass_equals_the_general_path_on_the_same_draws(monkeypatch, model_name,
                                                             private):
    """Seeded, both paths draw the same batches and noise in the same order, so a pass
    (pull, l2, unequal steps, a silo subset, an algorithm's own step) must give the same parameters up to the
    float32 logits and sums (rtol 1e-4) — and the fused path must be the one taken."""
    rng = np.random.default_rng(0)
    W0 = rng.normal(size=(3, 5)) * 0.3
    anchor = rng.normal(size=(3, 5)) * 0.3
    taken = []
    orig = fused.run_pass
    monkeypatch.setattr(fused, "run_pass", lambda *a, **k: taken.append(1) or orig(*a, **k))
    def own_step(active, W, g):  # an algorithm's own step (post-processing of ĝ)
        return 0.9 * W - 0.2 * g + 0.01 * active[:, None]

    cases = [(None, None), (np.array([True, False, True]), None), (None, own_step)]
    for silos, step in cases:
        a = _trainer(model_name, private, seed=5)
        Wa = a.run(W0, anchor=anchor, lam=np.array([0.2, 0.5, 0.1]), round=1, silos=silos,
                   step=step)
        with monkeypatch.context() as m:
            m.setattr(fused, "applies", lambda *a, **k: False)
            b = _trainer(model_name, private, seed=5)
            Wb = b.run(W0, anchor=anchor, lam=np.array([0.2, 0.5, 0.1]), round=1,
                       silos=silos, step=step)
        np.testing.assert_allclose(Wa, Wb, rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(a.steps_done, b.steps_done)
        assert not np.array_equal(Wa, W0)
    assert len(taken) == len(cases)


def test_fused_released_sum_has_theoretical_mean_and_variance():
    """Every example of a silo is the same row x (‖g‖ > C at w = 0, so each clips to
    exactly v = clip_bound(C)·g/‖g‖): a step releases (B·v + N(0, σ²C²I)) / (q·n) with
    B ~ Binomial(n, q). Over many independent rounds the mean must be v and each
    coordinate's variance (n q (1 − q) v_j² + σ²C²) / (q n)² (chi-square and z tests)."""
    n, b, C, sigma, d = 50, 10.0, 0.5, 1.3, 3
    x = np.array([2.0, -1.0, 0.5])
    data = SiloArrays.stack([np.tile(x, (n, 1))], [np.full(n, 4.0)])
    R = 4000  # steps of one pass: each an independent Poisson batch and noise draw
    tr = LocalTrainer(model=make_model("linear", d), data=data,
                      rule=GradientRule(C, np.array([sigma])), batch_size=b,
                      steps_per_round=np.array([R]), lr=1.0, l2=0.0,
                      rng=Randomness.seeded(11), ledgers=[Ledger("s", PrivacyTarget(1e9, 0.1))])
    assert fused.applies(tr, SiloArrays.gather, None)
    seen = []
    tr.run(np.zeros((1, d + 1)), step=lambda active, W, g: seen.append(g[0].copy()) or W)
    out = np.stack(seen)  # the released estimates ĝ at w = 0
    xb = np.append(x, 1.0)
    v = -4.0 * xb  # residual z − y = −4 at w = 0
    v *= clip_bound(C) / np.linalg.norm(v)
    q = b / n
    var = (n * q * (1 - q) * v**2 + (sigma * C) ** 2) / (q * n) ** 2
    z = (out.mean(0) - v) / np.sqrt(var / R)
    assert np.all(np.abs(z) < 4.5), z
    chi = (R - 1) * out.var(0, ddof=1) / var
    lo, hi = stats.chi2.ppf([1e-5, 1 - 1e-5], R - 1)
    assert np.all((chi > lo) & (chi < hi)), chi / (R - 1)


def test_fused_clipped_per_example_gradients_have_norm_at_most_c():
    """Adversarial rows — huge, tiny, overflowing ‖x‖², NaN-producing — and a huge model:
    every row's clipped gradient coef·[x, 1], in float64, has norm ≤ C; padding is 0."""
    rng = np.random.default_rng(3)
    d, C = 6, 0.9
    X = rng.normal(size=(40, d)) * rng.choice([1e-3, 1.0, 1e3, 1e18], size=(40, 1))
    y = rng.normal(size=40) * 1e4
    tr = _trainer("linear", True, seed=0, sizes=(40,), dim=d, clip=C,
                  data=SiloArrays.stack([X], [y]))
    idx = np.arange(40)[None, None, :]
    mask = np.ones_like(idx, dtype=bool)
    mask[..., -5:] = False  # padding
    flat, t, bound = fused.prepare(tr, np.array([0]), idx, mask)
    rows = tr.data.gather_rows(flat[0])[..., :d + 1].astype(np.float64)  # [x, 1]
    for w in (np.zeros(d + 1), rng.normal(size=d + 1) * 1e6):
        z = rows @ w
        with np.errstate(all="ignore"):
            r = tr.model.residual_step(z.astype(np.float32), t[0])
        r[0, 3] = np.nan  # a non-finite residual is clipped like a huge one
        coef = fused.clipped_coef(r, bound[0], True).astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            norms = np.abs(coef) * np.sqrt(np.einsum("kbd,kbd->kb", rows, rows))
        norms = np.where(coef == 0, 0.0, norms)  # 0·inf on an overflowing row is 0
        assert np.all(norms <= C), norms.max()
        assert np.all(coef[0, -5:] == 0)
        assert np.all(np.isfinite(coef))


def test_fused_pass_reads_only_after_the_charge(monkeypatch):
    """Every read of the fused pass (`gather_rows`, the one tabular read) happens after
    each silo's ledger took this round's charge; a silo left out is neither read nor
    charged."""
    tr = _trainer("svm", True, seed=2)
    seen = []
    orig = SiloArrays.gather_rows

    def spy(self, flat, first=0):
        seen.append([len(led.entries) for led in tr.private_ledgers])
        return orig(self, flat, first)

    monkeypatch.setattr(SiloArrays, "gather_rows", spy)
    tr.run(np.zeros((3, 5)), round=1, silos=np.array([True, False, True]))
    assert seen and all(s == [1, 0, 1] for s in seen)
    tr.run(np.zeros((3, 5)), round=2)
    assert seen[-1] == [2, 1, 2]


def test_round_charges_reach_the_store_in_one_transaction(monkeypatch):
    """simulate(): each round's K ledger charges are one `record_progress` call; the
    store's recorded progress equals what the ledgers charged (as before batching)."""
    fed = vehicle_like(seed=0).with_targets(PrivacyTarget(1e4, 1e-5))
    fed = type(fed)(fed.silos[:4], fed.feature_names, fed.task)
    calls = []
    orig = BudgetStore.record_progress
    monkeypatch.setattr(BudgetStore, "record_progress",
                        lambda self, run, rows: calls.append(len(rows)) or orig(self, run, rows))
    cfg = TrainingConfig(rounds=5, batch_size=32, lr=0.01, clip=6.0, noise_multiplier=1.0,
                         seed=0, eval_every=5)
    store = BudgetStore(None)
    res = simulate(fed, make_model("svm", fed.dim), make_algorithm("mrmtl", lam=0.1), cfg,
                   store=store)
    assert calls == [4] * 5
    progress = store.progress(res.run_id)
    assert sum(p.count for p in progress) == sum(len(led.entries) for led in res.ledgers) == 20


def test_charge_all_is_all_or_none():
    """A silo that cannot pay stops the round before any ledger or store records it."""
    rich, poor = Ledger("a", PrivacyTarget(1e6, 1e-5)), Ledger("b", PrivacyTarget(1e-3, 1e-5))
    recorded = []
    hook = lambda *a: None  # noqa: E731
    hook.many = recorded.append  # type: ignore[attr-defined]
    rich.on_charge = poor.on_charge = hook
    tr = _trainer("linear", True, seed=0)
    ev = tr.round_events()[0]
    with pytest.raises(BudgetExceeded):
        charge_all([rich, poor], [ev, ev], round=1, label="dpsgd")
    with pytest.raises(BudgetExceeded):
        charge_all([poor, rich], [ev, ev], round=1, label="dpsgd")
    assert not rich.entries and not poor.entries and not recorded
    charge_all([rich], [ev], round=1, label="dpsgd")
    assert len(rich.entries) == 1 and len(recorded) == 1 and len(recorded[0]) == 1


@pytest.mark.parametrize("private", [True, False])
def test_fused_gradients_equal_the_general_path(monkeypatch, private):
    """`LocalTrainer.gradients` (Weight Erosion's release), all silos or a subset: the
    fused estimate equals the general path's on the same draws (rtol 1e-4); the silos
    left out are NaN and not counted."""
    W = np.random.default_rng(1).normal(size=(3, 5))
    for silos in (None, np.array([False, True, True])):
        a = _trainer("logistic", private, seed=9)
        ga = a.gradients(W, round=1, silos=silos)
        with monkeypatch.context() as m:
            m.setattr(fused, "applies", lambda *a, **k: False)
            b = _trainer("logistic", private, seed=9)
            gb = b.gradients(W, round=1, silos=silos)
        np.testing.assert_allclose(ga, gb, rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(a.steps_done, b.steps_done)
        assert np.isnan(ga).any() == (silos is not None)


def test_poisson_rows_put_the_batch_first():
    """The fused pass reads each step up to its widest batch only: a row's sampled
    indices must be a prefix of it (also for rows extended past the first width)."""
    from silofl.training.sampling import poisson_batches
    n = np.array([5, 400, 3000, 1])
    idx, mask = poisson_batches(np.tile(n, 50), np.tile([1.0, 0.3, 0.02, 0.5], 50),
                                Randomness.seeded(4))
    first_gap = np.argmin(np.c_[mask, np.zeros(len(mask), bool)], axis=1)
    assert np.array_equal(first_gap, mask.sum(1))
    assert np.all(np.diff(np.where(mask, idx, np.iinfo(np.int64).max), axis=1)[mask[:, 1:]] > 0)


@pytest.mark.parametrize("model_name", ["linear", "logistic", "svm", "focal"])
def test_residual_step_is_the_residual(model_name):
    """The fused residual from prepared labels equals the model's residual (float32
    rounding: rtol 1e-6), margins at the hinge and NaN logits included."""
    model = make_model(model_name, 2)
    rng = np.random.default_rng(6)
    y = (rng.random(400) < 0.5).astype(np.float32)
    if model_name == "linear":
        y = rng.normal(size=400).astype(np.float32)
    z = rng.normal(size=400).astype(np.float32) * 3
    z[:20] = 2 * y[:20] - 1  # exactly on the hinge: s·z = 1
    z[20] = np.nan
    got = model.residual_step(z, model.step_targets(y))
    want = model.residual(z.astype(np.float64), y.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, equal_nan=True)


def test_charge_all_records_like_charge_and_rechecks_a_repeated_ledger():
    """`charge_all` records each distinct ledger without checking it twice: the same
    entries and spent counts as one `charge` per ledger; a ledger listed twice is checked
    again before its second charge (the first check did not see the first charge)."""
    from collections import Counter

    from silofl.privacy import events
    ev = _trainer("linear", True, seed=0).round_events()[0]
    a, b = Ledger("a", PrivacyTarget(1e6, 1e-5)), Ledger("b", PrivacyTarget(1e6, 1e-5))
    charge_all([a, b], [ev, ev], round=3, label="dpsgd")
    ref = Ledger("r", PrivacyTarget(1e6, 1e-5))
    ref.charge(ev, round=3, label="dpsgd")
    for led in (a, b):
        assert [(e.round, e.label, e.event) for e in led.entries] == \
            [(e.round, e.label, e.event) for e in ref.entries]
        assert led.spent_counts() == ref.spent_counts()
    once = Ledger("once", PrivacyTarget(1e6, 1e-5), allowance=Counter(events.flatten(ev)))
    with pytest.raises(BudgetExceeded):
        charge_all([once, once], [ev, ev], round=1, label="dpsgd")
    assert len(once.entries) == 1  # the second charge was refused


def test_record_progress_looks_up_silos_it_has_not_seen():
    """The store remembers silo ids between rounds; a silo registered later is still
    found, and a name the store never registered is still refused."""
    from silofl.privacy import accounting as A
    from silofl.privacy import events
    from silofl.privacy.budget import BudgetStoreError, PlannedCharge
    st = BudgetStore(None)
    ev = A.dpsgd_event(0.1, 4.0, 10)
    js = events.to_json(ev)
    st.register({"a": PrivacyTarget(10.0, 1e-5)})
    st.reserve("r1", [PlannedCharge("a", "m", "x", ev, 5)], command="t", noise="secure")
    st.record_progress("r1", [("a", "m", "x", js, 1)])
    st.register({"b": PrivacyTarget(10.0, 1e-5)})
    st.reserve("r2", [PlannedCharge("b", "m", "x", ev, 5)], command="t", noise="secure")
    st.record_progress("r2", [("b", "m", "x", js, 2)])
    st.record_progress("r1", [("a", "m", "x", js, 1)])
    assert [p.count for p in st.progress("r1")] == [2]
    assert [(p.silo, p.count) for p in st.progress("r2")] == [("b", 2)]
    with pytest.raises(BudgetStoreError, match="lost silo 'zz'"):
        st.record_progress("r1", [("zz", "m", "x", js, 1)])
    assert [p.count for p in st.progress("r1")] == [2]  # the refused call wrote nothing


def test_scratch_simulate_hashes_no_data(monkeypatch):
    """simulate() without a store charges a fresh in-memory store: no data digests (no
    earlier charge to compare them with); with a store given, every silo is digested."""
    from silofl.runtime import simulator
    calls = []
    orig = simulator.fingerprints
    monkeypatch.setattr(simulator, "fingerprints", lambda fed: calls.append(1) or orig(fed))
    fed = vehicle_like(seed=0).with_targets(PrivacyTarget(1e4, 1e-5))
    fed = type(fed)(fed.silos[:3], fed.feature_names, fed.task)
    cfg = TrainingConfig(rounds=2, batch_size=32, lr=0.01, clip=6.0, noise_multiplier=1.0,
                         seed=0, eval_every=2)
    model, alg = make_model("svm", fed.dim), make_algorithm("mrmtl", lam=0.1)
    res = simulate(fed, model, alg, cfg)
    assert res.scratch and not calls
    simulate(fed, model, alg, cfg, store=BudgetStore(None))
    assert calls == [1]
