"""DP-GBDT quality features: private quantile bins (charged, composed into σ_k) and
MR-MTL personal leaf shrinkage (free post-processing of released leaf sums)."""

from __future__ import annotations

from collections import Counter

import dp_accounting as dpa
import numpy as np
import pytest

import silofl
from silofl.algorithms.dp_gbdt import train_dp_gbdt
from silofl.algorithms.gbdt_personal import shrunk_leaf
from silofl.data.federation import Federation, Silo
from silofl.errors import BudgetExceeded, ConfigError
from silofl.privacy import events
from silofl.privacy.ledger import Ledger
from silofl.training.histograms import ensemble_event
from silofl.training.private_bins import edges_from_histograms, fine_histogram


def _fed(n: int = 600, k: int = 3, eps: float = 1.0, seed: int = 0, d: int = 4,
         skew: bool = False, flip_last: bool = False) -> Federation:
    rng = np.random.default_rng(seed)
    silos = []
    for i in range(k):
        def draw(m: int) -> np.ndarray:
            if skew:  # mass piled near −1: quantile bins differ from equal-width ones
                return np.clip(rng.exponential(0.2, (m, d)) - 1.0, -1, 1)
            return rng.uniform(-1, 1, (m, d))

        def label(X: np.ndarray, i: int = i) -> np.ndarray:
            c = -0.86 if skew else 0.0  # about the median of each feature
            if flip_last:  # one clear signal the last silo reverses
                y = (X[:, 0] + 0.5 * X[:, 1] > c).astype(int)
            else:
                y = (((X[:, 0] - c) * (X[:, 1] - c) > 0) ^ (X[:, 2] > c + 0.3)).astype(int)
            return 1 - y if (flip_last and i == k - 1) else y

        X, Xt = draw(n), draw(n)
        silos.append(Silo(f"s{i}", X, label(X), Xt, label(Xt), silofl.PrivacyTarget(eps, 1e-5)))
    return Federation(silos, [f"x{j}" for j in range(d)], "binary", 2)


@pytest.mark.parametrize(("q", "splits"), [(1.0, "histogram"), (0.5, "random")])
def test_private_bins_ledger_equals_independent_composition(q, splits):
    fed = _fed(n=300, k=2)
    T, D, share = 3, 2, 0.2
    res = train_dp_gbdt(fed, trees=T, depth=D, subsample=q, splits=splits, bins="private",
                        bins_share=share, seed=1)
    R = D + 1 if splits == "histogram" else 1
    for rep, led in zip(res.report, res.ledgers, strict=True):
        assert led.entries[0].label == "gbdt private bins"  # charged before the trees
        s_b = led.entries[0].event.noise_multiplier
        sigma = rep["sigma"]
        # the bins' share of the zCDP budget ρ = Σ 1/(2σ²) of the unsampled releases
        rho_bins, rho_trees = 1 / (2 * s_b ** 2), T * R / (2 * sigma ** 2)
        assert rho_bins / (rho_bins + rho_trees) == pytest.approx(share, rel=1e-9)
        # independently: the bins + every executed tree release, composed, is the total
        if q == 1.0:
            trees = [dpa.GaussianDpEvent(sigma)] * (T * R)
        else:
            trees = [dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma / np.sqrt(R)))] * T
        indep = dpa.ComposedDpEvent([dpa.GaussianDpEvent(s_b), *trees])
        assert led.spent_counts() == Counter(events.flatten(indep))
        acc = dpa.pld.PLDAccountant()
        acc.compose(indep)
        eps = acc.get_epsilon(1e-5)
        assert 0.97 <= eps <= 1.0 + 1e-3  # the total is the silo's target, not more
        assert rep["epsilon"] <= 1.0
    # and the trees' σ is larger than without the bins (their share was paid for)
    plain = train_dp_gbdt(_fed(n=300, k=2), trees=T, depth=D, subsample=q, splits=splits)
    assert all(a["sigma"] > b["sigma"] for a, b in zip(res.report, plain.report, strict=True))


def test_private_edges_close_to_true_quantiles_at_large_n():
    rng = np.random.default_rng(3)
    n, d, B = 200_000, 3, 8
    X = np.clip(rng.exponential(0.25, (n, d)) - 1.0, -1.0, 1.0)
    bounds = np.tile([-1.0, 1.0], (d, 1))
    hist = fine_histogram(X, bounds, 64)
    sigma_b = 5.0  # noise std 5·√3 per fine bin: small next to 200k rows
    noisy = hist + rng.normal(0, sigma_b * np.sqrt(d), hist.shape)
    edges = edges_from_histograms(noisy, bounds, B)
    truth = np.quantile(X, np.arange(1, B) / B, axis=0).T
    width = 2.0 / 64  # the interpolation error is below one fine bin
    assert np.max(np.abs(edges - truth)) < width
    assert np.all(np.diff(edges, axis=1) > 0)
    np.testing.assert_array_equal(edges.astype(np.float32).astype(np.float64), edges)


def test_private_bins_help_on_skewed_features_and_refuse_bad_input():
    from sklearn.metrics import roc_auc_score
    fed = _fed(n=3000, k=3, skew=True, eps=100.0)
    X = np.vstack([s.X_test for s in fed.silos])
    y = np.concatenate([s.y_test for s in fed.silos])
    auc = {}
    for bins in ("schema", "private"):
        res = train_dp_gbdt(fed, trees=10, depth=3, n_bins=8, bins=bins, bins_share=0.1,
                            splits="histogram", seed=0, noise="seeded")  # a verdict: seeded
        auc[bins] = roc_auc_score(y, res.ensemble.predict(X))
    assert auc["private"] > auc["schema"] + 0.02  # equal-width bins waste bins on empty range
    with pytest.raises(ConfigError, match="bins_share"):
        train_dp_gbdt(fed, bins="private", bins_share=1.0)
    with pytest.raises(ConfigError, match="bins must be"):
        train_dp_gbdt(fed, bins="quantile")
    with pytest.raises(ConfigError, match="strictly increasing"):
        train_dp_gbdt(fed, edges=np.zeros((fed.dim, 3)))


def test_private_bins_refused_before_any_charge_when_over_budget():
    fed = _fed(n=200, k=2)
    leds = [Ledger(s.name, s.target) for s in fed.silos]
    leds[1].charge(dpa.GaussianDpEvent(6.0), label="earlier")
    with pytest.raises(BudgetExceeded):
        train_dp_gbdt(fed, trees=3, depth=2, ledgers=leds, bins="private")
    assert leds[0].entries == [] and len(leds[1].entries) == 1


def test_shrunk_leaf_is_the_minimiser_and_has_the_right_limits():
    rng = np.random.default_rng(0)
    vs, G, H = rng.normal(0, 1, 20), rng.normal(0, 5, 20), rng.uniform(1, 30, 20)
    lam, mu = 1.0, 3.0
    v = shrunk_leaf(vs, G, H, lam, mu, max_leaf=1e9)
    grid = np.linspace(-20, 20, 400_001)
    for i in range(5):
        obj = G[i] * grid + 0.5 * (H[i] + lam) * grid ** 2 + 0.5 * mu * (grid - vs[i]) ** 2
        assert abs(grid[np.argmin(obj)] - v[i]) < 1e-3
    np.testing.assert_allclose(shrunk_leaf(vs, G, H, lam, 0.0, 1e9), -G / (H + lam))
    np.testing.assert_allclose(shrunk_leaf(vs, G, H, lam, 1e12, 1e9), vs, atol=1e-9)


def test_personal_leaves_are_free_and_interpolate_local_to_shared():
    from sklearn.metrics import roc_auc_score
    T, D = 6, 2
    kw = dict(trees=T, depth=D, lr=0.5, seed=2, splits="histogram", noise="seeded")
    base = train_dp_gbdt(_fed(n=2000, eps=4.0, flip_last=True), **kw)
    counts = [led.spent_counts() for led in base.ledgers]
    runs = {mu: train_dp_gbdt(_fed(n=2000, eps=4.0, flip_last=True), shrink=mu, **kw)
            for mu in (0.0, 10.0, np.inf, "auto")}
    for res in runs.values():
        # the same shared model, and not one charge more: post-processing only
        assert [led.spent_counts() for led in res.ledgers] == counts
        for a, b in zip(res.ensemble.trees, base.ensemble.trees, strict=True):
            np.testing.assert_array_equal(a.value, b.value)
        assert res.personal is not None and len(res.personal) == 3
    for own in runs[np.inf].personal:  # μ = ∞: exactly the shared model
        for a, b in zip(own.trees, base.ensemble.trees, strict=True):
            np.testing.assert_array_equal(a.value, b.value)
    fed = _fed(n=2000, eps=4.0, flip_last=True)
    flipped = fed.silos[-1]  # its labels are the others' flipped: local leaves win there
    auc = {mu: roc_auc_score(flipped.y_test, r.personal[-1].predict(flipped.X_test))
           for mu, r in runs.items()}
    assert auc[0.0] > auc[np.inf] + 0.1
    assert runs["auto"].report[0]["shrink_mu"] < 10.0  # heterogeneity detected: weak pull
    with pytest.raises(ConfigError, match="shrink"):
        train_dp_gbdt(fed, shrink=-1.0)


def test_shrink_auto_refused_for_regression():
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (50, 2))
    fed = Federation([Silo("a", X, X[:, 0], X, X[:, 0], silofl.PrivacyTarget(1.0, 1e-5))],
                     ["u", "v"], "regression", 0)
    with pytest.raises(ConfigError, match="auto"):
        train_dp_gbdt(fed, shrink="auto")


def test_ensemble_event_is_unchanged_by_bins_option():
    # the trees' event factory is the one the plain path calibrates (shared contract)
    ev = ensemble_event(3.0, 4, 3, 1.0)
    assert isinstance(ev, dpa.SelfComposedDpEvent) and ev.count == 4


def test_cyclic_trees_are_one_feature_each_with_a_leaf_per_bin():
    from silofl.training.histograms import bin_edges, bin_features
    fed = _fed(n=400, k=2, d=3)
    T, B = 6, 8
    res = train_dp_gbdt(fed, trees=T, n_bins=B, splits="cyclic", seed=4)
    X = np.vstack([s.X_train for s in fed.silos])
    bins = bin_features(X, bin_edges(np.tile([-1.0, 1.0], (3, 1)), B))
    for t, tree in enumerate(res.ensemble.trees):
        assert tree.depth == 3 and set(tree.feature[tree.feature >= 0]) == {t % 3}
        leaf = tree.slot[tree.apply(X)]
        np.testing.assert_array_equal(leaf, bins[:, t % 3])  # leaves are the feature's bins
    for rep, led in zip(res.report, res.ledgers, strict=True):  # one leaf release per tree
        assert led.spent_counts() == Counter({dpa.GaussianDpEvent(rep["sigma"]): T})
        assert rep["epsilon"] <= 1.0


def test_auto_bins_follow_rows_over_noise():
    from silofl.algorithms.gbdt_splits import MAX_AUTO_BINS, auto_bins
    few = auto_bins(1000, [30.0] * 4, 1.0, 0.25)
    many = auto_bins(100_000, [30.0] * 4, 1.0, 0.25)
    quiet = auto_bins(1000, [3.0] * 4, 1.0, 0.25)
    assert 2 <= few < many <= MAX_AUTO_BINS and few < quiet
    assert auto_bins(10, [0.0], 1.0, 0.25) == MAX_AUTO_BINS  # non-private: finest
    for b in (few, many, quiet):
        assert b & (b - 1) == 0  # a power of two: a complete tree has a leaf per bin
    fed = _fed(n=300, k=2).with_targets(silofl.PrivacyTarget(0.5, 1e-5))
    loose = _fed(n=300, k=2).with_targets(silofl.PrivacyTarget(8.0, 1e-5))
    d_small = train_dp_gbdt(fed).ensemble.trees[0].depth
    d_large = train_dp_gbdt(loose).ensemble.trees[0].depth
    assert d_small < d_large  # more budget: finer bins (deeper cyclic trees)


def test_personal_leaves_keep_each_silos_local_trees():
    fed = _fed(n=300, k=2)
    res = train_dp_gbdt(fed, trees=4, depth=2, splits="histogram", local_trees=2,
                        shrink=np.inf, seed=5, noise="seeded")
    plain = train_dp_gbdt(_fed(n=300, k=2), trees=4, depth=2, splits="histogram",
                          local_trees=2, seed=5, noise="seeded")
    assert res.personal is not None and plain.personal is not None
    for own, ref in zip(res.personal, plain.personal, strict=True):
        assert len(own.trees) == 6  # 4 shared (μ = ∞: unchanged) + its 2 local trees
        for a, b in zip(own.trees, ref.trees, strict=True):
            np.testing.assert_array_equal(a.value, b.value)
