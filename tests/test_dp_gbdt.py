"""DP federated GBDT: ensemble structure, XGBoost export, the private histogram release
(sensitivity, ledger charges) and the boosting loop."""

from __future__ import annotations

from collections import Counter

import dp_accounting as dpa
import numpy as np
import pytest

import silofl
from silofl.algorithms.dp_gbdt import best_splits, train_dp_gbdt
from silofl.data.federation import Federation, Silo
from silofl.errors import BudgetExceeded, ConfigError
from silofl.models.trees import Tree, TreeEnsemble
from silofl.privacy import events
from silofl.privacy.ledger import Ledger
from silofl.training.histograms import SiloHistograms, bin_edges, bin_features

#: the histogram-split settings these tests were written for (no longer the defaults)
HIST = {"splits": "histogram", "lam": 1.0}


def _xor_fed(n: int = 1500, k: int = 3, eps: float = 1.0, seed: int = 0,
             task: str = "binary") -> Federation:
    rng = np.random.default_rng(seed)

    def label(X: np.ndarray) -> np.ndarray:
        if task == "regression":
            return np.sin(3 * X[:, 0]) + (X[:, 1] > 0.2) * X[:, 2]
        return ((X[:, 0] * X[:, 1] > 0) ^ (X[:, 2] > 0.5)).astype(int)

    silos = []
    for i in range(k):
        X, Xt = rng.uniform(-1, 1, (n, 5)), rng.uniform(-1, 1, (n, 5))
        silos.append(Silo(f"s{i}", X, label(X), Xt, label(Xt),
                          silofl.PrivacyTarget(eps, 1e-5)))
    return Federation(silos, [f"x{j}" for j in range(5)], task, 2 if task == "binary" else 0)


def _pooled_test(fed: Federation) -> tuple[np.ndarray, np.ndarray]:
    return (np.vstack([s.X_test for s in fed.silos]),
            np.concatenate([s.y_test for s in fed.silos]))


def test_tree_from_complete_collapses_pass_through_and_predicts():
    # depth 2 heap: root splits x0 < 0; its left child passes through; right splits x1 < 0.5
    feature = np.array([0, 0, 1, -1, -1, -1, -1], dtype=np.int32)
    threshold = np.array([0.0, np.inf, 0.5, 0, 0, 0, 0])
    value = np.array([0, 0, 0, 1.0, 99.0, 2.0, 3.0])
    tree = Tree.from_complete(feature, threshold, value)
    assert tree.n_nodes == 5 and tree.depth == 2
    assert list(tree.feature) == [0, -1, 1, -1, -1]  # breadth-first
    X = np.array([[-1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    ens = TreeEnsemble(2, "regression", 0.5, [tree])
    np.testing.assert_allclose(ens.predict_margin(X), [1.5, 2.5, 3.5])
    binary = TreeEnsemble(2, "binary", 0.0, [tree])
    np.testing.assert_allclose(binary.predict(X), 1 / (1 + np.exp(-np.array([1.0, 2, 3]))))


@pytest.mark.parametrize("task", ["binary", "regression"])
def test_xgboost_export_round_trip(tmp_path, task):
    xgb = pytest.importorskip("xgboost")
    fed = _xor_fed(n=400, task=task)
    ens = train_dp_gbdt(fed, trees=6, depth=3, private=False, base_score=0.3,
                        clip_g=5.0, clip_h=1.0).ensemble
    path = ens.save_xgboost(tmp_path / "m.json")
    booster = xgb.Booster(model_file=str(path))
    X = _pooled_test(fed)[0].astype(np.float32)  # XGBoost compares in float32
    theirs = booster.predict(xgb.DMatrix(X, feature_names=fed.feature_names),
                             output_margin=True)
    # float32 leaf values and sums in XGBoost: 1e-5 absolute on margins of order 1
    np.testing.assert_allclose(theirs, ens.predict_margin(X.astype(np.float64)), atol=1e-5)
    assert booster.num_boosted_rounds() == 6


def test_xgboost_export_normalises_names_xgboost_rejects_in_one_place(tmp_path):
    # a schema's one-hot names (cp=<missing>) are refused by XGBoost as given; the export
    # renames them (models.trees.xgboost_feature_names) and the name map says how
    from silofl.models.trees import xgboost_feature_names, xgboost_name_map
    xgb = pytest.importorskip("xgboost")
    names = ["age", "cp=<missing>", "ca[1]"]
    fed = Federation([silofl.Silo("a", *(2 * [np.random.default_rng(0).uniform(
        -1, 1, (200, 3)), np.r_[np.zeros(100), np.ones(100)]]))], names, "binary", 2)
    ens = train_dp_gbdt(fed, trees=2, private=False).ensemble
    assert ens.feature_names == names  # the model keeps its own names
    path = ens.save_xgboost(tmp_path / "m.json")
    safe = ["age", "cp=(missing)", "ca(1)"]
    assert xgboost_feature_names(names) == safe
    assert xgboost_name_map(names) == dict(zip(names, safe, strict=True))
    booster = xgb.Booster(model_file=str(path))
    assert booster.feature_names == safe
    X = fed.silos[0].X_test.astype(np.float32)
    np.testing.assert_allclose(booster.predict(xgb.DMatrix(X, feature_names=safe)),
                               ens.predict(X.astype(np.float64)), atol=1e-5)
    assert xgboost_feature_names(["a<1", "a(1"]) == ["f0", "f1"]  # equal once escaped


def test_bins_match_threshold_semantics():
    edges = bin_edges(np.array([[-1.0, 1.0], [0.0, 10.0]]), 8)
    X = np.array([[-5.0, 0.0], [edges[0, 2], 9.99], [0.3, 50.0]])
    b = bin_features(X, edges)
    for j in range(2):
        for k in range(1, 8):  # bin < k exactly when x < edge k
            np.testing.assert_array_equal(b[:, j] < k, X[:, j] < edges[j, k - 1])
    with pytest.raises(ConfigError, match="lower < upper"):
        bin_edges(np.array([[1.0, 1.0]]), 4)


@pytest.mark.parametrize("n_bins", [2, 3, 7, 32, 255])
def test_fast_binning_equals_exact_search(n_bins):
    rng = np.random.default_rng(n_bins)
    edges = bin_edges(np.array([[-1, 1], [0, 10], [-3.3, 7.1], [1e-3, 2e-3]]), n_bins)
    at = edges.T
    X = np.concatenate([rng.uniform(-5, 12, (5000, 4)), at, np.nextafter(at, -np.inf),
                        np.nextafter(at, np.inf)])
    want = np.stack([np.searchsorted(edges[j], X[:, j], side="right") for j in range(4)], 1)
    np.testing.assert_array_equal(bin_features(X, edges), want)


def test_neighbouring_dataset_moves_each_release_by_at_most_delta():
    rng = np.random.default_rng(1)
    n, d, B, G, H = 300, 6, 8, 1.0, 0.25
    X = rng.uniform(-1, 1, (n, d))
    bins = bin_features(X, bin_edges(np.tile([-1.0, 1.0], (d, 1)), B))
    g, h = rng.normal(0, 3, n), rng.uniform(-1, 2, n)  # clipping must bound them
    g[0], h[0] = 50.0, 9.0  # the removed example is an extreme one
    full = SiloHistograms(None, bins, 0.0, B, G, H)
    less = SiloHistograms(None, bins[1:], 0.0, B, G, H)
    feats = np.arange(d)
    full.start_tree(g, h, np.ones(n, dtype=bool), feats)
    less.start_tree(g[1:], h[1:], np.ones(n - 1, dtype=bool), feats)
    zero = np.random.default_rng(0)
    delta = np.sqrt(d * (G ** 2 + H ** 2))
    for level in range(3):
        a = np.concatenate([x.ravel() for x in full.level_histograms(level, zero)])
        b = np.concatenate([x.ravel() for x in less.level_histograms(level, zero)])
        moved = np.linalg.norm(a - b)
        assert moved <= delta + 1e-9
        np.testing.assert_allclose(moved, delta)  # the bound is attained: Δ is tight
        split_f = rng.integers(0, d, 2 ** level)
        split_k = rng.integers(1, B, 2 ** level)
        full.descend(split_f, split_k)
        less.descend(split_f, split_k)
    a = np.concatenate(full.leaf_sums(3, zero))
    b = np.concatenate(less.leaf_sums(3, zero))
    assert np.linalg.norm(a - b) <= np.sqrt(G ** 2 + H ** 2) + 1e-9


@pytest.mark.parametrize(("q", "splits"), [(1.0, "histogram"), (0.4, "histogram"),
                                           (1.0, "random")])
def test_ledger_equals_independent_composition(q, splits):
    fed = _xor_fed(n=300, k=2)
    T, D = 4, 2
    res = train_dp_gbdt(fed, trees=T, depth=D, subsample=q, splits=splits, seed=3)
    R = D + 1 if splits == "histogram" else 1
    for rep, led in zip(res.report, res.ledgers, strict=True):
        sigma = rep["sigma"]
        # independent: every executed release, as dp_accounting sees it
        if q == 1.0:
            executed = [dpa.GaussianDpEvent(sigma)] * (T * R)
        else:
            executed = [dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma / np.sqrt(R)))] * T
        indep = dpa.ComposedDpEvent(executed)
        assert led.spent_counts() == Counter(events.flatten(indep))
        assert len(led.entries) == (T * R if q == 1.0 else T)
        acc = dpa.rdp.RdpAccountant()
        acc.compose(indep)
        eps_indep = acc.get_epsilon(led.target.delta)
        eps_ledger = led.epsilon("rdp")
        # silofl's RDP uses a finer order grid: never looser than dp_accounting's default
        assert eps_ledger <= eps_indep * (1 + 1e-9)
        assert eps_ledger >= 0.9 * eps_indep
        assert rep["epsilon"] <= led.target.epsilon
        assert rep["epsilon"] >= 0.95 * led.target.epsilon  # calibrated, not over-noised


def test_noise_off_matches_non_private_gbdt_and_large_eps_approaches_it():
    xgb = pytest.importorskip("xgboost")
    from sklearn.metrics import roc_auc_score
    fed = _xor_fed(n=2000)
    X, y = _pooled_test(fed)
    plain = train_dp_gbdt(fed, trees=20, depth=3, n_bins=16, private=False, **HIST)
    auc_plain = roc_auc_score(y, plain.ensemble.predict(X))
    Xa = np.vstack([s.X_train for s in fed.silos])
    ya = np.concatenate([s.y_train for s in fed.silos])
    ref = xgb.train({"objective": "binary:logistic", "max_depth": 3, "eta": 0.3,
                     "max_bin": 16}, xgb.DMatrix(Xa, label=ya), 20)
    auc_xgb = roc_auc_score(y, ref.predict(xgb.DMatrix(X)))
    assert auc_plain > 0.95 and abs(auc_plain - auc_xgb) < 0.03
    huge = train_dp_gbdt(_xor_fed(n=2000, eps=100.0), trees=20, depth=3, n_bins=16, **HIST,
                         noise="seeded")
    auc_huge = roc_auc_score(y, huge.ensemble.predict(X))
    assert auc_huge > auc_plain - 0.05
    assert plain.ledgers == [None, None, None]


def test_budget_refused_all_or_none_before_reading():
    fed = _xor_fed(n=200, k=2)
    leds = [Ledger(s.name, s.target) for s in fed.silos]
    leds[1].charge(dpa.GaussianDpEvent(6.0), label="earlier")  # silo 1 already spent ε ≈ 0.8
    with pytest.raises(BudgetExceeded):
        train_dp_gbdt(fed, trees=3, depth=2, ledgers=leds)
    assert leds[0].entries == [] and len(leds[1].entries) == 1


def test_bad_input_is_refused_specifically():
    fed = _xor_fed(n=50, k=2)
    with pytest.raises(ConfigError, match="unit"):
        train_dp_gbdt(fed, unit="person")
    with pytest.raises(ConfigError, match="subsample"):
        train_dp_gbdt(fed, subsample=0.0)
    with pytest.raises(ConfigError, match="bounds"):
        train_dp_gbdt(fed, bounds=np.zeros((3, 2)))
    with pytest.raises(ConfigError, match="splits"):
        train_dp_gbdt(fed, splits="best")


def test_best_splits_finds_the_planted_split():
    hg = np.zeros((1, 2, 4))
    hh = np.full((1, 2, 4), 10.0)
    hg[0, 1] = [-20, -20, 20, 20]  # feature 1 separates at bin 2
    j, k, gain = best_splits(hg, hh, 1.0, 1.0)
    assert (j[0], k[0]) == (1, 2) and gain[0] > 0
    j, k, gain = best_splits(np.zeros((1, 2, 4)), hh, 1.0, 1.0)
    assert k[0] == 4 and gain[0] == -np.inf  # no useful split: pass through


def test_heart_at_eps_1_reports_auc_against_baselines(capsys):
    xgb = pytest.importorskip("xgboost")
    from sklearn.metrics import roc_auc_score
    fed = silofl.load_heart_disease(seed=0).with_targets(silofl.PrivacyTarget(1.0, 1e-4))
    X, y = _pooled_test(fed)
    aucs = {}
    # settings from a small grid on split seed 0 (so this split's figures are optimistic;
    # on split seeds 1-3 the random-split model gave 0.81, 0.85, 0.87 vs DP-LR 0.85, 0.89, 0.95)
    for splits, T, D, B, lam, cs in (("random", 20, 3, 8, 30.0, 0.1),
                                     ("histogram", 20, 1, 4, 10.0, 0.3)):
        res = train_dp_gbdt(fed, trees=T, depth=D, n_bins=B, splits=splits, colsample=cs,
                            lam=lam, lr=0.5, seed=0)
        assert all(r["epsilon"] <= 1.0 for r in res.report)
        aucs[f"dp_gbdt_{splits}"] = roc_auc_score(y, res.ensemble.predict(X))
    model = silofl.make_model("logistic", fed.dim)
    cfg = silofl.TrainingConfig(rounds=30, batch_size=16, lr=0.03, clip=1.0)
    lr_run = silofl.simulate(fed, model, silofl.make_algorithm("fedavg"), cfg)
    aucs["dp_logreg"] = roc_auc_score(y, X @ lr_run.shared[:-1] + lr_run.shared[-1])
    Xa = np.vstack([s.X_train for s in fed.silos])
    ya = np.concatenate([s.y_train for s in fed.silos])
    ref = xgb.train({"objective": "binary:logistic", "max_depth": 3, "eta": 0.3},
                    xgb.DMatrix(Xa, label=ya), 20)
    aucs["xgboost_nonprivate"] = roc_auc_score(y, ref.predict(xgb.DMatrix(X)))
    with capsys.disabled():
        print("\nheart ε=1 test AUC:", {k: round(v, 3) for k, v in aucs.items()})
    assert all(0.5 < v <= 1.0 for v in aucs.values())


def test_level_histograms_equal_brute_force_sums_with_sibling_subtraction():
    rng = np.random.default_rng(5)
    n, d, B = 500, 4, 6
    bins = rng.integers(0, B, (n, d)).astype(np.int32)
    g, h = rng.uniform(-1, 1, n), rng.uniform(0, 0.25, n)
    rows = rng.random(n) < 0.7
    feats = np.array([0, 2, 3])
    hist = SiloHistograms(None, bins, 0.0, B, 1.0, 0.25)
    hist.start_tree(g, h, rows, feats)
    zero = np.random.default_rng(0)
    for level in range(4):
        slots = 2 ** level
        want_g, want_h = np.zeros((slots, feats.size, B)), np.zeros((slots, feats.size, B))
        for i in np.flatnonzero(hist.pos >= 0):
            for a, j in enumerate(feats):
                want_g[hist.pos[i], a, bins[i, j]] += g[i]
                want_h[hist.pos[i], a, bins[i, j]] += h[i]
        got_g, got_h = hist.level_histograms(level, zero)
        np.testing.assert_allclose(got_g, want_g, atol=1e-9)
        np.testing.assert_allclose(got_h, want_h, atol=1e-9)
        k = rng.integers(1, B + 1, slots)  # B: pass-through (all rows left)
        hist.descend(rng.choice(feats, slots), k)


def test_personal_trees_are_charged_and_fit_each_silo():
    from sklearn.metrics import roc_auc_score
    rng = np.random.default_rng(2)
    silos = []
    for k in range(2):  # opposite labels: the shared model cannot fit both silos
        X, Xt = rng.uniform(-1, 1, (3000, 3)), rng.uniform(-1, 1, (3000, 3))
        flip = (lambda v: 1 - v) if k else (lambda v: v)
        silos.append(Silo(f"s{k}", X, flip((X[:, 0] > 0).astype(int)), Xt,
                          flip((Xt[:, 0] > 0).astype(int)), silofl.PrivacyTarget(5.0, 1e-5)))
    fed = Federation(silos, ["a", "b", "c"], "binary", 2)
    T, L, D = 3, 5, 2
    res = train_dp_gbdt(fed, trees=T, depth=D, local_trees=L, lr=0.5, seed=1, **HIST)
    assert res.personal is not None
    for k, (own, led) in enumerate(zip(res.personal, res.ledgers, strict=True)):
        assert len(own.trees) == T + L and own.trees[:T] == res.ensemble.trees
        assert sum(led.spent_counts().values()) == (T + L) * (D + 1)
        assert res.report[k]["epsilon"] <= 5.0
        auc = roc_auc_score(fed.silos[k].y_test, own.predict(fed.silos[k].X_test))
        assert auc > 0.9
    with pytest.raises(ConfigError, match="local_trees"):
        train_dp_gbdt(fed, local_trees=-1)


def test_regression_non_private_fits_and_private_spends_its_target():
    fed = _xor_fed(n=2000, task="regression")
    X, y = _pooled_test(fed)
    plain = train_dp_gbdt(fed, trees=30, depth=3, n_bins=32, clip_g=3.0, private=False,
                          **HIST)
    r2 = 1 - np.mean((plain.ensemble.predict(X) - y) ** 2) / np.var(y)
    assert r2 > 0.9
    dp = train_dp_gbdt(_xor_fed(n=2000, task="regression", eps=8.0), trees=30, depth=3,
                       n_bins=32, clip_g=3.0, noise="seeded", **HIST)  # a threshold: seeded
    r2_dp = 1 - np.mean((dp.ensemble.predict(X) - y) ** 2) / np.var(y)
    assert r2_dp > 0.5 and all(r["epsilon"] <= 8.0 for r in dp.report)


def test_secure_noise_is_the_csprng_and_seeded_noise_reproduces():
    # noise = "secure": each silo's stream is silofl.privacy.randomness's CSPRNG (nothing
    # follows from the seed); "seeded" reproduces exactly; both charge the same events
    from silofl.algorithms.gbdt_programs import NoiseStream, noise_stream
    stream = noise_stream("secure", np.random.default_rng(0))
    assert isinstance(stream, NoiseStream) and stream.r.secure is True
    fed = _xor_fed(n=300)
    kw = {"trees": 3, "depth": 2, "seed": 1, **HIST}
    runs = {n: [train_dp_gbdt(_xor_fed(n=300), noise=n, **kw) for _ in range(2)]
            for n in ("seeded", "secure")}

    def leaves(res):  # margins on fixed rows (the trees' shapes may differ)
        return res.ensemble.predict_margin(_pooled_test(fed)[0])

    a, b = runs["seeded"]
    np.testing.assert_array_equal(leaves(a), leaves(b))
    c, d = runs["secure"]
    assert not np.allclose(leaves(c), leaves(d)) and not np.allclose(leaves(c), leaves(a))
    assert [led.spent_counts() for led in a.ledgers] == [led.spent_counts() for led in c.ledgers]
    with pytest.raises(ConfigError, match="noise"):
        train_dp_gbdt(fed, noise="urandom", **kw)
