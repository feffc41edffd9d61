"""Audits at the person level (issue 23's membership target): canary persons with several
rows, put in or taken out whole, at the DP-SGD step of the real trainer.

(a) person-level training: the empirical lower bound stays below the per-person claim;
(b) the same attack on example-level training at the same nominal ε: the bound exceeds the
    per-row claim (group privacy), while single-row canaries stay below it;
(c) a broken person-level variant (rows weighted 1 instead of 1/r) is caught.
Every audit runs with seeded noise and seeded coins: each verdict is one fixed draw, far
from its threshold (the margins are stated at each assertion)."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from silofl.algorithms import make_algorithm
from silofl.audit import persons as AP
from silofl.audit.selftest import PERSON_WEAKENINGS, self_test_persons
from silofl.audit.tabular import audit
from silofl.config import config_from_dict
from silofl.data.federation import Federation, Silo
from silofl.errors import ConfigError
from silofl.models import make_model
from silofl.models.glm import LogisticRegression
from silofl.privacy.budget import BudgetStore
from silofl.privacy.targets import PERSON_ADJACENCY, PrivacyTarget
from silofl.runtime.plan import TrainingConfig
from silofl.training.dpsgd import GradientRule
from silofl.training.persons import PersonSource

warnings.filterwarnings("ignore", message=".*delta.*")

EPS, DELTA, D = 1.0, 1e-5, 4


def _federation(persons: int = 200, seed: int = 0) -> Federation:
    """Two hospitals, `persons` patients each with 1 + Poisson(4) visits (rows)."""
    rng = np.random.default_rng(seed)
    silos = []
    w = rng.normal(size=D)
    for k in range(2):
        ids = np.repeat(np.arange(persons), rng.poisson(4, persons) + 1)
        X = rng.normal(size=(ids.size, D))
        y = (X @ w + rng.normal(size=ids.size) > 0).astype(np.int64)
        silos.append(Silo(f"h{k}", X, y, X[:50], y[:50], person_train=ids))
    fed = Federation(silos, [f"x{j}" for j in range(D)], "binary", 2)
    return fed.with_targets(PrivacyTarget(EPS, DELTA))


@pytest.fixture(scope="module")
def fed():
    return _federation()


def _tcfg(unit: str, **kw) -> TrainingConfig:
    base = dict(rounds=5, batch_size=32, lr=0.1, clip=1.0, seed=0, noise="seeded",
                privacy_unit=unit)
    return TrainingConfig(**{**base, **kw})


def _canary_bound(row) -> float:
    """The bound from the canaries alone (one-run and pooled), without the model checks."""
    d = row.details
    return max(d["one_run"]["epsilon"], d["pooled"]["epsilon"])


def _run(fed, unit: str, rows, seed: int, tseed: int = 0, **kw):
    (row,) = AP.audit_persons(fed, make_model("logistic", D), make_algorithm("local"),
                              _tcfg(unit, seed=tseed), silo="h0", canaries=20_000,
                              rows=rows, seed=seed, **kw).rows
    return row


# --- the probe: what a canary person adds at each unit ------------------------------------

def _probe(unit: str, cls=PersonSource, cap: int = 0, q: float = 0.3):
    rng = np.random.default_rng(0)
    m = 400
    rows = AP.canary_rows((3, 8), m, rng)
    inc = np.arange(m) % 2 == 0
    return AP.CanaryPersons(5, {0: inc}, np.array([q]), np.array([4]), rng, rows, unit,
                            cls, cap), rows, inc


def test_a_canary_person_adds_what_its_unit_bounds():
    """Person level: an in-person's total weight is 0 or 1 (so it adds 0 or C), with
    frequency q; rows weighted 1: 0 or r (or the cap); example level: Binomial(r, q) rows.
    Out-persons add nothing. Means within 5 standard errors over 300 steps."""
    steps, q = 300, 0.3
    probe, rows, inc = _probe("person")
    W = np.stack([probe.weight(0, inc) for _ in range(steps)])
    assert np.all(W[:, ~inc] == 0)
    assert set(np.round(np.unique(W[:, inc]), 12)) <= {0.0, 1.0}
    n = W[:, inc].size
    assert abs(W[:, inc].mean() - q) < 5 * np.sqrt(q * (1 - q) / n)

    broken, rows, inc = _probe("person", AP.UnitWeights)
    W = np.stack([broken.weight(0, inc) for _ in range(steps)])
    hit = W[:, inc] > 0
    assert np.all(W[:, inc][hit] == np.broadcast_to(rows[inc], hit.shape)[hit])
    capped, rows, inc = _probe("person", AP.UnitWeights, cap=2)
    W = np.stack([capped.weight(0, inc) for _ in range(steps)])
    assert set(np.unique(W[:, inc])) == {0.0, 2.0}

    ex, rows, inc = _probe("example")
    W = np.stack([ex.weight(0, inc) for _ in range(steps)])
    assert np.all(W[:, ~inc] == 0) and W[:, inc].max() <= rows.max()
    want = (rows[inc] * q).sum() * steps
    sd = np.sqrt((rows[inc] * q * (1 - q)).sum() * steps)
    assert abs(W[:, inc].sum() - want) < 5 * sd


class _IgnoresWeights(LogisticRegression):
    """A model whose weighted clipped sum treats the row weights as a 0/1 mask (the fault
    the canaries cannot see: their rows never reach the model)."""

    def clipped_grad_sum(self, W, X, y, mask, clip, **aux):
        return super().clipped_grad_sum(W, X, y, (np.asarray(mask) > 0).astype(float), clip,
                                        **aux)


@pytest.mark.parametrize("cls, model, broken", [
    (PersonSource, make_model("logistic", D), False),
    (AP.UnitWeights, make_model("logistic", D), True),
    (PersonSource, _IgnoresWeights(D), True)])
def test_the_weighting_check_sees_a_person_above_c(cls, model, broken):
    rule = GradientRule(1.0, np.array([1.0]))
    c = AP.weighting_check(cls, rule, model, (D,), "binary", 2, np.random.default_rng(0), 8)
    if broken:  # 8 identical rows weighted 1 each: 8·C
        assert not c["ok"] and c["ratio"] == pytest.approx(8.0, rel=1e-3)
    else:
        assert c["ok"] and c["ratio"] <= 1 + 1e-9


# --- (a), (b), (c) ----------------------------------------------------------------------

def test_a_person_level_run_stays_below_its_per_person_claim(fed):
    """(a) All rows of a canary person (3–8) in or out, person-level DP-SGD: the rigorous
    bound stays below the claim (measured 0.29 against 1.0 at seed 5) and the estimate's
    lower end too (0.85; it is calibrated to exceed a true claim 5% of the time, see the
    statistical test below); the weighting check finds every person within C."""
    row = _run(fed, "person", (3, 8), seed=5)
    assert row.lower_bound < 0.6 * row.claimed_epsilon
    d = row.details
    assert d["unit"] == "person" and d["canary_rows"]["max"] <= 8
    assert row.claimed_epsilon == pytest.approx(EPS, rel=1e-2)
    assert row.lower_bound < row.claimed_epsilon and not row.violation
    assert d["clipping_check"]["ok"]
    # σ was calibrated for q over persons: 32 of 200 persons per step
    assert d["sampling_rate"] == pytest.approx(32 / 200)


def test_example_level_dp_under_protects_a_person_with_eight_rows(fed):
    """(b) The same attack on example-level training at the same nominal ε: a person's 8
    rows are each protected only as a row, and the bound at the person level exceeds the
    per-row claim (measured 3.7 against 1.0) — from the canaries alone, not a check.
    The control: single-row canaries on the same run stay below the claim (the mechanism
    is correct for what it claims)."""
    row = _run(fed, "example", 8, seed=2)
    assert row.details["unit"] == "example"
    assert row.claimed_epsilon == pytest.approx(EPS, rel=1e-2)
    assert row.details["clipping_check"]["ok"]  # no fault: the rows are clipped to C
    assert _canary_bound(row) > 1.5 * row.claimed_epsilon and row.violation
    one = _run(fed, "example", 1, seed=2)
    assert one.lower_bound < one.claimed_epsilon and not one.violation


def test_the_person_self_test_catches_rows_weighted_one(fed):
    """(c) A person-level variant whose rows weigh 1 instead of 1/r (a person adds up to
    8·C, claim and accounting unchanged) is flagged — by the canaries alone (bound > 1.5
    × the claim) and by the weighting check (8 × C); the run as it is passes."""
    rep = self_test_persons(fed, make_model("logistic", D), make_algorithm("local"),
                               _tcfg("person"), silo="h0", canaries=20_000, seed=3)
    by = {r.mechanism: r for r in rep.rows}
    assert set(by) == {"as run", *PERSON_WEAKENINGS}
    assert not by["as run"].flagged and rep.passed
    broken = by["rows weighted 1"]
    assert broken.must_flag and broken.flagged
    assert broken.true_epsilon > 10 * broken.claimed_epsilon
    row = _run(fed, "person", (3, 8), seed=4, source_class=AP.UnitWeights,
               store=BudgetStore(None))
    assert _canary_bound(row) > 1.5 * row.claimed_epsilon
    assert row.details["clipping_check"]["ratio"] == pytest.approx(8.0, rel=1e-3)


@pytest.mark.slow
@pytest.mark.statistical
def test_the_verdicts_hold_over_many_draws(fed):
    """30 audits each (training noise seed and the auditor's coins varied): the person-level
    run is flagged in at most 5 (at 95%, Binomial(30, 0.05) reaches 6 with probability
    0.003; measured 1 in 20), the example-level run is refuted at the person level by the
    canaries alone in at least 29 (measured 20 of 20, bounds 3.0–4.0 against 1.0)."""
    flags = refuted = 0
    for i in range(30):
        flags += _run(fed, "person", (3, 8), seed=100 + i, tseed=i).violation
        row = _run(fed, "example", 8, seed=200 + i, tseed=i)
        refuted += _canary_bound(row) > row.claimed_epsilon
    assert flags <= 5 and refuted >= 29, (flags, refuted)


# --- bad input, and the config route ----------------------------------------------------

@pytest.mark.parametrize("change, match", [
    (dict(tcfg=dict(private=False)), "not private"),
    (dict(tcfg=dict(privacy_unit="node", node_S=2)), "privacy unit"),
    (dict(rows=0), "rows per canary person"),
    (dict(rows=(5, 3)), "rows per canary person"),
    (dict(tcfg=dict(privacy_unit="example"), source_class=AP.UnitWeights), "person level"),
    (dict(weaken=lambda r: r, store="real"), "scratch store"),
    (dict(no_persons=True), "person_train"),
    (dict(canaries=5), "between 20 and")])
def test_bad_input_is_refused_before_any_budget(fed, tmp_path, change, match):
    change = dict(change)
    tc = _tcfg(**{"unit": "person", **change.pop("tcfg", {})})
    if change.pop("no_persons", False):
        fed = Federation([dataclasses.replace(s, person_train=None) for s in fed.silos],
                         fed.feature_names, fed.task, fed.num_classes)
        fed = fed.with_targets(PrivacyTarget(EPS, DELTA))
    store = BudgetStore(tmp_path / "b.sqlite")
    if change.get("store") == "real":
        change["store"] = store
    kw = {"canaries": 100, **change}
    with pytest.raises(ConfigError, match=match):
        AP.audit_persons(fed, make_model("logistic", D), make_algorithm("local"), tc, **kw)
    assert store.silos() == []  # nothing registered, reserved or charged


EHR = Path(__file__).resolve().parents[1] / "examples" / "ehr"


def _person_config():
    """The simulated EHR export (`examples/ehr`): a table with a patient column."""
    return config_from_dict({
        "data": {"source": "table", "path": str(EHR / "visits.csv"),
                 "schema": str(EHR / "ehr_schema.toml"), "silo_column": "hospital",
                 "label_column": "readmit_30d", "person_column": "patient_id",
                 "drop": ["admit_date"]},
        "training": {"methods": ["local"], "rounds": 3, "seed": 11, "batch_size": 16},
        "privacy": {"noise": "seeded", "unit": "person"},
        "budget": {"scratch": True}, "output": {"dir": ""}})


def test_the_config_route_audits_persons(tmp_path):
    """`silofl audit` on a config with [privacy] unit = "person": the server view trains
    with canary persons and compares with the per-person claim."""
    from silofl.audit import tabular
    cfg = _person_config()
    rep = audit(cfg, silo="lakeview", canaries=2000, seed=5)
    (row,) = rep.rows
    assert rep.neighbouring == PERSON_ADJACENCY and AP.PERSON_NOTE in rep.notes
    assert not row.violation and row.details["clipping_check"]["ok"]
    n = tabular.audited_silos(cfg, "lakeview")[0].silo("lakeview").n_persons
    assert row.details["sampling_rate"] == pytest.approx(cfg.training.batch_size / n)
    from silofl.audit import write_audit
    data = json.loads(write_audit(rep, tmp_path)[0].read_text())
    assert data["neighbouring_relation"] == PERSON_ADJACENCY and data["violations"] == []


def test_the_config_route_self_test_catches_rows_weighted_one():
    """`silofl audit --self-test` at person level adds the broken source (rows weighted 1,
    trainer and canaries alike) and flags it; the run as it is passes."""
    from silofl.audit.selftest import ROWS_ONE, self_test
    rep = self_test(_person_config(), silo="lakeview", canaries=2000, seed=6,
                    only=[ROWS_ONE])
    by = {r.mechanism: r for r in rep.rows}
    assert set(by) == {"as run", ROWS_ONE} and rep.passed
    assert by[ROWS_ONE].must_flag and by[ROWS_ONE].flagged and not by["as run"].flagged
    assert any("not audited" in n for n in rep.notes)


def test_the_config_route_refuses_a_record_view_and_a_table_without_persons():
    with pytest.raises(ConfigError, match="server view"):
        audit(_person_config(), view="model")
    cfg = _person_config()
    bare = config_from_dict(dict(cfg.to_dict(), data=dict(cfg.to_dict()["data"],
                                                          person_column="")))
    with pytest.raises(ConfigError, match="person_column"):
        audit(bare, view="server", canaries=100)
