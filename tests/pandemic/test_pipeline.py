"""The pandemic pipeline end to end: regions → features → MR-MTL with node-level DP →
predictions, its ledgers, its CLI, and its bad-input errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from silofl.cli import app
from silofl.errors import BudgetExceeded, ConfigError
from silofl.pandemic import pipeline as P
from silofl.pandemic import read_dataset
from silofl.pandemic.challenge import fit, predict_to_csv
from silofl.pandemic.charges import round_event
from silofl.pandemic.features import NeighbourhoodFeatures
from silofl.pandemic.inputs import SUMMARY_FEATURES
from silofl.pandemic.regions import build_regions
from silofl.privacy.node_level import node_epsilon, node_steps

runner = CliRunner()


@pytest.fixture(scope="module")
def data(small_outbreak):
    return read_dataset(small_outbreak, with_target=True)


def _count_gathers(monkeypatch, unlabelled: dict | None = None):
    """Count labelled gathers (DP-SGD steps) per feature object; unlabelled ones (the
    input-standardization pass reads features, never labels) go to `unlabelled`."""
    seen: dict[int, int] = {}
    orig = NeighbourhoodFeatures.gather

    def counting(self, persons, window_end, *, labels=True):
        target = seen if labels or unlabelled is None else unlabelled
        target[id(self)] = target.get(id(self), 0) + 1
        return orig(self, persons, window_end, labels=labels)
    monkeypatch.setattr(NeighbourhoodFeatures, "gather", counting)
    return seen


@pytest.mark.parametrize("preprocessing", ["declared", "uncharged"])
def test_federated_training_charges_each_region_for_the_steps_it_ran(data, monkeypatch,
                                                                      preprocessing):
    unlabelled: dict[int, int] = {}
    seen = _count_gathers(monkeypatch, unlabelled)
    cfg = P.PandemicConfig(rounds=2, batch_size=64, epsilon=8.0, preprocessing=preprocessing)
    pm = P.train(data, cfg)
    assert len(pm.regions) == data.num_regions and pm.weights.shape[0] == data.num_regions
    counted = sorted(seen.values())
    sizes = np.bincount(data.region[data.region >= 0])
    expected = sorted(2 * node_steps(int(n), 64, 1.0) for n in sizes)
    assert counted == expected  # one labelled gather per DP-SGD step, per region
    # declared constants read nothing; uncharged ones make one standardization pass
    want = [] if preprocessing == "declared" else [1] * data.num_regions
    assert sorted(unlabelled.values()) == want
    for p, _n in zip(pm.privacy, sizes):
        assert p["steps"] in expected and p["epsilon_spent"] <= 8.0 + 1e-9
        # the ledger's ε is the theorem's ε (node+edges: 2S − 1 examples) for the steps run
        assert p["adjacency"] == "node+edges" and p["affected_examples"] == 2 * p["S"] - 1
        assert p["epsilon_spent"] == pytest.approx(node_epsilon(
            p["n"], p["S"], 64, p["noise_multiplier"], p["steps"], p["delta"],
            adjacency="node+edges"))
        assert p["epsilon_spent"] > 0.97 * 8.0  # calibration leaves little budget unused


def test_centralized_mode_is_one_silo_and_predicts_everyone(data):
    pm = P.train(data, P.PandemicConfig(federated=False, rounds=1, batch_size=128,
                                        private=False))
    assert pm.regions == ["all"]
    scores = P.predict(data, pm)
    assert scores.shape == (data.num_persons,) and np.all(np.isfinite(scores))
    assert np.all((scores >= 0) & (scores <= 1)) and scores.std() > 0
    ev = P.evaluate(data, scores)
    assert 0 <= ev["auprc"] <= 1 and ev["positive_rate"] == pytest.approx(data.target.mean())


def test_budget_too_small_is_refused_before_data_is_read(data, monkeypatch):
    seen = _count_gathers(monkeypatch)
    # σ is calibrated for 1 round; asking a ledger to run 2 rounds' charges must fail early
    cfg = P.PandemicConfig(rounds=1, batch_size=64, epsilon=2.0)
    regions = build_regions(data, cfg)
    P.plan_regions(regions, cfg)
    r = regions[0]
    r.ledger.charge(round_event(r, cfg))
    with pytest.raises(BudgetExceeded):
        r.ledger.charge(round_event(r, cfg))
    assert seen == {}


def test_bad_inputs(data):
    with pytest.raises(ConfigError, match="larger than"):
        P.train(data, P.PandemicConfig(batch_size=10**6))
    with pytest.raises(ConfigError, match="S must be a positive"):
        P.train(data, P.PandemicConfig(S=0))
    with pytest.raises(ConfigError, match="t_window"):
        P.train(data, P.PandemicConfig(t_window=100))
    with pytest.raises(ConfigError, match="pooling"):
        P.train(data, P.PandemicConfig(pooling="max"))
    with pytest.raises(ConfigError, match="prior_weight"):
        P.train(data, P.PandemicConfig(prior_weight=float("nan")))


def test_initial_weights_are_the_fixed_prior():
    """The start is a fixed public prior on the summary inputs only, never data."""
    model = P.FocalLoss(len(SUMMARY_FEATURES))
    w = P.initial_weights(model, P.PandemicConfig(prior_weight=0.25, bias_init=-4))
    assert np.all(w[:-1] == 0.25) and w[-1] == -4
    w = P.initial_weights(P.FocalLoss(30), P.PandemicConfig(pooling="mean"))
    assert np.all(w[:-1] == 0) and w[-1] == -5


def test_cli_synth_train_predict(tmp_path):
    out = tmp_path / "outbreak"
    r = runner.invoke(app, ["pandemic", "synth", "--persons", "3000", "--regions", "3",
                            "--seed", "3", "--out", str(out)])
    assert r.exit_code == 0, r.output
    model = tmp_path / "model"
    store = tmp_path / "budget.sqlite"
    r = runner.invoke(app, ["pandemic", "train", "--data", str(out), "--model", str(model),
                            "--rounds", "1", "--batch", "64", "--epsilon", "6",
                            "--store", str(store)])
    assert r.exit_code == 0, r.output
    meta = json.loads((model / "model.json").read_text())
    assert all(p["epsilon_spent"] <= 6 for p in meta["privacy"])
    assert "node+edges" in r.output and "2S - 1" in r.output and "pruning" in r.output
    assert "secure" in r.output and str(store) in r.output.replace("\n", "")
    preds = tmp_path / "preds.csv"
    r = runner.invoke(app, ["pandemic", "predict", "--data", str(out), "--model", str(model),
                            "--out", str(preds)])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(preds)
    assert len(df) == 3000 and df["score"].between(0, 1).all()
    assert "auprc" in r.output
    # refusing to overwrite a different dataset
    r = runner.invoke(app, ["pandemic", "synth", "--persons", "3000", "--regions", "3",
                            "--seed", "4", "--out", str(out)])
    assert r.exit_code == 2 and "different" in r.output.lower()


def test_cli_account_node_level_matches_theorem():
    r = runner.invoke(app, ["account", "--node-level", "--n", "10000", "--batch", "512",
                            "--epochs", "2", "--sigma", "20", "--S", "20", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["steps"] == node_steps(10000, 512, 2)
    assert out["affected_node"] == 20 and out["affected_node_edges"] == 39
    assert out["epsilon_node_rdp"] == pytest.approx(
        node_epsilon(10000, 20, 512, 20.0, out["steps"], 1e-4))
    assert out["epsilon_node_edges_rdp"] == pytest.approx(
        node_epsilon(10000, 20, 512, 20.0, out["steps"], 1e-4, adjacency="node+edges"))
    assert out["epsilon_node_edges_rdp"] > out["epsilon_node_rdp"]
    r = runner.invoke(app, ["account", "--node-level", "--n", "10000", "--batch", "512",
                            "--steps", "40", "--epsilon", "3", "--S", "20", "--json"])
    out = json.loads(r.output)
    assert out["sigma_node_edges_rdp"] > out["sigma_node_rdp"]
    assert node_epsilon(10000, 20, 512, out["sigma_node_edges_rdp"], 40, 1e-4,
                        adjacency="node+edges") <= 3


def test_challenge_style_fit_and_predict(small_outbreak, tmp_path):
    d = small_outbreak
    paths = [d / f"va_{n}.csv" for n in ("person", "household", "residence_locations",
                                          "activity_locations", "activity_location_assignment",
                                          "population_network", "disease_outcome_training")]
    fit(*paths, tmp_path / "m", config=P.PandemicConfig(federated=False, rounds=1,
                                                          batch_size=128, epsilon=8.0))
    fmt = tmp_path / "format.csv"
    pd.DataFrame({"pid": pd.read_csv(paths[0])["pid"][::-1], "score": 0.0}).to_csv(fmt, index=False)
    dest = tmp_path / "preds.csv"
    predict_to_csv(*paths, tmp_path / "m", fmt, dest)
    got = pd.read_csv(dest)
    assert list(got["pid"]) == list(pd.read_csv(fmt)["pid"]) and got["score"].between(0, 1).all()
