"""Weight Erosion (Algorithm 1 of the seed): a direct transcription on recorded gradients,
p_d = 0 as FedAvg on single gradients, the ledger against the data actually read, an
outlier silo eroding fastest, and refusal of bad settings (Python and CLI)."""

from __future__ import annotations

import dataclasses
import logging
import math

import dp_accounting as dpa
import numpy as np
import pytest
import tomli_w
from dp_accounting import rdp
from typer.testing import CliRunner

from silofl.algorithms import ALGORITHMS, METHODS, WeightErosion, make_algorithm
from silofl.cli import app
from silofl.data import linear_silos
from silofl.data.federation import PrivacyTarget
from silofl.errors import ConfigError
from silofl.experiments.build import build_algorithms
from silofl.experiments.config import config_from_dict
from silofl.models import make_model
from silofl.privacy.accounting import RDP_ORDERS
from silofl.runtime.plan import TrainingConfig, plan_silos
from silofl.runtime.simulator import simulate
from silofl.training.trainer import LocalTrainer, SiloArrays

logging.getLogger("absl").setLevel(logging.ERROR)

SIZES = [30, 40, 60]
DELTA = 1e-4


def _fed(private=True, eps=2.0, sizes=SIZES, seed=0):
    fed = linear_silos(num_silos=len(sizes), sizes=sizes, dim=3, task="binary", seed=seed)
    return fed.with_targets(PrivacyTarget(eps, DELTA)) if private else fed


def _cfg(private=True, **kw):
    base = dict(rounds=12, batch_size=10, lr=0.3, private=private, noise="seeded", seed=5)
    base.update(kw)
    return TrainingConfig(**base)


@pytest.fixture
def recorded(monkeypatch):
    """Every gradient matrix (K, P) LocalTrainer.gradients returned, in call order."""
    out: list[np.ndarray] = []
    orig = LocalTrainer.gradients

    def spy(self, W, round=0, label="dpsgd"):
        g = orig(self, W, round=round, label=label)
        out.append(np.array(g, copy=True))
        return g

    monkeypatch.setattr(LocalTrainer, "gradients", spy)
    return out


def _servers(fed, alg, cfg):
    """Run and return the server state after every round."""
    states = []
    simulate(fed, make_model("logistic", 3), alg, cfg,
             checkpoint=lambda s: states.append(s["server"]))
    return states


def _transcribe(grads, sizes, b, lr, w0, user, p_s, p_d):
    """Algorithm 1 written out scalar by scalar: α after each round and w after each."""
    K = len(sizes)
    alpha = [1.0] * K
    w = list(w0)
    alphas, ws = [], []
    for r, g in enumerate(grads, start=1):
        g0 = g[user]
        norm0 = math.sqrt(sum(v * v for v in g0))
        for i in range(K):  # the user first: its distance is 0
            d = math.sqrt(sum((a - c) ** 2 for a, c in zip(g[i], g0))) / norm0
            delta = (1 + p_s * math.floor((r - 1) * b / sizes[i])) * p_d * d
            alpha[i] = max(0.0, alpha[i] - delta)
        tot = sum(alpha)
        gbar = [sum(alpha[i] * g[i][j] for i in range(K)) / tot for j in range(len(w))]
        w = [wj - lr * gj for wj, gj in zip(w, gbar)]
        alphas.append(list(alpha))
        ws.append(list(w))
    return np.array(alphas), np.array(ws)


@pytest.mark.parametrize("private", [False, True])
def test_matches_a_transcription_of_algorithm_1(recorded, private):
    fed, cfg = _fed(private), _cfg(private)
    user, p_s, p_d = 1, 0.5, 0.02
    states = _servers(fed, WeightErosion(user, p_s=p_s, p_d=p_d), cfg)
    assert len(recorded) == cfg.rounds
    sizes = [s.n_train for s in fed.silos]
    w0 = make_model("logistic", 3).init_params()
    alphas, ws = _transcribe([g.tolist() for g in recorded], sizes, cfg.batch_size, cfg.lr,
                             w0.tolist(), user, p_s, p_d)
    # the size penalty is exercised: some silo's examples were used more than once
    assert (cfg.rounds - 1) * cfg.batch_size // min(sizes) >= 2
    got_alpha = np.array([s.alpha for s in states])
    np.testing.assert_allclose(got_alpha, alphas, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.array([s.params for s in states]), ws, rtol=1e-10,
                               atol=1e-12)
    assert np.all(got_alpha[:, user] == 1.0)  # the user's own distance is 0
    assert got_alpha[-1].min() < 1.0          # and the others did erode


def test_zero_distance_penalty_is_fedavg_on_single_gradients():
    fed, cfg = _fed(), _cfg(local_epochs=1e-3)  # FedAvg: one DP-SGD step per round
    model = make_model("logistic", 3)
    fa = simulate(fed, model, make_algorithm("fedavg", weighted=False), cfg)
    we = simulate(fed, model, make_algorithm("weight_erosion", we_user=0, we_p_d=0.0,
                                             we_p_s=3.0), cfg)
    assert [p.steps_per_pass for p in fa.plans] == [1] * len(SIZES)
    assert [p.noise_multiplier for p in fa.plans] == [p.noise_multiplier for p in we.plans]
    np.testing.assert_allclose(we.shared, fa.shared, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(we.params, fa.params, rtol=1e-10, atol=1e-12)


def test_ledger_counts_exactly_the_gradients_computed(monkeypatch):
    reads: list[np.ndarray] = []
    orig = SiloArrays.gather

    def counting(self, silos, idx):
        reads.append(np.array(silos, copy=True))
        return orig(self, silos, idx)

    monkeypatch.setattr(SiloArrays, "gather", counting)
    fed, cfg = _fed(), _cfg(local_epochs=3.0)  # ignored: one gradient per round
    res = simulate(fed, make_model("logistic", 3),
                   make_algorithm("weight_erosion", we_user="silo-02"), cfg)
    touched = np.zeros(fed.num_silos, dtype=int)
    for silos in reads:
        np.add.at(touched, silos, 1)
    assert touched.tolist() == [cfg.rounds] * fed.num_silos
    for k, s in enumerate(fed.silos):
        plan = res.plans[k]
        assert plan.steps_per_pass == 1
        step = dpa.PoissonSampledDpEvent(cfg.batch_size / s.n_train,
                                         dpa.GaussianDpEvent(plan.noise_multiplier))
        assert dict(res.ledgers[k].spent_counts()) == {step: int(touched[k])}
        acc = rdp.RdpAccountant(orders=list(RDP_ORDERS))
        acc.compose(dpa.SelfComposedDpEvent(step, int(touched[k])))
        assert res.ledgers[k].epsilon("rdp") == pytest.approx(acc.get_epsilon(DELTA),
                                                              rel=1e-9)
        rep = res.privacy()[k]
        assert rep["within_target"] is True and 0.98 * 2.0 <= rep["epsilon_pld"] <= 2.0


def test_silo_from_another_distribution_erodes_fastest():
    fed = linear_silos(num_silos=4, sizes=[200] * 4, dim=4, task="binary",
                       heterogeneity=0.0, seed=1)
    odd = fed.silos[3]  # same features, flipped labels
    fed = dataclasses.replace(fed, silos=fed.silos[:3] + [dataclasses.replace(
        odd, y_train=1 - odd.y_train, y_test=1 - odd.y_test)])
    fed = fed.with_targets(PrivacyTarget(2.0, DELTA))
    states = []
    simulate(fed, make_model("logistic", 4), make_algorithm(
        "weight_erosion", we_user="silo-00", we_p_d=0.02, we_p_s=0.0),
        TrainingConfig(rounds=30, batch_size=32, lr=0.5, noise="seeded", seed=2),
        checkpoint=lambda s: states.append(s["server"].alpha.copy()))
    A = np.array(states)
    assert np.all(A[:, 0] == 1.0)
    assert np.all(A[:, 3] <= A[:, 1:3].min(1))   # lowest weight in every round
    assert A[-1, 3] == 0.0 and A[-1, 1:3].min() > 0.1


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="we_p_d"):
        make_algorithm("weight_erosion", we_user=0, we_p_d=-0.1)
    with pytest.raises(ConfigError, match="we_p_s"):
        make_algorithm("weight_erosion", we_user=0, we_p_s=-1.0)
    with pytest.raises(ConfigError, match="we_p_s"):  # validated whichever method runs
        make_algorithm("fedavg", we_p_s=float("nan"))
    with pytest.raises(ConfigError, match="user"):
        make_algorithm("weight_erosion")
    with pytest.raises(ConfigError, match="user"):
        make_algorithm("weight_erosion", we_user=-1)
    fed, cfg = _fed(), _cfg()
    with pytest.raises(ConfigError, match="'nobody' is not a silo"):
        plan_silos(fed, make_algorithm("weight_erosion", we_user="nobody"), cfg)
    with pytest.raises(ConfigError, match="index 3 is not a silo"):
        plan_silos(fed, make_algorithm("weight_erosion", we_user=3), cfg)
    assert "weight_erosion" in METHODS and ALGORITHMS["weight_erosion"] is WeightErosion


def test_config_keys_reach_the_algorithm():
    cfg = config_from_dict({"training": {"methods": ["weight_erosion"], "we_user": "b",
                                         "we_p_s": 0.5, "we_p_d": 0.1}})
    (alg,) = build_algorithms(cfg)
    assert (alg.user, alg.p_s, alg.p_d) == ("b", 0.5, 0.1)
    with pytest.raises(ConfigError, match="must be of type str"):
        config_from_dict({"training": {"we_user": 0}})


def _write(tmp_path, **training):
    raw = {"data": {"source": "synthetic", "generator": "linear",
                    "options": {"num_silos": 3, "sizes": SIZES, "dim": 3, "task": "binary"}},
           "training": {"methods": ["weight_erosion"], "rounds": 5, "batch_size": 8,
                        "we_user": "silo-01", **training},
           "privacy": {"epsilon": 2.0, "delta": DELTA},
           "output": {"dir": str(tmp_path / "runs")}}
    p = tmp_path / "we.toml"
    p.write_text(tomli_w.dumps(raw))
    return p


def test_cli_runs_weight_erosion(tmp_path):
    res = CliRunner().invoke(app, ["run", "--config", str(_write(tmp_path)), "-q"])
    assert res.exit_code == 0, res.output
    assert any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("training, words", [
    ({"we_user": "nobody"}, "not a silo"),
    ({"we_user": ""}, "we_user"),
    ({"we_p_d": -0.5}, "we_p_d"),
    ({"we_p_s": -2.0}, "we_p_s"),
])
def test_cli_refuses_bad_settings(tmp_path, training, words):
    res = CliRunner().invoke(app, ["run", "--config", str(_write(tmp_path, **training)),
                                   "-q"])
    assert res.exit_code == 2, res.output
    assert words in " ".join(res.output.split())
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(p.is_dir() for p in runs.iterdir())
