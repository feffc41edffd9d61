"""PrivateKT (seed 001) and the FedAvg-with-local-DP baseline: the randomized response and
its estimator, the sampling weights and the buffer, honest per-client accounting, the
participation cap, bad input, and an end-to-end run on real MNIST digits (a small GLM)."""

from __future__ import annotations

import json
import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import stats

from silofl.algorithms import make_algorithm
from silofl.algorithms.privatekt import (
    PrivateKT,
    entropy,
    kt_weights,
    push_fifo,
    self_train_weights,
)
from silofl.data.mnist import load_dirichlet_mnist
from silofl.errors import ConfigError
from silofl.models import make_model
from silofl.models.glm import SoftmaxRegression
from silofl.privacy import accounting, ldp
from silofl.privacy.budget import BudgetStore
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig
from silofl.runtime.simulator import simulate
from silofl.training.silo_data import SiloArrays


@pytest.fixture(scope="module")
def small_fed():
    """Real MNIST digits: 8 clients × 100 with Dirichlet(0.5) mixes, 300 public images."""
    return load_dirichlet_mnist(num_silos=8, train_per_silo=100, test_per_silo=40,
                                public_size=300, flatten=True, seed=1)


# --- randomized response -----------------------------------------------------------------

def test_beta_is_eq6_and_the_dp_accounting_event_has_ratio_e_eps_over_k():
    eps, K, C = 5.0, 2, 10
    beta = ldp.rr_keep_probability(eps, K, C)
    assert beta == pytest.approx((math.exp(eps / K) - 1) / (math.exp(eps / K) - 1 + C))
    ev = ldp.rr_event(eps, K, C)
    assert isinstance(ev, dpa.RandomizedResponseDpEvent) and ev.num_buckets == C
    assert ev.noise_parameter == pytest.approx(1 - beta)
    # the event's output probabilities: dp_accounting's parametrization, written out
    p_true = 1 - ev.noise_parameter + ev.noise_parameter / C
    p_other = ev.noise_parameter / C
    assert math.log(p_true / p_other) == pytest.approx(eps / K)
    # Rényi divergence → the pure ε/K as α → ∞; PLD at a tiny δ approaches it too
    assert accounting.rr_rdp(ev, [1e7])[0] == pytest.approx(eps / K, rel=1e-5)
    assert accounting.epsilon(ev, 1e-12, "pld") == pytest.approx(eps / K, rel=0.01)


@pytest.mark.statistical
def test_randomized_response_flip_frequencies_match_beta():
    C, beta, n = 10, ldp.rr_keep_probability(2.0, 1, 10), 40000
    out = ldp.randomized_response(np.full(n, 3), beta, C, Randomness.seeded(0))
    counts = np.bincount(out, minlength=C)
    expected = np.full(C, (1 - beta) / C * n)
    expected[3] += beta * n
    chi2, p = stats.chisquare(counts, expected)
    assert p > 1e-3, (counts, expected)
    # and a wrong β is rejected by the same test (it can fail)
    wrong = np.full(C, (1 - 0.9 * beta) / C * n)
    wrong[3] += 0.9 * beta * n
    assert stats.chisquare(counts, wrong)[1] < 1e-6


def test_eq3_estimator_is_unbiased():
    C, beta, reps = 5, ldp.rr_keep_probability(3.0, 2, 5), 3000
    truth = np.array([0, 0, 1, 2, 2, 2, 4, 4])  # 8 clients' predictions on one sample
    rng = Randomness.seeded(1)
    est = np.empty((reps, C))
    for r in range(reps):
        noisy = ldp.randomized_response(truth, beta, C, rng)
        est[r] = ldp.debias(np.bincount(noisy, minlength=C)[None], len(truth), beta)[0]
    mean, se = est.mean(0), est.std(0, ddof=1) / math.sqrt(reps)
    target = np.bincount(truth, minlength=C) / len(truth)
    assert np.all(np.abs(mean - target) < 4 * se), (mean, target, se)


def test_infinite_epsilon_uploads_the_true_predictions():
    beta = ldp.rr_keep_probability(1e6, 2, 10)
    assert beta == 1.0
    y = np.arange(1000) % 10
    assert np.array_equal(ldp.randomized_response(y, beta, 10, Randomness.seeded(2)), y)
    assert np.allclose(ldp.debias(np.eye(10)[y[:10]], 1, beta), np.eye(10)[y[:10]])


# --- sampling weights and the buffer -------------------------------------------------------

def test_entropy_and_weights_follow_eqs_4_and_5():
    p = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    u = entropy(p)
    assert np.allclose(u, [0.0, math.log(2), math.log(3)])
    wd, ws = kt_weights(u), self_train_weights(u)
    assert np.allclose(wd, np.exp(u) / np.exp(u).sum())
    assert np.allclose(ws, np.exp(-u) / np.exp(-u).sum())
    assert wd.argmax() == 2 and ws.argmax() == 0


def test_buffer_is_fifo_of_size_b():
    idx, soft = np.zeros(0, dtype=int), np.zeros((0, 3))
    for t in range(5):
        idx, soft = push_fifo(idx, soft, np.array([2 * t, 2 * t + 1]),
                              np.full((2, 3), float(t)), size=5)
    assert idx.tolist() == [5, 6, 7, 8, 9]  # the newest 5, oldest first
    assert soft[:, 0].tolist() == [2.0, 3.0, 3.0, 4.0, 4.0]


# --- accounting ------------------------------------------------------------------------------

def _cfg(**kw):
    base = dict(rounds=6, local_epochs=1, batch_size=16, lr=0.1, noise="seeded",
                eval_every=3)
    base.update(kw)
    return TrainingConfig(**base)


def test_charged_epsilon_equals_an_independent_dp_accounting_computation(small_fed):
    fed = small_fed.with_targets(PrivacyTarget(400.0, 1e-5), {})
    model = make_model("softmax", fed.dim, 10)
    alg = make_algorithm("privatekt", ldp_epsilon=4.0, client_fraction=0.5)
    res = simulate(fed, model, alg, _cfg(), store=BudgetStore(None))
    beta = ldp.rr_keep_probability(4.0, 2, 10)
    taken = []
    for led, rep in zip(res.ledgers, res.privacy()):
        rounds = [e.round for e in led.entries]
        assert len(set(rounds)) == len(rounds) and all(e.label == "ldp-upload"
                                                       for e in led.entries)
        taken.append(len(rounds))
        if not rounds:
            assert rep["epsilon"] == 0.0
            continue
        ref = pld_lib.from_randomized_response(
            1 - beta, 10, value_discretization_interval=1e-4,
            neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE
        ).self_compose(2 * len(rounds)).get_epsilon_for_delta(1e-5)
        assert rep["epsilon_pld"] == pytest.approx(ref, rel=0.01)
        assert rep["epsilon_pld"] >= ref * (1 - 1e-3)  # pessimistic, never below
        # about the pure composition (within the accountants' pessimistic rounding)
        assert rep["epsilon"] <= 4.0 * len(rounds) * 1.002
    # half the clients every round: 4 of 8 × 6 rounds
    assert sum(taken) == 4 * 6 and max(taken) <= 6


def test_client_out_of_budget_is_not_selected_and_not_read(small_fed, monkeypatch):
    one_round = ldp.rr_round_event(5.0, 2, 10)
    eps1 = accounting.epsilons(one_round, 1e-5)
    small = min(v for v in eps1.values() if v is not None) * 1.01  # covers one upload only
    name = small_fed.names[0]
    fed = small_fed.with_targets(PrivacyTarget(300.0, 1e-5),
                                 {name: PrivacyTarget(small, 1e-5)})
    reads: list[set] = []
    orig = SiloArrays.gather

    def spy(self, silos, idx):
        reads[-1].update(int(s) for s in np.atleast_1d(silos))
        return orig(self, silos, idx)
    monkeypatch.setattr(SiloArrays, "gather", spy)
    alg = make_algorithm("privatekt", client_fraction=1.0, max_participation=3)
    model = make_model("softmax", fed.dim, 10)
    orig_step = alg.silo_step

    def step(silos, message, trainer, round):
        reads.append(set())
        return orig_step(silos, message, trainer, round)
    alg.silo_step = step
    res = simulate(fed, model, alg, _cfg(rounds=5), store=BudgetStore(None))
    assert reads[0] == set(range(8))              # everyone in round 1
    assert all(0 not in r for r in reads[1:])     # silo 0: out of budget after one upload
    assert reads[3] == reads[4] == set()          # the others: cap of 3 rounds reached
    counts = [len(led.entries) for led in res.ledgers]
    assert counts == [1] + [3] * 7
    assert res.privacy()[0]["within_target"]


# --- bad input ---------------------------------------------------------------------------------

class _Logits(SoftmaxRegression):
    """A classifier whose prediction is raw scores, not a distribution."""

    def predict(self, w, X):
        return self.logits(w, X)


def test_bad_inputs_are_clear_errors(small_fed):
    fed = small_fed.with_targets(PrivacyTarget(100.0, 1e-5), {})
    model = make_model("softmax", fed.dim, 10)
    no_public = fed.__class__(fed.silos, fed.feature_names, fed.task, fed.num_classes)
    with pytest.raises(ConfigError, match="public set"):
        simulate(no_public, model, make_algorithm("privatekt"), _cfg())
    with pytest.raises(ConfigError, match="larger than the public set"):
        simulate(fed, model, PrivateKT(samples=10, public=fed.meta["public_X"][:5]), _cfg())
    for eps in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match="ldp_epsilon"):
            make_algorithm("privatekt", ldp_epsilon=eps)
    with pytest.raises(ConfigError, match="kt_buffer"):
        make_algorithm("privatekt", kt_buffer=0)
    with pytest.raises(ConfigError, match="distribution"):
        simulate(fed, _Logits(fed.dim, 10), make_algorithm("privatekt"), _cfg())
    with pytest.raises(ConfigError, match="job of its own"):
        from silofl.runtime.plan import plan_job
        alg = make_algorithm("privatekt")
        alg.bind_data(fed, model)
        plan_job(fed, [alg, make_algorithm("fedavg")], _cfg())


# --- end to end ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_privatekt_beats_chance_and_ldp_on_updates():
    """The CPU-sized setting at its smallest: 20 clients × 150 real digits, Dirichlet(0.5),
    a softmax GLM, ε = 5 per round for every method."""
    fed = load_dirichlet_mnist(num_silos=20, train_per_silo=150, test_per_silo=50,
                               public_size=500, flatten=True)
    fed = fed.with_targets(PrivacyTarget(1000.0, 1e-5), {})
    model = make_model("softmax", fed.dim, 10)
    cfg = _cfg(rounds=40, local_epochs=5, batch_size=32, eval_every=40)
    kt = simulate(fed, model, make_algorithm("privatekt"), cfg)
    lap = simulate(fed, model, make_algorithm("fedavg_ldp", ldp_mechanism="laplace"), cfg)
    gau = simulate(fed, model, make_algorithm("fedavg_ldp", ldp_mechanism="gaussian"), cfg)
    print("privatekt", kt.final_pooled, "laplace", lap.final_pooled, "gaussian",
          gau.final_pooled)
    assert kt.final_pooled > 0.3  # chance is 0.1
    assert kt.final_pooled > lap.final_pooled + 0.1
    assert kt.final_pooled > gau.final_pooled + 0.05


# --- from the command line ----------------------------------------------------------------

def test_cli_run_charges_each_client_for_the_rounds_it_took_part_in(tmp_path):
    from typer.testing import CliRunner

    from silofl.cli import app
    cfg = tmp_path / "kt.toml"
    cfg.write_text("""
[data]
source = "mnist_dirichlet"
num_silos = 6
train_per_silo = 120
test_per_silo = 30
public_size = 200
flatten = true
standardize = "none"
[model]
name = "softmax"
[training]
methods = ["privatekt"]
rounds = 3
local_epochs = 1
batch_size = 32
[privacy]
epsilon = 100.0
delta = 1e-5
[output]
checkpoint_every = 0
""")
    r = CliRunner().invoke(app, ["run", "--config", str(cfg), "--out", str(tmp_path / "o"),
                                 "-q"])
    assert r.exit_code == 0, r.output
    (run_dir,) = [p for p in (tmp_path / "o").iterdir() if p.is_dir()]
    rep = json.loads((run_dir / "privacy_report.json").read_text())
    assert any("ε-LDP for its whole local dataset" in n for n in rep["notes"])
    one = accounting.epsilons(ldp.rr_round_event(5.0, 2, 10), 1e-5)
    total = 0
    for c, m in zip(rep["combined"], rep["methods"]["privatekt"]):
        rounds = sum(e["count"] for e in m["events"]) // 2  # K = 2 labels per upload
        total += rounds
        if rounds == 1:
            assert c["epsilon"] == pytest.approx(min(one.values()))
    assert total == 3 * 3  # half of 6 clients, 3 rounds
    # a local-DP method cannot share a job: refused before anything is written
    bad = cfg.read_text().replace('"privatekt"]', '"privatekt", "fedavg"]')
    cfg.write_text(bad)
    r = CliRunner().invoke(app, ["run", "--config", str(cfg), "--out", str(tmp_path / "p")])
    assert r.exit_code == 2 and "job of its own" in r.output
    assert not (tmp_path / "p").exists()


def test_ldp_compare_writes_the_three_curves_with_their_epsilon(tmp_path):
    from silofl.config import config_from_dict
    from silofl.experiments.ldp_compare import compare
    cfg = config_from_dict({
        "data": {"source": "mnist_dirichlet", "num_silos": 6, "train_per_silo": 120,
                 "test_per_silo": 30, "public_size": 200, "flatten": True,
                 "standardize": "none"},
        "model": {"name": "softmax"},
        "training": {"rounds": 2, "local_epochs": 1, "batch_size": 32},
        "privacy": {"epsilon": 100.0, "delta": 1e-5}})
    res = compare(cfg, tmp_path)
    assert set(res) == {"privatekt", "fedavg_ldp", "fedavg"}
    assert (tmp_path / "comparison.png").stat().st_size > 0
    saved = json.loads((tmp_path / "comparison.json").read_text())
    assert saved["per_round_epsilon"] == 5.0
    for m in ("privatekt", "fedavg_ldp"):
        assert sum(res[m]["rounds_per_client"]) == 3 * 2
    # DP-SGD FedAvg: every client every round, one round's pass is (5, 1e-5)
    assert res["fedavg"]["rounds_per_client"] == [2] * 6
    assert 5.0 < res["fedavg"]["max_epsilon"] <= 10.0 * 1.002


def test_sweep_runs_the_local_dp_methods(tmp_path):
    from silofl.experiments.sweep import run_sweep
    from silofl.experiments.sweep_config import load_sweep_config
    from silofl.experiments.sweep_results import read_results
    path = tmp_path / "sweep.toml"
    path.write_text(f"""
[data]
source = "mnist_dirichlet"
num_silos = 6
train_per_silo = 120
test_per_silo = 30
public_size = 200
flatten = true
standardize = "none"
[model]
name = "softmax"
[training]
rounds = 2
local_epochs = 1
batch_size = 32
[privacy]
delta = 1e-5
[sweep]
methods = ["privatekt", "fedavg_ldp"]
epsilon = [12.0]
lr = [0.1]
seeds = [0]
workers = 1
results = "{tmp_path / 'r.jsonl'}"
""")
    out = run_sweep(load_sweep_config(path))
    assert out.executed == 2
    _, records = read_results(out.results)
    for r in records:  # target 12 covers two uploads at ε = 5 (PLD ≈ 10.01)
        assert max(r["privacy"]["epsilon_spent"]) <= 12.0
        assert r["algorithm"]["ldp_epsilon"] == 5.0
