"""The server-view (white-box) audit: Dirac gradient canaries at the DP-SGD step, the LLR
score, the estimate read through the claimed mechanism family, its power, and the
self-test against weakened copies of the job's mechanism.

Statistical tests state their tolerance; each can fail (a mechanism with less noise, a
missing clip, repeated noise, or a biased estimator would break them)."""

from __future__ import annotations

import functools
import json
import math
import re

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from silofl.audit import estimate as E
from silofl.audit import server
from silofl.audit.tabular import audit
from silofl.audit.whitebox import WEAKENINGS, AuditedModel
from silofl.config import config_from_dict
from silofl.errors import ConfigError
from silofl.models import make_model
from silofl.privacy import evaluate, events

# a mechanism of the size of one heart hospital's job, smaller: 30 passes of 8 steps
STEPS, Q, SIGMA, DELTA = np.full(30, 8), 0.08, 3.0, 1e-4


@functools.lru_cache(None)
def _eps(c: float) -> float:
    return evaluate.epsilon(events.dpsgd_event(Q, SIGMA * c, int(STEPS.sum())), DELTA, "pld")


@pytest.mark.statistical
def test_score_moments_match_a_simulation():
    rng = np.random.default_rng(0)
    for c in (1.0, 0.5):
        inc = np.arange(40_000) < 20_000
        s = E.llr_scores(E.simulate_sums(inc.size, STEPS, Q, SIGMA * c, 1.0, inc, rng),
                         STEPS, Q, SIGMA)
        m0, v0, m1, v1 = E.score_moments(STEPS, Q, SIGMA, c)
        for x, m, v in ((s[~inc], m0, v0), (s[inc], m1, v1)):
            se = math.sqrt(v / x.size)  # 5 standard errors: a wrong moment is far outside
            assert abs(x.mean() - m) < 5 * se and x.var() == pytest.approx(v, rel=0.05)


@pytest.mark.statistical
def test_the_estimate_is_calibrated_and_rarely_flags_the_claimed_mechanism():
    """100 audits of the analytic mechanism as claimed at 95%: the estimate's lower end
    exceeds the claim in ≤ 11 (Binomial(100, 0.05) reaches 12 with probability 0.004),
    and the point estimates centre on the claim."""
    rng = np.random.default_rng(1)
    claim, flags, points = _eps(1.0), 0, []
    for _ in range(100):
        inc = rng.random(4000) < 0.5
        s = E.llr_scores(E.simulate_sums(inc.size, STEPS, Q, SIGMA, 1.0, inc, rng),
                         STEPS, Q, SIGMA)
        e = E.estimate(s[~inc], s[inc], STEPS, Q, SIGMA, _eps, 0.95)
        flags += e["epsilon_lower"] > claim
        points.append(e["epsilon"])
    assert flags <= 11, flags
    assert np.mean(points) == pytest.approx(claim, rel=0.05)


@pytest.mark.statistical
def test_the_power_readout_is_what_a_simulation_of_the_audit_finds():
    n = 1000
    d = E.detectable(STEPS, Q, SIGMA, _eps(1.0), n, n, 0.95, _eps)
    c = d["detectable_noise_scale"]
    assert 1.0 < d["detectable_epsilon"] < 3 * _eps(1.0) and c < 1
    rng = np.random.default_rng(2)

    def rate(scale: float) -> float:
        hits = 0
        for _ in range(120):
            inc = np.arange(2 * n) < n
            s = E.llr_scores(E.simulate_sums(2 * n, STEPS, Q, SIGMA * scale, 1.0, inc, rng),
                             STEPS, Q, SIGMA)
            hits += E.estimate(s[~inc], s[inc], STEPS, Q, SIGMA, _eps, 0.95)[
                "epsilon_lower"] > _eps(1.0)
        return hits / 120
    assert rate(c) >= 0.87          # 95% expected; 120 tries: 4 standard errors below
    assert rate(min(1.0, c * 1.25)) < 0.95  # a smaller break is not reliably seen


def test_the_audited_model_predicts_like_its_model_and_only_noise_reaches_the_tail():
    base = make_model("logistic", 3)
    m = AuditedModel(base, 5)
    w = np.r_[np.array([0.5, -1.0, 2.0, 0.1]), np.arange(5.0)]
    X, y = np.random.default_rng(0).normal(size=(7, 3)), np.array([0, 1, 1, 0, 1, 0, 1])
    np.testing.assert_allclose(m.predict(w, X), base.predict(w[:4], X), rtol=1e-12)
    np.testing.assert_allclose(m.loss(w, X, y), base.loss(w[:4], X, y), rtol=1e-12)
    g = m.clipped_grad_sum(w[None], X[None], y[None], np.ones((1, 7)), 1.0)
    assert g.shape == (1, 9) and np.all(g[0, 4:] == 0)


@pytest.fixture(scope="module")
def small_heart():
    # seeded noise: each audit below is one fixed draw (a verdict from fresh noise would be
    # wrong ~5% of the time by design); the statistical tests above and below use fresh draws
    return config_from_dict({"training": {"methods": ["fedavg"], "rounds": 10, "seed": 11},
                             "privacy": {"noise": "seeded"},
                             "budget": {"scratch": True}, "output": {"dir": ""}})


def test_the_canaries_see_the_claimed_noise_and_the_clipped_norm(small_heart):
    """Out-canaries' per-pass sums have variance L·σ² (units of C), in-canaries' mean is
    q·L (their 8·C gradient clipped to C): the probe sees the mechanism as accounted."""
    rep = audit(small_heart, silo="Cleveland", canaries=20_000, seed=3)
    (row,) = rep.rows
    d = row.details
    assert d["passes"] == 10 and d["view"] == "server" and not row.violation
    assert row.estimate_lower is not None and row.estimate_lower < row.claimed_epsilon
    e = d["estimate"]
    # the estimate's noise scale: 1 (σ as claimed) within its interval
    assert e["noise_scale_at_lower"] > 1 > 0.85 * e["noise_scale"]


def test_the_server_audit_writes_its_verdict_and_power(small_heart, tmp_path):
    from silofl.audit import write_audit
    rep = audit(small_heart, canaries=2000, seed=4)
    data = json.loads(write_audit(rep, tmp_path)[0].read_text())
    assert data["view"] == "server" and data["violations"] == []
    row = data["silos"][0]
    assert {"estimate_lower", "lower_bound"} <= set(row)
    d = row["details"]
    assert d["estimate"]["assumes"].startswith("an estimate, not proof")
    assert d["detectable_epsilon"] > row["claimed_epsilon"]
    assert set(d["epsilon_at_noise_scale"]) == {"0.5", "0.25"}
    assert "Dirac" in " ".join(data["notes"])
    assert "estimate" in (tmp_path / "audit.html").read_text()


@pytest.mark.slow
@pytest.mark.statistical
def test_real_audits_of_the_real_mechanism_rarely_flag(small_heart):
    """100 audits of the real job (a small one: one method, 3 rounds, 2000 canaries) at
    95%: at most 11 flagged (Binomial(100, 0.05) reaches 12 with probability 0.004)."""
    cfg = config_from_dict({"training": {"methods": ["local"], "rounds": 3},
                            "budget": {"scratch": True}, "output": {"dir": ""}})
    flags = sum(bool(audit(cfg, silo="Hungary", canaries=2000).violations) for _ in range(100))
    assert flags <= 11, flags


@pytest.mark.slow
def test_self_test_flags_every_weakened_copy(small_heart):
    from silofl.audit.selftest import self_test
    rep = self_test(small_heart, silo="Hungary", canaries=20_000, seed=5)
    by = {r.mechanism: r for r in rep.rows}
    assert set(by) == {"as run", *WEAKENINGS, "uncharged standardization",
                       "release noise x1/4"}
    assert not any(r.flagged for r in rep.rows if r.mechanism == "as run")
    for name in [*WEAKENINGS, "uncharged standardization", "release noise x1/4"]:
        r = by[name]
        if name == "shared noise":  # one audited silo: no other silo's noise to compare
            assert math.isnan(r.true_epsilon) and not r.must_flag
            continue
        assert r.must_flag and r.flagged, (name, r)
    assert by["noise x1/2"].true_epsilon >= 2 * by["as run"].claimed_epsilon
    assert by["clipping off"].true_epsilon == math.inf and rep.passed


def test_bad_input_is_refused_before_any_job(small_heart, tmp_path):
    from silofl.audit.canaries import Canaries
    with pytest.raises(ConfigError, match="unknown audit view"):
        audit(small_heart, view="side")
    with pytest.raises(ConfigError, match="between 20 and"):
        audit(small_heart, canaries=5)
    with pytest.raises(ConfigError, match="gradient canaries, not records"):
        audit(small_heart, canaries=Canaries(np.zeros((1, 13)), np.zeros(1)))
    real = config_from_dict({"budget": {"store": str(tmp_path / "s.sqlite")},
                             "output": {"dir": ""}})
    with pytest.raises(ConfigError, match="scratch"):
        audit(real, kind="multi-run")
    assert not (tmp_path / "s.sqlite").exists()


def test_cli_self_test_needs_a_scratch_store_and_view_is_checked(tmp_path, monkeypatch):
    from silofl.cli import app
    monkeypatch.setenv("SILOFL_HOME", str(tmp_path / "home"))
    res = CliRunner().invoke(app, ["audit", "--self-test", "--store", str(tmp_path / "b.db"),
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "scratch" in res.output
    assert not (tmp_path / "b.db").exists() and not (tmp_path / "o").exists()
    res = CliRunner().invoke(app, ["audit", "--scratch", "--view", "side"])
    assert res.exit_code == 2 and "unknown audit view" in res.output


def test_estimate_refuses_too_few_canaries():
    with pytest.raises(ConfigError, match="at least 2"):
        E.mu_hat(np.zeros(1), np.zeros(5), 0.95)
    assert stats.norm.ppf(0.95) > 1  # the one-sided quantile the estimate uses
    assert server.canary_count(None, 139, 30) < server.DEFAULT_CANARIES


def test_the_release_view_audits_the_preprocessing_statistics(tmp_path, monkeypatch):
    from silofl.cli import app
    monkeypatch.setenv("SILOFL_HOME", str(tmp_path / "home"))
    conf = tmp_path / "rel.toml"
    conf.write_text('[data]\nsource = "heart"\nstandardize = "private"\n')
    res = CliRunner().invoke(app, ["audit", "-c", str(conf), "--view", "release", "--kind",
                                   "multi-run", "--runs", "30", "--scratch", "--silo",
                                   "Hungary", "--out", str(tmp_path / "o"), "-q"])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "o" / "audit.json").read_text())
    assert data["view"] == "release" and data["violations"] == []
    (row,) = data["silos"]
    assert 0.09 < row["claimed_epsilon"] <= 0.1  # the release's share of ε = 1
    res = CliRunner().invoke(app, ["audit", "-c", str(conf), "--view", "release"])
    assert res.exit_code == 2 and "scratch" in res.output


@pytest.mark.slow
def test_the_server_view_audits_a_torch_model():
    cfg = config_from_dict({"model": {"name": "mlp"},
                            "training": {"methods": ["fedavg"], "rounds": 2, "seed": 3},
                            "privacy": {"noise": "seeded"},
                            "budget": {"scratch": True}, "output": {"dir": ""}})
    (row,) = audit(cfg, silo="Hungary", canaries=2000, seed=6).rows
    e = row.details["estimate"]
    assert not row.violation and 0 < e["epsilon"] < 3 * row.claimed_epsilon
    assert row.details["passes"] == 2


def test_power_is_infinite_when_not_even_a_noiseless_copy_is_flagged():
    # one pass of 4 steps at q = 1/4, 10 + 10 canaries: μ saturates near 1.3 as the noise
    # vanishes, so no copy is flagged with 97.5% confidence; the accountant must not be
    # asked for ε at noise × 0.001 (terabytes of PLD grid at a job's σ)
    asked: list[float] = []

    def eps(c: float) -> float:
        asked.append(c)
        return 1 / c

    p = E.detectable(np.array([4]), 0.25, 0.5, 1.0, 10, 10, 0.975, eps)
    assert p["detectable_epsilon"] == math.inf and p["detectable_noise_scale"] == 0
    assert min(asked) >= 0.5
    # and a setting with power still gets a finite answer above the claim
    p = E.detectable(STEPS, Q, SIGMA, _eps(1.0), 2000, 2000, 0.975, _eps)
    assert _eps(1.0) < p["detectable_epsilon"] < math.inf


def test_true_epsilon_of_a_copy_below_the_pld_range_is_rdps(monkeypatch):
    from collections import Counter

    import dp_accounting as dpa

    from silofl.audit.engine import Claim
    counts = Counter(events.flatten(events.dpsgd_event(Q, 0.5, 360)))
    claim = Claim(evaluate.epsilon(events.compose(counts), DELTA, "pld"), 1.0, DELTA)
    o = server.Observed(np.zeros((4, 1)), np.array([360]), np.array([0.5]), np.zeros(1, int),
                        Q, np.array([True, False, True, False]), claim, counts)
    real = server.tightest

    def guarded(event, delta):  # the PLD grid at σ < 0.25 outgrows memory: never go there
        for e in events.flatten(event):
            if isinstance(e, dpa.PoissonSampledDpEvent):
                assert e.event.noise_multiplier >= 0.25, "PLD asked below its range"
        return real(event, delta)

    monkeypatch.setattr(server, "tightest", guarded)
    f = server.true_epsilon_fn(o)
    assert f(1.0) == pytest.approx(claim.epsilon, rel=1e-6)
    low = f(0.01)  # σ = 0.005
    assert low == pytest.approx(evaluate.epsilon(events.dpsgd_event(Q, 0.005, 360), DELTA,
                                                 "rdp"), rel=1e-9)
    assert low > f(0.6) > f(1.0)


@pytest.mark.parametrize("args", [
    ["--self-test", "--kind", "multi-run"], ["--self-test", "--view", "model"],
    ["--self-test", "--runs", "5"], ["--self-test", "--canaries", "0"],
    ["--runs", "-3"], ["--view", "model", "--runs", "7"],
    ["--view", "release", "--kind", "multi-run", "--canaries", "50"],
    ["--view", "release", "--runs", "5"], ["--view", "release", "--canaries", "5"],
    ["--view", "release", "--kind", "multi-run", "--runs", "-1"]])
def test_cli_refuses_options_the_mode_would_ignore(tmp_path, monkeypatch, args):
    # each was silently ignored (or --canaries 0 read as the default) and the audit ran
    from silofl.cli import app
    monkeypatch.setenv("SILOFL_HOME", str(tmp_path / "home"))
    conf = tmp_path / "rel.toml"
    conf.write_text('[data]\nsource = "heart"\nstandardize = "private"\n'
                    '[training]\nrounds = 1\n')
    res = CliRunner().invoke(app, ["audit", "-c", str(conf), "--scratch", "-q", "--out",
                                   str(tmp_path / "o"), *args])
    assert res.exit_code == 2, res.output
    assert not (tmp_path / "o").exists()


def test_a_local_dp_method_is_refused_before_any_budget(tmp_path):
    # fedavg_ldp has no DP-SGD step: the probe saw nothing and the analysis crashed
    # (ValueError) after the audit job had run and been charged
    store = tmp_path / "real.sqlite"
    cfg = config_from_dict({"training": {"methods": ["fedavg_ldp"], "rounds": 1},
                            "privacy": {"epsilon": 20.0, "delta": 1e-4},
                            "budget": {"store": str(store)}, "output": {"dir": ""}})
    with pytest.raises(ConfigError, match="local DP"):
        audit(cfg, canaries=100, seed=0)
    assert not store.exists()
# --- what a reader sees: the tables fit 80 columns, the verdict is never cut -------------

LONG_NAMES = ["Hôpital Necker-Enfants Malades", "St Mary's Hospital, London",
              "Rural Clinic 7", "VA Long Beach"]


def _render(renderable, width: int = 80) -> str:
    import io

    from rich.console import Console
    con = Console(width=width, record=True, file=io.StringIO())
    con.print(renderable)
    return con.export_text()


def _fits(text: str, names) -> None:
    """No line over 80 columns, nothing cut with '…', every word of every name shown."""
    assert max(map(len, text.splitlines())) <= 80, text
    assert "…" not in text, text
    for word in (w for n in names for w in n.split()):
        assert word in text, (word, text)


def test_the_audit_tables_fit_80_columns_and_never_cut_a_name_or_verdict(small_heart):
    from dataclasses import replace

    from silofl.audit.report import audit_table
    rep = audit(small_heart, canaries=2000, seed=4)
    # the verdicts are set here (the real ones are random: ~5% false alarms by design)
    base = replace(rep.rows[0], lower_bound=0.1, estimate_lower=0.5)
    rows = [replace(base, silo=n) for n in LONG_NAMES]
    rows[1] = replace(rows[1], estimate_lower=9.0)  # an estimated violation
    text = _render(audit_table(replace(rep, rows=rows)))
    _fits(text, LONG_NAMES)
    assert text.count("│ consistent") == 3 and text.count("│ VIOLATION") == 1
    assert len(re.findall(r"\d\.\d{3}–\d\.\d{3}", text)) == 4  # each estimate whole
    assert "How each silo was attacked" in text
    # the black-box (model) view too, at its real settings
    model = audit(small_heart, view="model", canaries=50, seed=1)
    rows = [replace(model.rows[0], silo=n, lower_bound=0.0) for n in LONG_NAMES]
    text = _render(audit_table(replace(model, rows=rows)))
    _fits(text, LONG_NAMES)
    assert text.count("│ consistent") == 4 and "if Gaussian†" in text


def test_the_self_test_table_fits_80_columns_and_names_each_failure(tmp_path):
    from silofl.audit.report import selftest_table, write_selftest
    from silofl.audit.selftest import SelfTestReport, SelfTestRow
    rows = []
    for mech, true_eps, flagged in (("as run", 1.0, True), ("noise x1/2", 2.25, False),
                                    ("noise x1/4", 5.3, True),
                                    ("uncharged standardization", math.inf, True)):
        for n in LONG_NAMES:
            rows.append(SelfTestRow(mech, "", n, 1.0, true_eps, 0.5, 0.9, flagged, 1.17))
    rep = SelfTestReport(rows, confidence=0.95, canaries=50_000, seconds=60.0,
                         notes=["a note"])
    text = _render(selftest_table(rep))
    _fits(text, LONG_NAMES + ["uncharged standardization"])
    # each failure is named on its row (and once in the caption)
    assert text.count("FALSE") == 5 and text.count("MISSED") == 5
    assert text.count("yes (ok)") == 8 and "∞" in text
    assert text.count("noise x1/2") == 1  # the mechanism is named once, on its first row
    js, page = write_selftest(rep, tmp_path)
    data = json.loads(js.read_text())
    assert not data["passed"] and data["nonfinite"] and "null" in data["nonfinite_means"]
    html = page.read_text()
    assert "FAILED" in html and "must be flagged" in html and "a note" in html


def test_the_cli_says_whether_a_violation_is_proved_or_estimated(small_heart, tmp_path,
                                                                 capsys):
    from dataclasses import replace

    import typer

    from silofl.audit import write_audit
    from silofl.cli.audit import _audit_footer, _verdict_line
    rep = audit(small_heart, canaries=2000, seed=4)
    rep = replace(rep, rows=[replace(r, lower_bound=0.1, estimate_lower=0.5)
                             for r in rep.rows])  # no violation, whatever the noise drew
    line = _verdict_line(rep)
    det = rep.rows[0].details["detectable_epsilon"]
    assert line.startswith("Verdict: no violation") and f"{det:.2f} or more" in line
    rows = [replace(rep.rows[0], silo="A", lower_bound=5.0),
            replace(rep.rows[0], silo="B", estimate_lower=5.0)]
    bad = replace(rep, rows=rows)
    with pytest.raises(typer.Exit) as exc:
        _audit_footer(bad, write_audit(bad, tmp_path), "Methods: fedavg.")
    assert exc.value.exit_code == 3
    out = " ".join(capsys.readouterr().err.split())
    assert "VIOLATION A: proved: the rigorous lower bound exceeds" in out
    assert "VIOLATION B: estimated (not proof)" in out


@pytest.mark.parametrize("missed", [False, True])
def test_cli_self_test_says_passed_or_failed(tmp_path, monkeypatch, missed):
    """The self-test's verdict line and exit code (the audits themselves are replaced by a
    fixed report: their statistics are tested above)."""
    from silofl.audit import selftest
    from silofl.cli import app
    rows = [selftest.SelfTestRow("as run", "", "Cleveland", 1.0, 1.0, 0.2, 0.9, False, 1.17),
            selftest.SelfTestRow("noise x1/2", "", "Cleveland", 1.0, 2.25, 1.0, 2.1,
                                 not missed, 1.17)]
    monkeypatch.setattr(selftest, "self_test", lambda cfg, **kw: selftest.SelfTestReport(
        rows, confidence=0.95, canaries=50_000, seconds=1.0))
    res = CliRunner().invoke(app, ["audit", "--self-test", "--scratch",
                                   "--out", str(tmp_path / "o")])
    out = " ".join(res.output.split())
    if missed:
        assert res.exit_code == 3 and "SELF-TEST FAILED" in out and "MISSED" in out
    else:
        assert res.exit_code == 0 and "Self-test passed" in out, out
    assert (tmp_path / "o" / "selftest.json").exists()


def test_the_clipping_check_sees_a_model_that_clips_records_loosely():
    """The canaries are clipped by the rule's formula, so a fault in a model's own
    per-example clipping never reaches them (attacker review): the check sends public
    synthetic records through the run's clipped sum and finds any above C."""
    from silofl.audit.whitebox import clipping_check
    from silofl.training.dpsgd import GradientRule
    rng = np.random.default_rng(0)
    model = make_model("logistic", 5)
    good = clipping_check(GradientRule(1.0, np.array([1.0])), model, (5,), "binary", 2, rng)
    assert good["ok"] and 0.99 < good["ratio"] <= 1.0  # large records reach C, none above
    loose = WEAKENINGS["model clips at 4C"][1](GradientRule(1.0, np.array([1.0])))
    bad = clipping_check(loose, model, (5,), "binary", 2, rng)
    assert not bad["ok"] and bad["ratio"] == pytest.approx(4.0, rel=1e-3)


def test_the_white_box_release_audit_certifies_the_release_and_flags_less_noise():
    """One release with canary rows (each a record's full sensitivity): the release as
    run is consistent and its estimate is near its claim; noise × ¼ (true ε ≈ 4× the
    claim) and noise × 0.1 — which the record-canary multi-run audit misses — are flagged."""
    from silofl.audit.release_server import audit_job
    cfg = config_from_dict({"data": {"standardize": "private"},
                            "training": {"seed": 2}, "privacy": {"noise": "seeded"},
                            "budget": {"scratch": True}, "output": {"dir": ""}})
    (real,) = audit_job(cfg, silo="Hungary", seed=1)
    e = real.details["estimate"]
    assert not real.violation and 0.5 * real.claimed_epsilon < e["epsilon"] < 1.5 * \
        real.claimed_epsilon
    for factor in (0.25, 0.1):
        (weak,) = audit_job(cfg, silo="Hungary", seed=1, noise_factor=factor)
        assert weak.violation and weak.estimate_lower > 2 * weak.claimed_epsilon
    real_store = config_from_dict({"data": {"standardize": "private"},
                                   "budget": {"store": "x.sqlite"}, "output": {"dir": ""}})
    with pytest.raises(ConfigError, match="scratch"):
        audit_job(real_store)
