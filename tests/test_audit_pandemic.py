"""`silofl pandemic audit`: the node-level pipeline (real `pipeline.train`, its σ and
accounting) audited with canary persons on a small synthetic outbreak. The real mechanism
stays below its claim under both adjacencies; a deliberately broken variant (replayed noise,
patched in here only) is flagged above it; canary slots follow the replacement relation the
accountant states; bad input is refused before any budget is touched."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from silofl.errors import ConfigError
from silofl.pandemic import synthesize
from silofl.pandemic.audit import (
    audit_pandemic,
    canary_scores,
    insert_persons,
    make_canary_persons,
    neighbouring_text,
)
from silofl.pandemic.pipeline import PandemicConfig, train
from silofl.pandemic.regions import build_region, region_groups
from silofl.pandemic.synth import generate_outbreak
from silofl.privacy.budget import BudgetStore
from silofl.privacy.randomness import Randomness

OUTBREAK = dict(persons=3000, regions=2, seed=7)
CLAIM = 0.5  # small, so that 20 + 20 runs can refute it when the mechanism is broken


def _cfg(**kw) -> PandemicConfig:
    return PandemicConfig(**{"rounds": 2, "batch_size": 128, "S": 10, "epsilon": CLAIM,
                             **kw})


@pytest.fixture(scope="module")
def data():
    return generate_outbreak(**OUTBREAK).to_pandemic_data()


@pytest.fixture(scope="module")
def region(data):
    return region_groups(data, _cfg())[0].name


@pytest.fixture
def replayed_noise(monkeypatch):
    """Broken: every 'secure' stream (batch draws and Gaussian noise) replays one seed."""
    fixed = staticmethod(lambda: Randomness.seeded(1234))
    monkeypatch.setattr(Randomness, "os_entropy", fixed)
    if hasattr(Randomness, "secure"):
        monkeypatch.setattr(Randomness, "secure", fixed)


@pytest.mark.parametrize("adjacency", ["node+edges", "node"])
def test_canary_slots_are_replacement_neighbours(data, region, adjacency):
    cfg = _cfg(adjacency=adjacency)
    c = make_canary_persons(data, cfg, region, 4, 3, np.random.default_rng(0))
    inc = np.array([True, False, True, False])
    d, slots = insert_persons(data, c, inc, adjacency)
    assert d.num_persons == data.num_persons + 4 and data.num_persons == 3000  # input intact
    assert np.all(np.diff(d.pids) > 0) and np.all(d.region[slots] == data.region[c.contacts[:, 0]])
    n = {r.name: r.n for r in region_groups(data, cfg)}[region]
    assert {r.name: r.n for r in region_groups(d, cfg)}[region] == n + 4  # same n in D, D′
    net = d.network
    deg = np.bincount(np.concatenate([net.src, net.dst]), minlength=d.num_persons)[slots]
    # in: its 3 contacts; out: none (node+edges) or the same 3 (node: the graph is public)
    assert deg.tolist() == ([3, 0, 3, 0] if adjacency == "node+edges" else [3, 3, 3, 3])
    assert np.all(d.states[slots[~inc]] == 0)
    assert set(np.diff(d.states[slots[inc]].astype(int), axis=1).ravel()) == {1, -1}
    # an "in" canary is a positive example in every training window; "out" in none
    r = build_region(d, region, d.region_members(int(d.region[slots[0]])), cfg)
    local = np.searchsorted(r.persons, slots)
    lo, hi = r.features.train_window_range
    for we in (lo, (lo + hi) // 2, hi):
        assert r.features.labels(local, we).tolist() == [1, 0, 1, 0]


def test_scores_see_the_canary_through_the_released_model(data, region):
    """The black-box score is the canary's loss under the region's released model: a model
    that predicts infection for everyone scores the (always infected) canaries higher."""
    cfg = _cfg(private=False, rounds=1)
    c = make_canary_persons(data, cfg, region, 5, 3, np.random.default_rng(1))
    d, slots = insert_persons(data, c, np.ones(5, bool), cfg.adjacency)
    pm = train(d, cfg)
    low = canary_scores(d, pm, region, slots)
    pm.weights[:, -1] += 5.0  # bias up: every prediction nearer to "infected"
    high = canary_scores(d, pm, region, slots)
    assert low.shape == (5,) and np.all(np.isfinite(low)) and np.all(high > low)


@pytest.mark.parametrize("adjacency", ["node+edges", "node"])
def test_real_mechanism_stays_below_one_run(data, region, adjacency, tmp_path):
    from silofl.audit import write_audit
    rep = audit_pandemic(data, _cfg(adjacency=adjacency), region=region, canaries=300)
    (row,) = rep.rows
    assert row.claimed_epsilon == pytest.approx(CLAIM, rel=1e-3) and row.delta > 0
    assert not row.violation and row.lower_bound < row.claimed_epsilon, row.details
    assert row.details["canaries"] == 300 and 100 < row.details["included"] < 200
    assert rep.scratch and any("scratch" in n for n in rep.notes)
    out = json.loads(write_audit(rep, tmp_path)[0].read_text())
    assert out["neighbouring_relation"] == neighbouring_text(adjacency)
    assert out["neighbouring_relation"].startswith(f"{adjacency}: node-level, replacement")
    assert out["violations"] == [] and out["silos"][0]["details"]["adjacency"] == adjacency


@pytest.mark.slow
def test_real_mechanism_stays_below_multi_run(data, region):
    rep = audit_pandemic(data, _cfg(), region=region, kind="multi-run", runs=20)
    (row,) = rep.rows
    assert row.claimed_epsilon == pytest.approx(CLAIM, rel=1e-3)
    assert not row.violation, row.details


@pytest.mark.slow
def test_replayed_noise_is_flagged(data, region, replayed_noise):
    """With the noise and batches replayed, every run on D gives one model and every run on
    D′ another: the multi-run bound reaches its maximum for 20 + 20 runs (≈ 0.81) > 0.5."""
    rep = audit_pandemic(data, _cfg(), region=region, kind="multi-run", runs=20)
    (row,) = rep.rows
    assert row.violation and row.lower_bound > 0.8 > CLAIM, row.details
    assert rep.violations == [region]


def test_one_run_charges_the_real_store(data, region, tmp_path):
    st = BudgetStore(tmp_path / "b.sqlite")
    rep = audit_pandemic(data, _cfg(), region=region, canaries=50, store=st)
    assert not rep.scratch and rep.store == str(tmp_path / "b.sqlite")
    spent = st.spent(region)["epsilon"]
    assert spent == pytest.approx(rep.rows[0].claimed_epsilon, rel=1e-3)
    st.close()


def test_bad_input_is_refused_before_any_budget(data, region, tmp_path):
    st = BudgetStore(tmp_path / "b.sqlite")
    n = {r.name: r.n for r in region_groups(data, _cfg())}[region]
    cases = [
        (dict(region="region-nowhere"), "unknown region"),
        (dict(region=region, canaries=n + 1), f"do not fit {region}"),
        (dict(region=region, contacts=10), "between 1 and 9 contacts"),
        (dict(region=region, kind="multi-run"), "scratch store"),
        (dict(region=region, kind="multi-run", store=None, canaries=3), "one canary"),
        (dict(region=region, kind="multi-run", store=None, runs=4), "at least 8 runs"),
        (dict(region=region, kind="sometimes"), "unknown audit kind"),
    ]
    for kw, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            audit_pandemic(data, _cfg(), **{"store": st, **kw})
    with pytest.raises(ConfigError, match="not private"):
        audit_pandemic(data, _cfg(private=False), store=st)
    assert st.silos() == []  # nothing registered, reserved or spent
    st.close()


def test_cli_pandemic_audit(tmp_path):
    from silofl.cli import app
    src = tmp_path / "data"
    synthesize(src, **OUTBREAK)
    common = ["pandemic", "audit", "--data", str(src), "--batch", "128", "--S", "10",
              "--epsilon", str(CLAIM), "-q"]
    res = CliRunner().invoke(app, common + ["--canaries", "100", "--scratch",
                                            "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "claimed ε" in res.output and "replacement" in res.output
    rep = json.loads((tmp_path / "o" / "audit.json").read_text())
    assert rep["scratch_store"] and rep["violations"] == [] and len(rep["silos"]) == 1
    for bad in (["--region", "nowhere", "--scratch"], ["--kind", "multi-run"],
                ["--canaries", "100000", "--scratch"]):
        r = CliRunner().invoke(app, common + bad + ["--out", str(tmp_path / "p"),
                                                    "--store", str(tmp_path / "b.sqlite")])
        assert r.exit_code == 2, r.output
        assert not (tmp_path / "p").exists() and not (tmp_path / "b.sqlite").exists()
