"""Weight Erosion (Algorithm 1 of the seed): a direct transcription on recorded gradients,
p_d = 0 as FedAvg on single gradients, the ledger against the data actually read, an
outlier silo eroding fastest, and refusal of bad settings (Python and CLI). The seed's
options: participation schedules (transcription with masks, ledger = rounds taken part
through a lifetime store), newcomers' first α, local SGD pseudo-gradients (ledger = steps
run) and α curves in `silofl run`'s outputs."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import statistics

import dp_accounting as dpa
import numpy as np
import pytest
import tomli_w
from dp_accounting import rdp
from typer.testing import CliRunner

from silofl.algorithms import ALGORITHMS, METHODS, WeightErosion, make_algorithm
from silofl.algorithms.weight_erosion import ErosionUpdate, participation
from silofl.cli import app
from silofl.config import config_from_dict
from silofl.data import linear_silos
from silofl.errors import ConfigError
from silofl.experiments.build import build_algorithms
from silofl.experiments.run import run as run_job
from silofl.models import make_model
from silofl.privacy import events
from silofl.privacy.accounting import RDP_ORDERS, steps_for_epochs
from silofl.privacy.budget import BudgetStore
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig, plan_silos
from silofl.runtime.simulator import simulate
from silofl.training.silo_data import SiloArrays
from silofl.training.trainer import LocalTrainer

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

    def spy(self, W, round=0, label="dpsgd", silos=None):
        g = orig(self, W, round=round, label=label, silos=silos)
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
    res = CliRunner().invoke(app, ["run", "--config", str(_write(
        tmp_path, methods=["weight_erosion", "fedavg"], we_join_round={"silo-02": 3},
        we_newcomer="median")), "-q"])
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    # α curves: the figure, the values per round in history.json, a pointer in summary.json
    assert (run_dir / "alpha_over_rounds.png").stat().st_size > 0
    a = json.loads((run_dir / "history.json").read_text())["weight_erosion"]["extra"]["alpha"]
    assert a["user"] == "silo-01" and a["rounds"] == [1, 2, 3, 4, 5]
    A = np.array([[np.nan if v is None else v for v in row] for row in a["per_silo"]])
    assert A.shape == (5, 3) and np.all(A[:, 1] == 1.0) and np.isnan(A[:2, 2]).all()
    assert np.all(A[2:, 2] <= 1.0) and np.all(np.diff(A[:, 0]) <= 0)  # α only erodes
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "alpha_over_rounds.png" in summary["weight_erosion_alpha"]
    assert summary["methods"][0]["join_round"] == {"silo-02": 3}
    assert "alpha" not in json.loads((run_dir / "history.json").read_text())["fedavg"].get(
        "extra", {})


@pytest.mark.parametrize("training, words", [
    ({"we_user": "nobody"}, "not a silo"),
    ({"we_user": ""}, "we_user"),
    ({"we_p_d": -0.5}, "we_p_d"),
    ({"we_p_s": -2.0}, "we_p_s"),
    ({"we_participation": 0.0}, "we_participation"),
    ({"we_join_round": {"silo-02": 9}}, "after the last round (5)"),
    ({"we_join_round": {"silo-02": 2}, "we_leave_round": {"silo-02": 2}}, "greater than"),
    ({"we_leave_round": {"silo-07": 2}}, "'silo-07' is not a silo"),
    ({"we_join_round": {"silo-01": 2}}, "the user silo"),
    ({"we_update": "sgd"}, "we_update"),
])
def test_cli_refuses_bad_settings(tmp_path, training, words):
    res = CliRunner().invoke(app, ["run", "--config", str(_write(tmp_path, **training)),
                                   "-q"])
    assert res.exit_code == 2, res.output
    assert words in " ".join(res.output.split())
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(p.is_dir() for p in runs.iterdir())


# --- the seed's options: silos coming and going, newcomers, local SGD, α curves -------------

SIZES4 = [30, 40, 60, 50]


def _transcribe_masked(grads, present, sizes, b, lr, w0, user, p_s, p_d, *, count,
                       newcomer, join, leave):
    """Algorithm 1 over the silos U_r that take part in round r (the seed's "Resilience"),
    scalar by scalar: absent silos keep α and stay out of ḡ; r in the size penalty is the
    round or the rounds silo i took part in; a late joiner starts at 1 or at the mean /
    median α of all silos holding a weight then (joined, not left, the user included)."""
    K = len(sizes)
    alpha = [None if join.get(i, 1) > 1 else 1.0 for i in range(K)]
    taken = [0] * K
    w = list(w0)
    alphas, ws = [], []
    for r, (g, pres) in enumerate(zip(grads, present), start=1):
        U = [i for i in range(K) if pres[i]]
        for i in U:
            taken[i] += 1
        pool = [alpha[j] for j in range(K)
                if alpha[j] is not None and r < leave.get(j, math.inf)]
        first = {"one": lambda _p: 1.0, "mean": statistics.mean,
                 "median": statistics.median}[newcomer](pool)
        for i in U:
            if alpha[i] is None:
                alpha[i] = first
        g0 = g[user]
        norm0 = math.sqrt(sum(v * v for v in g0))
        for i in U:
            d = math.sqrt(sum((a - c) ** 2 for a, c in zip(g[i], g0))) / norm0
            rr = r if count == "rounds" else taken[i]
            alpha[i] = max(0.0, alpha[i] - (1 + p_s * math.floor((rr - 1) * b / sizes[i]))
                           * p_d * d)
        tot = sum(alpha[i] for i in U)
        gbar = [sum(alpha[i] * g[i][j] for i in U) / tot for j in range(len(w))]
        w = [wj - lr * gj for wj, gj in zip(w, gbar)]
        alphas.append([math.nan if a is None else a for a in alpha])
        ws.append(list(w))
    return np.array(alphas), np.array(ws)


@pytest.mark.parametrize("count, newcomer", [("participated", "median"), ("rounds", "mean")])
def test_matches_a_transcription_with_participation_masks(recorded, count, newcomer):
    fed, cfg = _fed(sizes=SIZES4), _cfg()
    user, p_s, p_d, join, leave = 1, 0.5, 0.03, {3: 4}, {0: 9}
    alg = WeightErosion(user, p_s=p_s, p_d=p_d, participation=0.6,
                        join_round={"silo-03": 4}, leave_round={"silo-00": 9}, count=count,
                        newcomer=newcomer, seed=3)
    states = _servers(fed, alg, cfg)
    present = np.array([alg.present(t) for t in range(1, cfg.rounds + 1)])
    # the schedule has what is tested: random absences, a late joiner and a leaver
    assert present[:, user].all() and not present[:3, 3].any() and present[3:, 3].any()
    assert not present[8:, 0].any() and not present[:8, [0, 2]].all()
    assert len(recorded) == cfg.rounds
    for g, m in zip(recorded, present):  # absent silos computed nothing
        assert np.isnan(g[~m]).all() and np.isfinite(g[m]).all()
    args = ([g.tolist() for g in recorded], present.tolist(), [s.n_train for s in fed.silos],
            cfg.batch_size, cfg.lr, make_model("logistic", 3).init_params().tolist(), user,
            p_s, p_d)
    alphas, ws = _transcribe_masked(*args, count=count, newcomer=newcomer, join=join,
                                    leave=leave)
    got = np.array([s.alpha for s in states])
    np.testing.assert_allclose(got, alphas, rtol=1e-12, atol=1e-12)  # NaN: not yet joined
    np.testing.assert_allclose(np.array([s.params for s in states]), ws, rtol=1e-10,
                               atol=1e-12)
    first = int(np.argmax(present[:, 3]))  # the newcomer's first round taken part (0-based)
    assert first >= 3 and np.isnan(got[:first, 3]).all() and np.isfinite(got[first:, 3]).all()
    other = "rounds" if count == "participated" else "participated"
    alt, _ = _transcribe_masked(*args, count=other, newcomer=newcomer, join=join, leave=leave)
    assert not np.allclose(alt, alphas, equal_nan=True)  # the count option matters here
    for e, m, g, a in zip(alg.round_log, present, recorded, got):  # what was released
        assert e["present"].tolist() == m.tolist()
        np.testing.assert_array_equal(e["grads"], g)
        np.testing.assert_array_equal(e["alpha"], a)


@pytest.mark.parametrize("update", ["gradient", "local_sgd"])
def test_everyone_present_takes_the_default_path_bit_for_bit(update):
    fed, cfg = _fed(), _cfg(rounds=6, local_epochs=0.5, l2=0.01)
    model = make_model("logistic", 3)
    base_alg = WeightErosion(0, update=update)
    base = simulate(fed, model, base_alg, cfg)
    # a schedule in which every silo takes part: LocalTrainer's subset path, same draws
    alg = WeightErosion(0, update=update, join_round={"silo-02": 1}, count="participated",
                        newcomer="median")
    assert alg.scheduled
    res = simulate(fed, model, alg, cfg)
    np.testing.assert_array_equal(res.params, base.params)
    np.testing.assert_array_equal(np.array(alg.alpha_history),
                                  np.array(base_alg.alpha_history))
    assert [dict(led.spent_counts()) for led in res.ledgers] == \
        [dict(led.spent_counts()) for led in base.ledgers]
    assert all(e["present"].all() for e in base_alg.round_log)


def test_participation_schedule_is_public_and_has_rate_p():
    K, user, p = 6, 2, 0.3
    S = np.array([participation(r, K, user, p, {4: 50}, {5: 120}, seed=11)
                  for r in range(1, 401)])
    again = np.array([participation(r, K, user, p, {4: 50}, {5: 120}, seed=11)
                      for r in range(1, 401)])
    np.testing.assert_array_equal(S, again)  # a function of (round, settings, seed) only
    assert S[:, user].all() and not S[:49, 4].any() and not S[119:, 5].any()
    free = S[:, [0, 1, 3]]  # Bernoulli(p) draws: the rate within 4 standard deviations
    assert abs(free.mean() - p) < 4 * math.sqrt(p * (1 - p) / free.size)
    assert abs(S[49:, 4].mean() - p) < 4 * math.sqrt(p * (1 - p) / S[49:, 4].size)
    other = np.array([participation(r, K, user, p, {}, {}, seed=12) for r in range(1, 401)])
    assert (other[:, [0, 1, 3]] != free).mean() > 0.2  # another seed, another schedule
    assert participation(7, K, user, 1.0, {}, {}, seed=0).all()


@pytest.mark.parametrize("newcomer, leave, expected", [
    ("one", {}, 1.0), ("mean", {}, 0.5), ("median", {}, 0.4),
    ("mean", {2: 3}, 0.7), ("median", {2: 3}, 0.7),  # a silo that left holds no weight
])
def test_newcomer_starts_at_mean_or_median_alpha(newcomer, leave, expected):
    alg = WeightErosion(0, p_d=0.5, join_round={3: 3}, leave_round=leave, newcomer=newcomer)
    _, server = alg.init(np.zeros(2), 4, rounds=5)
    assert np.isnan(server.alpha[3])  # no weight before joining
    server.alpha = np.array([1.0, 0.4, 0.1, np.nan])
    present = alg.present(3)
    assert present.tolist() == [True, True, not leave, True]
    g = np.array([[1.0, 0.0]] * 4)  # every distance is 0: no erosion this round
    g[~present] = np.nan
    out = alg.server_step(server, ErosionUpdate(g, np.zeros(4), 0.1, present, 3), None)
    np.testing.assert_allclose(out.alpha, [1.0, 0.4, 0.1, expected])


def _store_run(tmp_path, **training):
    raw = {"data": {"source": "synthetic", "generator": "linear",
                    "options": {"num_silos": 3, "sizes": SIZES, "dim": 3, "task": "binary"}},
           "training": {"methods": ["weight_erosion"], "rounds": 10, "batch_size": 8,
                        "we_user": "silo-01", "seed": 7, **training},
           "privacy": {"epsilon": 2.0, "delta": DELTA, "noise": "seeded"},
           "budget": {"store": str(tmp_path / "budget.sqlite")},
           "output": {"dir": str(tmp_path / "runs")}}
    return config_from_dict(raw)


def _counting_reads(monkeypatch) -> list[np.ndarray]:
    reads: list[np.ndarray] = []
    orig = SiloArrays.gather

    def counting(self, silos, idx):
        reads.append(np.array(silos, copy=True))
        return orig(self, silos, idx)

    monkeypatch.setattr(SiloArrays, "gather", counting)
    return reads


def _per_silo(reads, K):
    touched = np.zeros(K, dtype=int)
    for silos in reads:
        np.add.at(touched, silos, 1)
    return touched


def _store_steps(store, name, method):
    """DP-SGD steps the lifetime store holds for `method` on silo `name` (and statuses)."""
    rows = [c for c in store.charges(name) if c["method"] == method]
    steps = sum(c["count"] * sum(events.flatten(events.from_json(c["event"])).values())
                for c in rows)
    return steps, {c["status"] for c in rows}


def test_charged_steps_are_the_rounds_taken_part_in(tmp_path, monkeypatch):
    reads = _counting_reads(monkeypatch)
    cfg = _store_run(tmp_path, we_participation=0.5, we_join_round={"silo-02": 4},
                     we_leave_round={"silo-00": 8})
    rep = run_job(cfg)
    sched = np.array([participation(r, 3, 1, 0.5, {2: 4}, {0: 8}, seed=7)
                      for r in range(1, 11)])
    taken = sched.sum(0)
    assert taken[1] == 10 and 0 < taken[0] < 7 and 0 < taken[2] < 7
    assert _per_silo(reads, 3).tolist() == taken.tolist()  # read only when taking part
    (res,) = rep.results
    store = BudgetStore(tmp_path / "budget.sqlite")
    for k, name in enumerate(res.silos):
        # reserved: the worst case, every round; settled: the rounds taken part in
        assert sum(events.flatten(res.plans[k].declared).values()) == 10
        assert sum(res.ledgers[k].spent_counts().values()) == taken[k]
        assert _store_steps(store, name, "weight_erosion") == (taken[k], {"charged"})
        assert store.spent(name)["unfinished_runs"] == 0
    hist = json.loads((rep.run_dir / "history.json").read_text())
    a = hist["weight_erosion"]["extra"]["alpha"]
    assert a["present"] == sched.tolist() and a["rounds"] == list(range(1, 11))
    first = int(np.argmax(sched[:, 2]))  # the late joiner holds no weight before it
    assert first >= 3 and all(row[2] is None for row in a["per_silo"][:first])
    assert all(row[2] is not None for row in a["per_silo"][first:])


def test_local_sgd_sends_pseudo_gradients_charged_per_step(monkeypatch):
    reads = _counting_reads(monkeypatch)
    passes = []
    orig = LocalTrainer.run

    def spy(self, W0, *a, **kw):
        out = orig(self, W0, *a, **kw)
        passes.append((np.array(W0, copy=True), out.copy(), self.steps_per_round.copy()))
        return out

    monkeypatch.setattr(LocalTrainer, "run", spy)
    fed, cfg = _fed(), _cfg(rounds=6, local_epochs=0.6)
    alg = WeightErosion("silo-00", update="local_sgd", participation=0.6, seed=1)
    res = simulate(fed, make_model("logistic", 3), alg, cfg)
    steps = np.array([p.steps_per_pass for p in res.plans])
    assert steps.tolist() == [steps_for_epochs(n, cfg.batch_size, 0.6) for n in SIZES]
    assert len(set(steps.tolist())) > 1 and steps.min() > 1
    taken = np.array([alg.present(t) for t in range(1, cfg.rounds + 1)]).sum(0)
    assert taken[0] == cfg.rounds and taken.min() < cfg.rounds
    assert _per_silo(reads, 3).tolist() == (steps * taken).tolist()  # steps actually run
    for k, s in enumerate(fed.silos):
        step = dpa.PoissonSampledDpEvent(cfg.batch_size / s.n_train,
                                         dpa.GaussianDpEvent(res.plans[k].noise_multiplier))
        assert dict(res.ledgers[k].spent_counts()) == {step: int(steps[k] * taken[k])}
        assert dict(events.flatten(res.plans[k].declared)) == {step: int(steps[k]) * 6}
    for e, (w0, w1, _st) in zip(alg.round_log, passes):  # g_i = (w − w_i^end) / lr
        m = e["present"]
        np.testing.assert_allclose(e["grads"][m], ((w0 - w1) / cfg.lr)[m],
                                   rtol=1e-12)
        assert np.isnan(e["grads"][~m]).all() and (w1[~m] == w0[~m]).all()
        np.testing.assert_array_equal(w0, np.tile(e["params"], (3, 1)))


def test_local_sgd_needs_a_positive_step_and_charges_nothing_without_it():
    fed = _fed()
    with pytest.raises(ConfigError, match="lr > 0"):
        simulate(fed, make_model("logistic", 3), WeightErosion(0, update="local_sgd"),
                 _cfg(lr=0.0))


@pytest.mark.parametrize("kw, words", [
    ({"participation": 0.0}, "(0, 1]"),
    ({"participation": 1.5}, "(0, 1]"),
    ({"join_round": {"silo-02": 0}}, "round number ≥ 1"),
    ({"leave_round": {"silo-02": -1}}, "round number ≥ 1"),
    ({"join_round": {"silo-02": 13}}, "after the last round (12)"),
    ({"leave_round": {"silo-02": 13}}, "after the last round (12)"),
    ({"join_round": {"silo-02": 5}, "leave_round": {"silo-02": 5}}, "greater than"),
    ({"join_round": {"nobody": 3}}, "'nobody' is not a silo"),
    ({"leave_round": {"silo-00": 3}}, "user silo 'silo-00' takes part in every round"),
    ({"join_round": {"silo-00": 3}}, "remove it from we_join_round"),
    ({"update": "fedprox"}, "we_update"),
    ({"count": "epochs"}, "we_count"),
    ({"newcomer": "zero"}, "we_newcomer"),
])
def test_bad_options_are_config_errors(kw, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        plan_silos(_fed(), WeightErosion("silo-00", **kw), _cfg())


def test_option_keys_reach_the_algorithm():
    cfg = config_from_dict({"training": {
        "methods": ["weight_erosion"], "we_user": "b", "we_update": "local_sgd",
        "we_participation": 0.25, "we_join_round": {"c": 3}, "we_leave_round": {"d": 4},
        "we_count": "participated", "we_newcomer": "mean", "seed": 9}})
    (alg,) = build_algorithms(cfg)
    assert (alg.update, alg.participation, alg.join_round, alg.leave_round, alg.count,
            alg.newcomer, alg.seed, alg.fixed_steps_per_pass) == (
        "local_sgd", 0.25, {"c": 3}, {"d": 4}, "participated", "mean", 9, None)
    assert WeightErosion("b").fixed_steps_per_pass == 1
    with pytest.raises(ConfigError, match="must be of type dict"):
        config_from_dict({"training": {"we_join_round": 3}})
    with pytest.raises(ConfigError, match="we_newcomer"):  # validated whichever method runs
        build_algorithms(config_from_dict({"training": {"methods": ["fedavg"],
                                                        "we_newcomer": "zero"}}))


def test_erosion_command_takes_the_options(tmp_path):
    from silofl.experiments.erosion import erosion_for_users
    cfg = _store_run(tmp_path, rounds=6, seed=4, we_participation=0.5,
                     we_join_round={"silo-02": 3}, we_newcomer="mean", we_count="participated")
    cfg.output.dir, cfg.budget.store = "", ""  # nothing written, a scratch store
    rep = erosion_for_users(cfg, ["silo-01"])
    A = rep.curves["silo-01"].alpha
    sched = np.array([participation(r, 3, 1, 0.5, {2: 3}, {}, seed=4) for r in range(1, 7)])
    first = int(np.argmax(sched[:, 2]))
    assert A.shape == (6, 3) and np.all(A[:, 1] == 1.0)
    assert first >= 2 and sched[first, 2]  # the newcomer took part from some round on
    assert np.isnan(A[:first, 2]).all() and np.isfinite(A[first:, 2]).all()
    absent = ~sched[1:]  # a silo's α does not move in the rounds it missed
    assert absent[:, 0].any() and np.all(np.diff(A[:, 0])[absent[:, 0]] == 0)
    assert np.all(np.diff(A[first:, 2])[absent[first:, 2]] == 0)
    assert "per round the silo took part in" in rep.to_dict()["charged"]
