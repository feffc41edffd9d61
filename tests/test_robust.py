"""Byzantine-robust aggregation (silofl.algorithms.robust): each rule's math, screening of
non-finite/wrong-shaped updates, robustness under attack, and config validation."""

from __future__ import annotations

import numpy as np
import pytest
import tomli_w
from typer.testing import CliRunner

from silofl import data as D
from silofl.algorithms import Attack, Attacked, make_algorithm
from silofl.algorithms.base import ServerState
from silofl.algorithms.robust import (
    RULES,
    Aggregator,
    centered_clipping,
    coordinate_median,
    krum,
    krum_scores,
    multi_krum,
    screen,
    trimmed_mean,
)
from silofl.algorithms.weight_erosion import ErosionServer, ErosionUpdate
from silofl.cli import app
from silofl.config import config_from_dict
from silofl.errors import ConfigError
from silofl.experiments.build import build_algorithms
from silofl.models import make_model
from silofl.runtime.plan import TrainingConfig
from silofl.runtime.simulator import simulate

# --- each rule's math ----------------------------------------------------------------------

def test_coordinate_median():
    U = np.array([[1.0, 10.0], [2.0, 20.0], [100.0, -5.0]])
    np.testing.assert_allclose(coordinate_median(U), [2.0, 10.0])


def test_trimmed_mean_drops_the_extremes_per_coordinate():
    U = np.array([[1.0, -50.0], [2.0, 0.0], [3.0, 1.0], [4.0, 2.0], [100.0, 3.0]])
    np.testing.assert_allclose(trimmed_mean(U, 0.2), [3.0, 1.0])  # ⌊0.2·5⌋ = 1 per end
    np.testing.assert_allclose(trimmed_mean(U, 0.0), U.mean(0))
    np.testing.assert_allclose(trimmed_mean(U, 0.19), U.mean(0))  # ⌊0.95⌋ = 0


def test_krum_picks_the_update_closest_to_its_neighbours():
    U = np.array([[0.0], [1.0], [1.5], [2.0], [50.0]])
    # f = 1 → K − f − 2 = 2 neighbours: 0→3.25, 1→1.25, 1.5→0.5, 2→1.25, 50→2304.25+2256.25
    np.testing.assert_allclose(krum_scores(U, 1)[:4], [3.25, 1.25, 0.5, 1.25])
    np.testing.assert_allclose(krum(U, 1), [1.5])
    # multi-Krum averages the K − f = 4 best: everything but the outlier
    np.testing.assert_allclose(multi_krum(U, 1), [(0 + 1 + 1.5 + 2) / 4])
    np.testing.assert_allclose(multi_krum(U, 1, m=3), [(1 + 1.5 + 2) / 3])


def test_centered_clipping_bounds_an_outliers_influence_by_tau():
    honest = np.zeros((4, 3))
    for big in (1e3, 1e9):
        U = np.vstack([honest, [big, 0.0, 0.0]])
        v = centered_clipping(U, np.zeros(3), tau=1.0, iters=3)
        # one outlier of five moves the centre by at most τ/K per iteration
        assert np.linalg.norm(v) <= 3 * 1.0 / 5 + 1e-12
    v_small = centered_clipping(np.vstack([honest, [1e3, 0, 0]]), np.zeros(3), 1.0)
    np.testing.assert_allclose(v, v_small)  # the outlier's size does not matter
    # updates within τ of the centre are not clipped: one iteration is the mean
    U = np.array([[0.1, 0.0], [0.0, 0.2], [0.3, 0.1]])
    np.testing.assert_allclose(centered_clipping(U, np.zeros(2), 1.0, iters=1), U.mean(0))


# --- screening: non-finite and wrong-shaped updates never reach the model -------------------

def test_screen_drops_nonfinite_and_wrong_shaped_rows():
    rows = [np.array([1.0, 2.0]), np.array([np.nan, 0.0]), np.array([np.inf, 1.0]),
            np.array([1.0, 2.0, 3.0]), "junk", np.array([3.0, 4.0])]
    keep, U = screen(rows, 2)
    assert keep.tolist() == [True, False, False, False, False, True]
    assert np.isfinite(U).all()
    keep, _ = screen(np.ones((3, 4)), 2)  # a whole update of the wrong width
    assert not keep.any()


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("method", ["fedavg", "mrmtl"])
def test_bad_updates_never_reach_the_model(method, rule):
    good = np.array([[1.0, 1.0], [1.2, 0.8], [0.9, 1.1], [1.1, 0.9], [1.0, 1.0]])
    bad = [*good[:3], np.array([np.nan, 1.0]), np.array([1.0, 2.0, 3.0]),
           np.array([np.inf, -np.inf]), *good[3:]]
    alg = make_algorithm(method, aggregation=rule, clip_radius=10.0)
    out = alg.server_step(ServerState(np.zeros(2)), bad, np.ones(len(bad)))
    assert np.isfinite(out.params).all()
    ref = make_algorithm(method, aggregation=rule, clip_radius=10.0)
    np.testing.assert_allclose(out.params,
                               ref.server_step(ServerState(np.zeros(2)), good, np.ones(5)).params)
    assert alg.aggregation.rejected == 3 and alg.describe()["aggregation"]["rejected"] == 3


def test_all_rejected_leaves_the_model_unchanged():
    alg = make_algorithm("fedavg")
    out = alg.server_step(ServerState(np.array([1.0, 2.0])), np.full((3, 2), np.nan), np.ones(3))
    np.testing.assert_allclose(out.params, [1.0, 2.0])


@pytest.mark.parametrize("rule", ["mean", "median"])
def test_weight_erosion_drops_bad_gradients(rule):
    alg = make_algorithm("weight_erosion", we_user=0, we_p_d=0.1, aggregation=rule)
    alg.check_plan(4, 5, None)
    g = np.array([[1.0, 0.0], [1.0, 0.1], [np.nan, 0.0], [0.9, 0.0]])
    srv = ErosionServer(np.zeros(2), np.ones(4))
    out = alg.server_step(srv, ErosionUpdate(g, np.zeros(4), 0.5), None)
    assert np.isfinite(out.params).all() and np.isfinite(out.alpha).all()
    assert out.alpha[2] == 1.0 and alg.aggregation.rejected == 1  # untouched, counted
    # the user's gradient rejected: no reference, the round changes nothing
    g[0] = np.inf
    out2 = alg.server_step(out, ErosionUpdate(g, np.zeros(4), 0.5), None)
    np.testing.assert_allclose(out2.params, out.params)
    np.testing.assert_allclose(out2.alpha, out.alpha)


# --- under attack ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vehicle():
    fed = D.vehicle_like()
    return fed, make_model("logistic", fed.dim, 2)


def _pooled(vehicle, rule, attack=None, method="fedavg"):
    fed, model = vehicle
    cfg = TrainingConfig(rounds=15, batch_size=32, lr=0.1, private=False, seed=0, eval_every=15)
    kw = dict(aggregation=rule, attackers=0 if rule == "mean" else 5, trim_fraction=0.25)
    alg = make_algorithm(method, **kw)
    if attack is not None:
        alg = Attacked(alg, attack)
    return simulate(fed, model, alg, cfg)


def test_robust_rules_withstand_scaled_attackers(vehicle):
    """5 of 23 silos (22%) send −5× their update: the mean goes the wrong way, the median and
    the trimmed mean stay near the honest run."""
    attack = Attack("scaled", count=5, scale=5.0, seed=0)
    honest = _pooled(vehicle, "mean").final_pooled
    attacked_mean = _pooled(vehicle, "mean", attack).final_pooled
    assert attacked_mean < honest - 0.2
    for rule in ("median", "trimmed_mean"):
        res = _pooled(vehicle, rule, attack)
        assert res.final_pooled > honest - 0.03, (rule, res.final_pooled, honest)
        assert res.method["attack"]["kind"] == "scaled"


def test_nan_attackers_are_rejected_in_a_run(vehicle):
    res = _pooled(vehicle, "mean", Attack("nan", count=5))
    assert np.isfinite(res.params).all()
    assert res.method["aggregation"]["rejected"] == 5 * 15
    assert res.final_pooled > _pooled(vehicle, "mean").final_pooled - 0.03


def test_attacks_replace_only_the_chosen_rows():
    U = np.arange(12, dtype=float).reshape(4, 3) + 1
    a = Attack("little", silos=(3,), z=1.0)
    out = a.apply(U)
    np.testing.assert_allclose(out[:3], U[:3])
    np.testing.assert_allclose(out[3], U[:3].mean(0) - U[:3].std(0))
    np.testing.assert_allclose(Attack("scaled", silos=(0,), scale=2).apply(U)[0], -2 * U[0])
    np.testing.assert_allclose(Attack("sign_flip", silos=(1,)).apply(U)[1], -U[1])
    assert np.isnan(Attack("nan", silos=(2,)).apply(U)[2]).all()
    g = Attack("gaussian", count=2, seed=1).apply(U, round=3)
    assert (np.all(g != U, axis=1)).sum() == 2
    with pytest.raises(ValueError, match="unknown attack"):
        Attack("flip")


# --- configuration -------------------------------------------------------------------------

def _algs(**training):
    return build_algorithms(config_from_dict({"training": {"methods": ["fedavg"], **training}}))


def test_config_builds_robust_algorithms():
    alg, = _algs(aggregation="trimmed_mean", attackers=2, trim_fraction=0.25)
    assert alg.aggregation == Aggregator("trimmed_mean", 2, 0.25)
    alg.check_plan(8, 5, None)  # ⌊0.25·8⌋ = 2 ≥ 2 attackers


@pytest.mark.parametrize("training, words", [
    ({"aggregation": "medain"}, ["unknown aggregation 'medain'", "Did you mean 'median'?"]),
    ({"trim_fraction": 0.5}, ["trim_fraction must be in [0, 0.5)"]),
    ({"trim_fraction": -0.1}, ["trim_fraction must be in [0, 0.5)"]),
    ({"clip_radius": 0.0}, ["clip_radius must be a positive number"]),
    ({"attackers": -1}, ["attackers must be an integer >= 0"]),
    ({"attackers": 1}, ["the mean tolerates no attacker"]),
    ({"aggregation": "median", "methods": ["ditto"]}, ["applies to fedavg, mrmtl"]),
])
def test_bad_settings_are_config_errors(training, words):
    with pytest.raises(ConfigError) as e:
        _algs(**training)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("rule, attackers, k, words", [
    ("krum", 3, 8, "needs K > 2·attackers + 2"),
    ("multi_krum", 1, 3, "needs K > 2·attackers + 2"),
    ("median", 4, 8, "needs attackers < K/2"),
    ("centered_clipping", 4, 8, "needs attackers < K/2"),
    ("trimmed_mean", 2, 8, "tolerates at most 0 attackers"),
])
def test_too_many_attackers_names_the_limit(rule, attackers, k, words):
    alg, = _algs(aggregation=rule, attackers=attackers, trim_fraction=0.1)
    with pytest.raises(ConfigError, match="cannot tolerate") as e:
        alg.check_plan(k, 5, None)
    assert words in str(e.value)


@pytest.mark.parametrize("training, words", [
    ({"aggregation": "krum", "attackers": 3}, "needs K > 2·attackers + 2"),
    ({"aggregation": "trimmed", "attackers": 0}, "Did you mean 'trimmed_mean'?"),
    ({"aggregation": "trimmed_mean", "trim_fraction": 0.6}, "trim_fraction must be in"),
])
def test_cli_run_refuses_bad_aggregation(tmp_path, monkeypatch, training, words):
    monkeypatch.chdir(tmp_path)
    cfg = {"data": {"source": "synthetic", "generator": "linear"},  # 8 silos
           "model": {"name": "linear"},
           "training": {"methods": ["fedavg"], "rounds": 2, **training}}
    (tmp_path / "c.toml").write_text(tomli_w.dumps(cfg))
    res = CliRunner().invoke(app, ["run", "--config", "c.toml", "-q"])
    assert res.exit_code == 2, res.output
    assert words in " ".join(res.stderr.split())
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
