"""clip = "auto": private adaptive clipping (Andrew et al. 2021) — its privacy event, the
quantile tracker, the noise it adds, its charges, hosting, torch models and bad input."""

from __future__ import annotations

import warnings

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import pld, rdp

from silofl.algorithms import make_algorithm
from silofl.data.heart import load_heart_disease
from silofl.errors import ConfigError
from silofl.models import make_model
from silofl.models.base import Model
from silofl.privacy import accounting, events
from silofl.privacy.adaptive_clip import (
    AdaptiveClipDpEvent,
    adaptive_event,
    count_noise,
    gradient_noise,
)
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig, plan_silos
from silofl.runtime.rules import gradient_rule
from silofl.runtime.simulator import simulate
from silofl.training.dpsgd import QuantileClip
from silofl.training.silo_data import SiloArrays
from silofl.training.trainer import LocalTrainer

DELTA = 1e-4


def heart(eps: float = 1.0):
    return load_heart_disease(seed=0).with_targets(PrivacyTarget(eps, DELTA))


def run(fed, cfg, method="fedavg", model=None, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return simulate(fed, model or make_model("logistic", fed.dim),
                        make_algorithm(method, lam=1.0), cfg, **kw)


# --- the privacy event --------------------------------------------------------------------

@pytest.mark.parametrize("q, sigma_grad, sigma_count, steps", [
    (0.05, 1.3, 2.0, 200), (0.2, 0.9, 5.0, 30), (0.01, 3.0, 1.7, 1000)])
def test_event_epsilon_is_the_poisson_gaussian_at_z(q, sigma_grad, sigma_count, steps):
    """ε of the declared steps equals dp_accounting's Poisson-sampled Gaussian at
    z = (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2), computed by dp_accounting's own accountants (an
    independent reference). Tolerance: PLD figures differ by their discretization (silofl
    picks its grid per composition, the reference uses 1e-4): 1 % relative; RDP: silofl's
    order grid is a superset of the reference's, so ε ≤ reference and within 1 %."""
    z = (sigma_grad ** -2 + (2 * sigma_count) ** -2) ** -0.5
    ev = adaptive_event(q, z, sigma_count, steps)
    base = ev.event
    assert isinstance(base, AdaptiveClipDpEvent)
    assert base.gradient_noise == pytest.approx(sigma_grad, rel=1e-12)
    assert base.gradient_noise >= sigma_grad * (1 - 1e-15)
    ref = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)
    ra = rdp.RdpAccountant()
    ra.compose(ref)
    pa = pld.PLDAccountant(value_discretization_interval=1e-4)
    pa.compose(ref)
    eps_rdp = accounting.epsilon(ev, DELTA, "rdp")
    assert eps_rdp <= ra.get_epsilon(DELTA) * (1 + 1e-9)
    assert eps_rdp == pytest.approx(ra.get_epsilon(DELTA), rel=0.01)
    assert accounting.epsilon(ev, DELTA, "pld") == pytest.approx(pa.get_epsilon(DELTA), rel=0.01)
    # and exactly what silofl charges for a plain DP-SGD step at σ = z
    plain = accounting.dpsgd_event(q, z, steps)
    for kind in ("rdp", "pld"):
        assert accounting.epsilon(ev, DELTA, kind) == accounting.epsilon(plain, DELTA, kind)


def test_event_survives_the_ledger_file_and_store_text():
    ev = AdaptiveClipDpEvent(0.1, 1.5, 4.0)
    back = events.from_json(events.to_json(ev))
    assert back == ev and isinstance(back, AdaptiveClipDpEvent)
    comp = dpa.ComposedDpEvent([adaptive_event(0.1, 1.5, 4.0, 7), accounting.dpsgd_event(0.1, 2.0)])
    again = events.from_dict(events.to_dict(comp))
    assert events.flatten(again) == events.flatten(comp)


def test_count_noise_too_small_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="clip_count_noise"):
        gradient_noise(2.0, 0.9)  # σ_b ≤ σ/2
    with pytest.raises(ConfigError, match="clip_count_noise"):
        AdaptiveClipDpEvent(0.1, 2.0, 1.0)
    # "auto" always leaves gradient noise: σ_b ≥ σ/(2√0.05)
    sb = count_noise("auto", 2.0, 8.0)
    assert sb > 1.0 and gradient_noise(2.0, sb) < 2.0 * 1.03


# --- the quantile tracker -----------------------------------------------------------------

def test_clip_step_slows_only_where_the_count_is_noise():
    from silofl.privacy.adaptive_clip import STEP_NOISE, clip_step
    assert clip_step(0.2, 0.4, 8.0) == 0.2            # σ_b/m = 0.05 (Andrew et al.'s m/20)
    assert clip_step(0.2, 67.0, 14.0) == pytest.approx(STEP_NOISE / (67 / 14) ** 2)
    assert clip_step(0.2, 67.0, 14.0) < 0.01

@pytest.mark.parametrize("gamma", [0.3, 0.5, 0.8])
def test_tracker_converges_to_the_quantile_of_known_norms(gamma):
    """Norms ~ LogNormal(0, 1), m = 50 per batch (Poisson), σ_b = 2.5, η = 0.05, 4000 steps
    from C₀ = 0.01: the mean of log C over the last 2000 steps is within 0.1 of log of the
    γ-quantile (the estimator's fixed point; its noise averages out over the window)."""
    rng = np.random.default_rng(7)
    m = 50.0
    t = QuantileClip(np.array([0.01]), gamma, 0.05, np.array([2.5]), np.array([1.0]),
                     np.array([m]))
    logs = []
    for s in range(4000):
        b = rng.poisson(m)
        norms = rng.lognormal(0.0, 1.0, size=b)
        t.update(np.array([0]), np.array([np.sum(norms <= t.clip[0])]), np.array([b]),
                 rng.standard_normal(1))
        if s >= 2000:
            logs.append(np.log(t.clip[0]))
    from scipy.stats import norm
    assert np.mean(logs) == pytest.approx(norm.ppf(gamma), abs=0.1)


def test_glm_and_torch_counts_match_per_example_norms():
    """Each backend's count of rows with ‖g_i‖ ≤ C_k equals the count from explicit
    per-example gradients, and its clipped sum the generic one (torch: float32, 1e-4)."""
    rng = np.random.default_rng(0)
    K, B, d = 3, 20, 5
    X = rng.normal(size=(K, B, d))
    y = (rng.random((K, B)) < 0.5).astype(float)
    mask = rng.random((K, B)) < 0.8
    clip = np.array([0.05, 0.3, 2.0])
    for model, tol in ((make_model("logistic", d), 1e-12),
                       (make_model("mlp", d, 2, task="binary", hidden=[8], seed=1), 1e-4)):
        W = np.tile(model.init_params() + 0.1, (K, 1))
        got_sum, got_count = model.clipped_grad_sum_count(W, X, y, mask, clip)
        ref_sum, ref_count = Model.clipped_grad_sum_count(model, W, X, y, mask, clip)
        np.testing.assert_array_equal(got_count, ref_count)
        assert 0 < ref_count.sum() < mask.sum()  # some rows on each side of the clips
        np.testing.assert_allclose(got_sum, ref_sum, rtol=tol, atol=tol)


# --- the noise the rule adds ----------------------------------------------------------------

class _Ones(type(Randomness.seeded(0))):  # type: ignore[misc]
    """Seeded sampling, but every Gaussian noise draw is 1 and every count draw 0."""

    def normal_prefetched(self, shape):
        return np.ones(shape)

    def normal(self, shape):
        return np.zeros(shape)


def test_gradient_noise_is_sigma_delta_times_the_current_clip():
    fed = heart()
    cfg = TrainingConfig(rounds=1, batch_size=8, lr=0.1, clip="auto", noise="seeded")
    model = make_model("logistic", fed.dim)
    plans = plan_silos(fed, make_algorithm("fedavg"), cfg)
    rule = gradient_rule(cfg, plans)
    seen = []
    real = model.clipped_grad_sum_count

    def spy(W, X, y, mask, clip, **aux):
        out = real(W, X, y, mask, clip, **aux)
        seen.append((clip.copy(), out[0].copy()))
        return out
    model.clipped_grad_sum_count = spy
    from silofl.privacy.ledger import Ledger
    tr = LocalTrainer(model=model, data=SiloArrays.stack([s.X_train for s in fed.silos],
                                                         [s.y_train for s in fed.silos]),
                      rule=rule, batch_size=8, steps_per_round=np.array([1] * 4), lr=0.1,
                      l2=0.0, rng=_Ones(0),
                      ledgers=[Ledger(p.name, p.target) for p in plans])
    W = np.tile(model.init_params(), (4, 1))
    for _ in range(3):
        C = rule.adaptive.clip.copy()
        g = tr.gradients(W)
        clip, clipped = seen[-1]
        np.testing.assert_array_equal(clip, C)
        noise = g * tr.expected_batch[:, None] - clipped
        np.testing.assert_allclose(noise, (rule.adaptive.gradient_noise * C)[:, None]
                                   * np.ones_like(noise), rtol=1e-9)
        assert not np.array_equal(rule.adaptive.clip, C)  # the clip moved after the step
    sigma = np.array([p.noise_multiplier for p in plans])
    assert np.all(rule.adaptive.gradient_noise > sigma)


# --- charges, hosting, models -------------------------------------------------------------

def test_ledger_holds_exactly_the_executed_steps_and_meets_the_target():
    fed = heart(2.0)
    cfg = TrainingConfig(rounds=4, batch_size=8, lr=0.1, clip="auto", noise="seeded")
    r = run(fed, cfg, "mrmtl")
    for led, p in zip(r.ledgers, r.plans):
        counts = led.spent_counts()
        assert set(map(type, counts)) == {AdaptiveClipDpEvent}
        assert sum(counts.values()) == cfg.rounds * p.steps_per_pass
        (ev,) = counts
        assert (ev.q, ev.noise_multiplier, ev.count_noise) == (p.q, p.noise_multiplier,
                                                               p.count_noise)
        assert led.epsilon() <= p.target.epsilon
        assert p.final_clip is not None and p.final_clip != cfg.clip_init
        assert p.to_dict()["clip"] == "auto"


def test_store_records_the_adaptive_events(tmp_path):
    from silofl.privacy.budget import BudgetStore
    fed = heart(1.0)
    cfg = TrainingConfig(rounds=2, batch_size=8, lr=0.1, clip="auto", noise="seeded")
    with BudgetStore(tmp_path / "s.sqlite") as store:
        r = run(fed, cfg, store=store)
        for p in r.plans:
            rows = store.charges(p.name)
            steps = sum(c * row["count"] for row in rows
                        for c in events.flatten(events.from_json(row["event"])).values())
            assert steps == cfg.rounds * p.steps_per_pass
            assert all("adaptive_clip" in row["event"] for row in rows)


def test_torch_mlp_trains_with_auto_clip():
    fed = heart(2.0)
    cfg = TrainingConfig(rounds=2, batch_size=16, lr=0.1, clip="auto", noise="seeded")
    model = make_model("mlp", fed.dim, 2, task="binary", hidden=[8])
    r = run(fed, cfg, model=model)
    assert np.all(np.isfinite(r.params))
    assert all(np.isfinite(p.final_clip) and p.final_clip != 0.1 for p in r.plans)
    assert 0.5 < r.final_pooled <= 1.0


def test_per_silo_hosting_equals_joint(monkeypatch):
    """Each silo's clip is its own state: hosted alone (as on the network) it follows the
    same path as in the joint trainer. Streams differ by hosting, so both use the same
    deterministic noise (`_Ones`) and full batches (q = 1). Tolerance: clips 1e-9
    relative; parameters 1e-6 relative (gradients are computed in float32 on the packed
    rows: a batched and a one-silo product round differently, ~1e-7 relative)."""
    import silofl.runtime.network.hosting as hosting
    import silofl.runtime.simulator as sim
    monkeypatch.setattr(sim.Randomness, "seeded", staticmethod(lambda seed: _Ones(seed)))
    monkeypatch.setattr(hosting, "silo_randomness", lambda mode, seed, name: _Ones(seed))
    fed = heart(2.0)
    cfg = TrainingConfig(rounds=3, batch_size=300, lr=0.1, clip="auto", noise="seeded",
                         clip_init=1.5)
    a, b = run(fed, cfg, "mrmtl"), run(fed, cfg, "mrmtl", hosting="per_silo")
    np.testing.assert_allclose([p.final_clip for p in a.plans],
                               [p.final_clip for p in b.plans], rtol=1e-9)
    np.testing.assert_allclose(a.params, b.params, rtol=1e-6, atol=1e-12)
    assert len({p.final_clip for p in a.plans}) == len(a.plans)  # per silo, not shared


def test_resume_keeps_each_silos_clip():
    fed = heart(2.0)
    cfg = TrainingConfig(rounds=4, batch_size=8, lr=0.1, clip="auto", noise="seeded")
    saved = {}
    full = run(fed, cfg, checkpoint=lambda s: saved.setdefault(s["round"], s))
    again = run(fed, cfg, resume=saved[2])
    np.testing.assert_allclose([p.final_clip for p in again.plans],
                               [p.final_clip for p in full.plans], rtol=1e-12)
    np.testing.assert_allclose(again.params, full.params, rtol=1e-12, atol=1e-15)


# --- a fixed clip is unchanged --------------------------------------------------------------

def test_fixed_clip_seeded_run_is_unchanged():
    """Reference figures computed with silofl before clip = "auto" existed (same seed and
    settings); tolerance 1e-8 (float32 rounding of the fused GLM pass, see below)."""
    cfg = TrainingConfig(rounds=3, batch_size=8, lr=0.1, clip=0.5, noise="seeded", seed=3)
    r = run(heart(1.0), cfg, "mrmtl")
    ref = [[0.029470642415622, -0.081884498926519, 0.148297265908957],
           [0.041716505786488, -0.101384151624126, 0.042574358976627],
           [0.013655618567997, -0.081043285700948, 0.175531191603327],
           [0.044121787077267, -0.063000227199591, 0.146277769403937]]
    # atol 1e-8: the fused GLM pass (issue 25: float32 logits and bias sums) moved these
    # figures by ≤ 1e-10; a change of mechanism would move them by orders more
    np.testing.assert_allclose(r.params[:, :3], ref, rtol=0, atol=1e-8)
    assert r.history.pooled == pytest.approx([0.8378378378378378, 0.8054054054054054,
                                              0.7675675675675676], abs=1e-12)
    assert all(p.count_noise is None and "clip" not in p.to_dict() for p in r.plans)


# --- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("kw, words", [
    ({"clip": "max"}, "clip must be a positive number"),
    ({"clip": -1.0}, "clip must be a positive number"),
    ({"clip": "auto", "clip_quantile": 1.0}, "clip_quantile"),
    ({"clip": "auto", "clip_lr": 0.0}, "clip_lr"),
    ({"clip": "auto", "clip_init": -0.1}, "clip_init"),
    ({"clip": "auto", "clip_count_noise": 0.0}, "clip_count_noise"),
    ({"clip": "auto", "clip_count_noise": "big"}, "clip_count_noise"),
    ({"clip": "auto", "privacy_unit": "node"}, "privacy_unit = 'node'"),
])
def test_bad_settings_are_config_errors(kw, words):
    with pytest.raises(ConfigError, match=words):
        TrainingConfig(**kw).validate()


def test_count_noise_too_small_for_sigma_is_refused_before_any_charge():
    fed = heart(0.5)
    cfg = TrainingConfig(rounds=5, batch_size=8, clip="auto", clip_count_noise=0.2)
    with pytest.raises(ConfigError, match="clip_count_noise"):
        plan_silos(fed, make_algorithm("fedavg"), cfg)


def test_a_white_box_probe_refuses_auto_clip():
    """An audit's probe attached to a clip = "auto" rule is refused (the audit assumes a
    fixed C), in the simulator as in any rule built with both."""
    import dataclasses

    class Probe:  # attaches itself as the audit's DiracCanaries does
        def attach(self, rule):
            return dataclasses.replace(rule, probe=self)

    with pytest.raises(ConfigError, match="cannot be audited"):
        run(heart(), TrainingConfig(rounds=1, clip="auto"), probe=Probe())


def test_local_dp_methods_refuse_auto_clip():
    from silofl.data.mnist import load_dirichlet_mnist
    fed = load_dirichlet_mnist(num_silos=3, train_per_silo=40, test_per_silo=10, seed=0)
    cfg = TrainingConfig(rounds=2, clip="auto")
    with pytest.raises(ConfigError, match="clip = \"auto\""):
        plan_silos(fed.with_targets(PrivacyTarget(1.0, 1e-5)), make_algorithm("fedavg_ldp"),
                   cfg)


def test_cli_refuses_a_bad_quantile_with_exit_2(tmp_path):
    from typer.testing import CliRunner

    from silofl.cli import app
    res = CliRunner().invoke(app, ["run", "--out", str(tmp_path), "--set",
                                   "training.clip=\"auto\"", "--set",
                                   "training.clip_quantile=1.5", "--set",
                                   "budget.scratch=true"])
    assert res.exit_code == 2, res.output
    assert "clip_quantile" in " ".join((res.stderr or res.output).split())
    assert not any(tmp_path.iterdir())


# --- over the network ---------------------------------------------------------------------

@pytest.mark.network
def test_network_silos_track_their_own_clip_as_the_simulator(tmp_path):
    """server.toml [job] clip = "auto": the silo and server programs (in-process) give the
    per-silo simulator's models and clips, each store holds exactly its adaptive-clipping
    steps, and a restarted silo resumes with the clip it had (its state)."""
    pytest.importorskip("flwr")
    from silofl.privacy.budget import BudgetStore
    from silofl.runtime.network.jobspec import job_algorithm, job_config, job_model
    from silofl.runtime.network.server import ServerProgram, load_server_config
    from silofl.runtime.network.silo import SiloProgram
    from silofl.runtime.network.silo_config import load_silo_config
    from test_network import DELTA as NET_DELTA  # tests/ is on the import path
    from test_network import _drive, _store_events, consortium, edit_toml
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(1.0, NET_DELTA))
    w = consortium(tmp_path, job={"method": "mrmtl", "rounds": 3, "clip": "auto",
                                  "clip_quantile": 0.6})
    for p in w["silos"].values():
        edit_toml(p, "silo", methods=["mrmtl"])
    srv = ServerProgram(load_server_config(w["server"]))
    assert job_config(srv.job).adaptive_clip and job_config(srv.job).clip_quantile == 0.6
    silos = {n: SiloProgram(load_silo_config(p)) for n, p in w["silos"].items()}
    _drive(srv, silos, 3)
    alg = job_algorithm(srv.job)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(fed, job_model(srv.job), alg, job_config(srv.job), hosting="per_silo",
                       store=BudgetStore(tmp_path / "sim.sqlite"))
    for k, (n, s) in enumerate(silos.items()):
        np.testing.assert_array_equal(alg.personal_models(s.state, srv.server)[0],
                                      res.params[k])
        clip = s.trainer.rule.adaptive.clip
        assert clip[0] == res.plans[k].final_clip != 0.3
        got, status = _store_events(s.cfg.budget_store, n)
        assert got == _store_events(tmp_path / "sim.sqlite", n)[0]
        assert all(e.startswith("AdaptiveClipDpEvent") for e in got)
        assert sum(got.values()) == 3 * res.plans[k].steps_per_pass
        fresh = SiloProgram(load_silo_config(w["silos"][n]))
        assert fresh.resume() and fresh.done == 3
        np.testing.assert_array_equal(fresh.trainer.rule.adaptive.clip, clip)


# --- clip_quantile = "auto": the target from the noise level -------------------------------

@pytest.mark.parametrize("r", [0.2, 0.5, 1.0])
def test_auto_quantile_minimises_the_bias_variance_error_of_exponential_norms(r):
    """Norms ~ Exp(scale 1): bias B(C) = e^(−C) (per example, aligned), noise r·C. The C
    minimising B² + r²C² on a fine grid is the auto γ's quantile −log(1 − γ) to 1e-3, where
    γ is inside the clamp; r ↦ γ decreases (a noisier silo aims lower)."""
    from silofl.privacy.adaptive_clip import QUANTILE_MAX, QUANTILE_MIN, auto_quantile
    grid = np.linspace(1e-4, 10, 200_001)
    c_star = grid[np.argmin(np.exp(-2 * grid) + (r * grid) ** 2)]
    gamma = float(auto_quantile(r, 1, 1.0))
    want = 1 - np.exp(-c_star)
    assert gamma == pytest.approx(np.clip(want, QUANTILE_MIN, QUANTILE_MAX), abs=1e-3)
    # r = σ_Δ√P/m: the same r from other public pieces gives the same γ
    assert float(auto_quantile(2 * r, 16, 8.0)) == pytest.approx(gamma, abs=1e-12)


def test_auto_quantile_is_clamped_and_monotone():
    from silofl.privacy.adaptive_clip import QUANTILE_MAX, QUANTILE_MIN, auto_quantile
    g = auto_quantile(np.geomspace(1e-4, 1e3, 50), 1, 1.0)
    assert np.all(np.diff(g) <= 0) and g[0] == QUANTILE_MAX and g[-1] == QUANTILE_MIN


def test_auto_quantile_tracker_uses_each_silos_target_and_the_plan_reports_it():
    """A tracker with quantile "auto" moves each silo by its own γ_k (checked against one
    hand step), and a run's plans state the count release, σ_b, σ_Δ, the final C_k and γ_k."""
    from silofl.privacy.adaptive_clip import auto_quantile
    sd, m = np.array([0.5, 4.0]), np.array([10.0, 10.0])
    t = QuantileClip(np.array([1.0, 1.0]), "auto", 0.1, np.array([1.0, 1.0]), sd, m)
    t.update(np.arange(2), np.array([5, 5]), np.array([10, 10]), np.zeros(2), num_params=9)
    gam = auto_quantile(sd, 9, m)
    assert gam[0] > gam[1]
    np.testing.assert_allclose(t.clip, np.exp(-0.1 * (0.5 - gam)), rtol=1e-12)
    np.testing.assert_allclose(t.target, gam, rtol=1e-12)
    cfg = TrainingConfig(rounds=2, batch_size=8, lr=0.1, clip="auto", clip_quantile="auto",
                         noise="seeded")
    cfg.validate()
    r = run(heart(2.0), cfg, "fedavg")
    for p in r.plans:
        d = p.to_dict()
        assert 0.3 <= d["clip_target_quantile"] <= 0.9 and d["final_clip"] > 0
        assert d["gradient_noise_multiplier"] > d["noise_multiplier"]
        assert "sensitivity ½" in d["clip_release"] and "count_noise" in d["clip_release"]


def test_a_quantile_that_is_not_auto_or_a_fraction_is_refused():
    with pytest.raises(ConfigError, match="clip_quantile"):
        TrainingConfig(clip="auto", clip_quantile="median").validate()
    TrainingConfig(clip="auto", clip_quantile="auto").validate()


def test_run_outputs_state_the_count_release_for_a_regulator(tmp_path):
    """summary.json, privacy_report.json and every model card of a clip = "auto" run name
    σ_b, σ_Δ (> σ), the final C_k and γ_k of each silo and what the count released."""
    import json

    from silofl.config.input import load_config
    from silofl.experiments.run import run as run_job
    cfg = load_config(None, ["training.rounds=2", 'training.clip="auto"', "budget.scratch=true",
                             'training.methods=["fedavg"]', 'privacy.noise="seeded"'])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = run_job(cfg, tmp_path)
    d = rep.run_dir
    summary = json.loads((d / "summary.json").read_text())["methods"][0]["adaptive_clip"]
    report = json.loads((d / "privacy_report.json").read_text())["methods"]["fedavg"]
    cards = sorted((d / "models" / "fedavg").glob("card-*.json"))
    assert len(summary) == len(report) == len(cards) == 4
    by_silo = {e["silo"]: e for e in report}
    for card in cards:
        doc = json.loads(card.read_text())
        c, s, entry = doc["privacy"]["adaptive_clip"], summary[doc["silo"]], by_silo[doc["silo"]]
        assert c == s and s["final_clip"] == entry["final_clip"] > 0
        assert s["count_noise"] > 0 and s["gradient_noise_multiplier"] > entry["noise_multiplier"]
        assert s["clip_target_quantile"] == 0.7 and "sensitivity ½" in s["clip_release"]


def test_the_clip_never_passes_its_public_ceiling():
    """A batch where no example is ever within C (a diverging model) drives C up by
    exp(η(γ − b̃)) every step; clip_max stops it there, and below it C moves freely."""
    t = QuantileClip(clip=np.array([0.3, 0.3]), quantile=0.7, lr=0.5,
                     count_noise=np.array([1e-9, 1e-9]), gradient_noise=np.ones(2),
                     expected_batch=np.array([10.0, 10.0]), ceiling=2.0)
    for _ in range(200):  # silo 0: nothing within C; silo 1: everything within C
        t.update(np.arange(2), np.array([0.0, 10.0]), np.array([10.0, 10.0]), np.zeros(2))
    assert t.clip[0] == 2.0 and 0 < t.clip[1] < 0.3
    with pytest.raises(ConfigError, match="clip_max"):
        TrainingConfig(clip="auto", clip_init=0.3, clip_max=0.1).validate()
