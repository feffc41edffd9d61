"""The membership audit of DP federated trees (`silofl.audit.gbdt`) through the audit
engine: the honest run stays below its claim, the broken variant "noise off" is caught,
and the canaries really are in the trained data. Seeded; a few seconds in all."""

from __future__ import annotations

import math

import numpy as np
import pytest

import silofl
from silofl.algorithms.dp_gbdt import train_dp_gbdt
from silofl.audit import audit_gbdt
from silofl.audit.gbdt import CYCLIC_PER_LEAF, GbdtMechanism, _audit
from silofl.audit.selftest import NOISE_OFF, self_test_gbdt
from silofl.data.federation import Federation, Silo
from silofl.errors import ConfigError

#: histogram splits, as audited before cyclic splits became the default
TREES = {"trees": 8, "depth": 3, "splits": "histogram", "lam": 1.0}


def _fed(eps: float, n: int = 1000, k: int = 3, seed: int = 0,
         task: str = "binary", d: int = 5) -> Federation:
    rng = np.random.default_rng(seed)

    def label(X: np.ndarray) -> np.ndarray:
        if task == "regression":
            return np.sin(3 * X[:, 0]) + X[:, 1]
        return ((X[:, 0] * X[:, 1] > 0) ^ (X[:, 2] > 0.5)).astype(int)

    silos = []
    for i in range(k):
        X, Xt = rng.uniform(-1, 1, (n, d)), rng.uniform(-1, 1, (n // 4, d))
        silos.append(Silo(f"s{i}", X, label(X), Xt, label(Xt),
                          silofl.PrivacyTarget(eps, 1e-5)))
    return Federation(silos, [f"x{j}" for j in range(d)], task, 2 if task == "binary" else 0)


@pytest.mark.parametrize("eps,seed", [(1.0, 11), (4.0, 12)])
def test_honest_run_stays_below_the_claim(eps, seed):
    rep = audit_gbdt(_fed(eps), silo="s0", canaries=600, seed=seed, **TREES)
    (row,) = rep.rows
    assert row.claimed_epsilon == pytest.approx(eps, rel=1e-2)  # the ledger's, ≤ target
    assert row.lower_bound < row.claimed_epsilon and not row.violation
    assert row.details["canaries"] == 600 and set(s["score"] for s in row.details["tries"]) \
        == {"white-box", "black-box"}
    assert rep.methods == ["dp_gbdt"] and rep.view == "trees"


@pytest.mark.parametrize("eps,m", [(1.0, 200), (4.0, 1000)])
def test_noise_off_is_caught(eps, m):
    rep = self_test_gbdt(_fed(eps), silo="s0", canaries=m, seed=21, **TREES)
    honest, broken = rep.rows
    assert honest.mechanism == "as run" and not honest.flagged
    assert broken.mechanism == NOISE_OFF and math.isinf(broken.true_epsilon)
    # the ledger still claims the target: the noise-off bound refutes it
    assert broken.claimed_epsilon == pytest.approx(eps, rel=1e-2)
    assert broken.flagged and broken.lower_bound > broken.claimed_epsilon
    assert rep.passed


@pytest.mark.parametrize("eps,seed", [(1.0, 31), (4.0, 32)])
def test_default_cyclic_trees_honest_below_the_claim_and_noise_off_caught(eps, seed):
    """train_dp_gbdt's defaults (cyclic splits, T = 2d, automatic bins and depth): the
    honest run stays below the claim, noise off is refuted through the canary-only
    leaves of the trees on auditing columns (d = 10: 10 such trees × 63 bins ≥ 1)."""
    rep = self_test_gbdt(_fed(eps, d=10), silo="s0", canaries=800, seed=seed)
    honest, broken = rep.rows
    assert honest.claimed_epsilon == pytest.approx(eps, rel=1e-2)
    assert not honest.flagged and honest.lower_bound < honest.claimed_epsilon
    assert broken.claimed_epsilon == pytest.approx(eps, rel=1e-2)
    assert broken.flagged and broken.lower_bound > broken.claimed_epsilon
    assert rep.passed


def test_cyclic_audit_trains_the_jobs_mechanism():
    """Auto settings resolved on the job's federation as the job resolves them; the
    audited job (auditing columns interleaved, canaries in) has the job's T, D, B and σ
    and spends the same ε; its odd trees split on auditing columns, its even trees on the
    real features in the job's cyclic order; noise off reads every canary right."""
    fed = _fed(1.0, n=400, d=4)
    job = train_dp_gbdt(fed, bounds=(-1.0, 1.0), seed=0)
    mech = GbdtMechanism(fed, np.tile([-1.0, 1.0], (4, 1)), {}, seed=5, noise_scale=0.0)
    B = 2 ** mech.settings.depth
    assert mech.kwargs == {"trees": 8, "depth": mech.settings.depth, "n_bins": B,
                           "splits": "cyclic"} and mech.columns == 4
    assert len(job.ensemble.trees) == 8
    rng = np.random.default_rng(0)
    m = mech.default_canaries("s1")
    assert m == min(400, CYCLIC_PER_LEAF * 4 * (B - 1))
    c = mech.draw("s1", None, rng)
    inc = rng.random(m) < 0.5
    audited, rows = mech.prepare_one({"s1": (c, inc)})
    assert audited.feature_names[:4] == ["x0", "_audit_0", "x1", "_audit_1"]
    result, seen = mech._train(audited, mech.seed)
    for ra, rj in zip(result.report, job.report, strict=True):
        assert ra["sigma"] == pytest.approx(rj["sigma"], rel=1e-9)
        assert ra["epsilon"] == pytest.approx(rj["epsilon"], rel=1e-9)
    assert len(seen) == 8 * 3  # one leaf release per tree and silo
    used = [int(t.feature[0]) for t in result.ensemble.trees]
    assert used == [0, 1, 2, 3, 4, 5, 6, 7]  # x0, a0, x1, a1, ...
    for t in (0, 2):  # the job's tree on x0, x1: the same bins, depth and split points
        mine, its = result.ensemble.trees[t], job.ensemble.trees[t // 2]
        np.testing.assert_array_equal(mine.threshold[mine.feature >= 0],
                                      its.threshold[its.feature >= 0])
    score = mech._scores(audited, result, seen, "s1", c, rows["s1"][1])["white-box"]
    assert np.all(score[inc] > 0) and np.all(score[~inc] < 0)


@pytest.mark.parametrize("kw,m", [({"bins": "private"}, None),
                                  ({"bins": "private", **TREES}, 300)])
def test_private_bins_audited_with_their_release(kw, m):
    """bins = "private": the BINS release (charged, in the claim) is observed and read
    (the auditing columns' fine bins ≥ 1 hold canaries only), the tree cells are cut at
    the server's private edges; honest below the claim, noise off caught."""
    fed = _fed(1.0)
    rep = self_test_gbdt(fed, silo="s0", canaries=m, seed=41, **kw)
    honest, broken = rep.rows
    assert not honest.flagged and honest.lower_bound < honest.claimed_epsilon
    assert broken.flagged and broken.lower_bound > broken.claimed_epsilon
    seen: list = []
    mech = GbdtMechanism(fed, np.tile([-1.0, 1.0], (5, 1)), kw, seed=1)
    c = mech.draw("s0", 20, np.random.default_rng(0))
    audited, _rows = mech.prepare_one({"s0": (c, np.ones(20, bool))})
    ran = train_dp_gbdt(audited, bounds=mech._bounds(audited), observe=seen.append,
                        **mech.kwargs)
    job = train_dp_gbdt(fed, bounds=(-1.0, 1.0), **kw)  # the job's σ and ε, unaudited
    for ra, rj in zip(ran.report, job.report, strict=True):
        assert ra["sigma"] == pytest.approx(rj["sigma"], rel=1e-9)
        assert ra["epsilon"] == pytest.approx(rj["epsilon"], rel=1e-9)
    counts = [r for r in seen if r.tree < 0]
    assert [r.silo for r in counts] == [0, 1, 2]
    assert counts[0].g.shape == (audited.dim, max(32, 4 * mech.n_bins))


def test_canaries_are_trained_on_and_read_one_by_one():
    """Noise off: the white-box score (least-squares inclusion x̂ − ½ over its variance) is
    positive for every included canary and negative for every excluded one; with the same
    canaries left out of the training rows every score is negative (x̂ = 0: no signal), so
    the audit finds nothing unless the canaries are really inserted."""
    fed = _fed(1.0, n=300)
    mech = GbdtMechanism(fed, np.tile([-1.0, 1.0], (5, 1)), dict(TREES), seed=5,
                         noise_scale=0.0)
    rng = np.random.default_rng(0)
    c = mech.draw("s1", 100, rng)
    inc = rng.random(100) < 0.5
    audited, rows = mech.prepare_one({"s1": (c, inc)})
    assert audited.silo("s1").n_train == 300 + inc.sum()
    assert audited.silo("s0").n_train == 300
    assert audited.dim == 5 + c.code.shape[1] == 5 + math.ceil(3 * 100 / 15)
    score = mech.run_one((audited, rows)).scores("s1")["white-box"]
    assert np.all(score[inc] > 0) and np.all(score[~inc] < 0)
    empty = mech.run_one((mech.prepare_one({"s1": (c, np.zeros(100, bool))})[0], rows))
    assert np.all(empty.scores("s1")["white-box"] < 0)


def test_noise_off_keeps_the_claim_and_the_charges():
    """The hook changes only the released noise: the ledgers charge the same events."""
    fed = _fed(2.0, n=200)
    a = train_dp_gbdt(fed, trees=3, depth=2, seed=1)
    b = train_dp_gbdt(fed, trees=3, depth=2, seed=1, noise_scale=0.0)
    for ra, rb in zip(a.report, b.report, strict=True):
        assert ra["sigma"] == rb["sigma"] and ra["events"] == rb["events"]
        assert ra["epsilon"] == pytest.approx(rb["epsilon"], rel=1e-12)
    exact = train_dp_gbdt(fed, trees=3, depth=2, seed=1, private=False)
    # σ = 0 grows the non-private ensemble (same splits; 1e-9 on float sums)
    np.testing.assert_allclose(b.ensemble.predict_margin(fed.silos[0].X_test),
                               exact.ensemble.predict_margin(fed.silos[0].X_test), atol=1e-9)
    with pytest.raises(ConfigError, match="noise_scale"):
        train_dp_gbdt(fed, trees=1, noise_scale=-1.0)


def test_regression_and_subsampling_audit():
    fed = _fed(1.0, n=400, task="regression")
    kw = dict(trees=4, depth=2, clip_g=2.0, subsample=0.5, splits="histogram", lam=1.0)
    honest = audit_gbdt(fed, silo="s2", canaries=300, seed=3, **kw).rows[0]
    assert not honest.violation
    off = _audit(fed, silo="s2", canaries=300, kind="one-run", runs=None, confidence=0.95,
                 seed=3, bounds=(-1.0, 1.0), noise_scale=0.0, trees=kw).rows[0]
    assert off.violation  # the subsampled LLR score reads the unnoised cells too


def test_random_splits_noise_off_caught_through_canary_only_leaves():
    """Random splits release only leaf sums; the random splits fall mostly on auditing
    columns, whose right branches only canaries take: those leaves are read (2^(D+1) sums
    a tree: 20 trees of depth 3 give 320 equations for the 100 canaries' inclusion)."""
    fed, kw = _fed(1.0, n=300), dict(trees=20, depth=3, splits="random")
    off = _audit(fed, silo="s1", canaries=100, kind="one-run", runs=None, confidence=0.95,
                 seed=7, bounds=(-1.0, 1.0), noise_scale=0.0, trees=kw).rows[0]
    assert off.violation and off.details["score"] == "white-box"
    assert not audit_gbdt(fed, silo="s1", canaries=100, seed=7, **kw).rows[0].violation


def test_multi_run_through_the_engine():
    rep = audit_gbdt(_fed(1.0, n=100, k=2), silo="s0", kind="multi-run", runs=8, seed=4,
                     trees=2, depth=2)
    (row,) = rep.rows
    assert row.details["runs"] == 8 and row.lower_bound < row.claimed_epsilon


def test_given_ledgers_are_charged_and_reports_are_written(tmp_path):
    import json

    from silofl.audit import write_audit
    from silofl.audit.report import write_selftest
    from silofl.privacy.ledger import Ledger
    fed = _fed(1.0, n=200)
    leds = [Ledger(s.name, s.target) for s in fed.silos]
    rep = audit_gbdt(fed, silo="s0", canaries=50, seed=2, trees=3, depth=2, ledgers=leds)
    assert not rep.scratch and any("given ledgers" in n for n in rep.notes)
    assert all(0 < led.report()["epsilon"] <= 1.0 + 1e-9 for led in leds)
    assert rep.rows[0].claimed_epsilon == pytest.approx(leds[0].report()["epsilon"])
    json_path, html_path = write_audit(rep, tmp_path / "a")
    assert json.loads(json_path.read_text())["view"] == "trees" and html_path.is_file()
    st = self_test_gbdt(fed, silo="s0", canaries=50, seed=2, trees=3, depth=2)
    assert write_selftest(st, tmp_path / "b")[0].is_file()
    with pytest.raises(ConfigError, match="in-memory ledgers"):
        audit_gbdt(fed, silo="s0", kind="multi-run", runs=8, ledgers=leds)
    with pytest.raises(ConfigError, match="in-memory ledgers"):
        self_test_gbdt(fed, silo="s0", ledgers=leds)


@pytest.mark.parametrize("kwargs,match", [
    ({"canaries": 5000}, "more than"),
    ({"canaries": 1}, "at least 2"),
    ({"seed": 1, "trees": 2, "private": False}, "private"),
    ({"kind": "many"}, "unknown audit kind"),
    ({"confidence": 1.0}, "confidence"),
    ({"bounds": (1.0, -1.0)}, "bounds"),
    ({"edges": np.zeros((5, 3))}, "leave edges out"),
    ({"trees": 0}, "trees must be"),
])
def test_bad_input_is_refused_before_training(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        audit_gbdt(_fed(1.0, n=100), **{"silo": "s0", **kwargs})


def _job(tmp_path, methods='["dp_gbdt"]', scratch="true", unit="example",
         trees='[trees]\ntrees = 5\ndepth = 2\nsplits = "histogram"\n'):
    conf = tmp_path / "job.toml"
    conf.write_text(f'[training]\nmethods = {methods}\nseed = 3\n{trees}'
                    f'[privacy]\nnoise = "seeded"\nunit = "{unit}"\n'
                    f'[budget]\nscratch = {scratch}\n[output]\ndir = ""\n')
    return conf


def test_cli_audits_a_dp_gbdt_job_and_its_self_test(tmp_path):
    """`silofl audit --config` on a dp_gbdt job (heart, 4 hospitals): the trees' audit with
    the job's declared bounds and [trees] settings; --self-test flags noise off."""
    import json

    from typer.testing import CliRunner

    from silofl.cli import app
    conf = _job(tmp_path)
    res = CliRunner().invoke(app, ["audit", "--config", str(conf), "--canaries", "90",
                                   "--out", str(tmp_path / "o"), "-q"])
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "o" / "audit.json").read_text())
    assert rep["view"] == "trees" and rep["methods"] == ["dp_gbdt"] and not rep["violations"]
    assert rep["noise"] == "seeded"  # [privacy] noise = "seeded": canaries and coins too
    assert len(rep["silos"]) == 4 and all(s["details"]["canaries"] == 90 for s in rep["silos"])
    res = CliRunner().invoke(app, ["audit", "--config", str(conf), "--canaries", "90",
                                   "--self-test", "--out", str(tmp_path / "s"), "-q"])
    assert res.exit_code == 0, res.output
    st = json.loads((tmp_path / "s" / "selftest.json").read_text())
    assert st["passed"] and {r["mechanism"] for r in st["rows"] if r["flagged"]} == {NOISE_OFF}


def test_cli_audits_a_default_dp_gbdt_job_and_its_self_test(tmp_path):
    """A job with only methods = ["dp_gbdt"] and default [trees] (cyclic splits, automatic
    trees, depth and bins): `silofl audit` and `--self-test` work, with verdicts."""
    import json

    from typer.testing import CliRunner

    from silofl.cli import app
    conf = _job(tmp_path, trees="")
    res = CliRunner().invoke(app, ["audit", "--config", str(conf), "--out",
                                   str(tmp_path / "o"), "-q"])
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "o" / "audit.json").read_text())
    assert rep["view"] == "trees" and not rep["violations"] and len(rep["silos"]) == 4
    assert any("cyclic splits" in n and "auditing columns" in n for n in rep["notes"])
    res = CliRunner().invoke(app, ["audit", "--config", str(conf), "--self-test", "--out",
                                   str(tmp_path / "s"), "-q"])
    assert res.exit_code == 0, res.output
    st = json.loads((tmp_path / "s" / "selftest.json").read_text())
    assert st["passed"] and {r["mechanism"] for r in st["rows"] if r["flagged"]} == {NOISE_OFF}
    assert len(st["rows"]) == 8


@pytest.mark.parametrize("methods,scratch,unit,match", [
    ('["local", "dp_gbdt"]', "true", "example", "dp_gbdt alone"),
    ('["dp_gbdt"]', "false", "example", "scratch"),
    ('["dp_gbdt"]', "true", "person", "example-level"),
])
def test_cli_refuses_what_the_trees_audit_cannot_take(tmp_path, methods, scratch, unit,
                                                      match):
    from typer.testing import CliRunner

    from silofl.cli import app
    conf = _job(tmp_path, methods, scratch, unit)
    res = CliRunner().invoke(app, ["audit", "--config", str(conf), "--out",
                                   str(tmp_path / "o"), "-q"])
    assert res.exit_code == 2 and match in res.output, res.output
    assert not (tmp_path / "o").exists()
