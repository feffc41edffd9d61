"""The consortium-wide guarantee of a person in m silos (silofl.privacy.person_composition),
checked against independent accounting: the analytic Gaussian (Balle & Wang 2018), the
dp_accounting RDP accountant, a finer dp_accounting PLD run, each silo's own ledger, and
a brute force over every silo set."""

from __future__ import annotations

import itertools
import json
import math
import os
from collections import Counter

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import pld, rdp
from scipy.optimize import brentq
from scipy.stats import norm

from silofl.errors import PrivacyError
from silofl.experiments.person_report import person_report, person_table
from silofl.privacy import dominance
from silofl.privacy.events import dpsgd_event
from silofl.privacy.ledger import Ledger, tightest
from silofl.privacy.person_composition import ledger_events, person_composition
from silofl.privacy.targets import PrivacyTarget

DELTA = 1e-5


def analytic_gaussian_eps(mu: float, delta: float) -> float:
    """ε(δ) of the Gaussian mechanism with sensitivity/σ = μ (Balle & Wang 2018, Thm 8):
    δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ), solved for ε."""
    def gap(eps: float) -> float:
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu) - delta
    return brentq(gap, 0.0, 100.0, xtol=1e-12)


def _dpa_pld(evs: list, grid: float) -> float:
    acc = pld.PLDAccountant(value_discretization_interval=grid)
    acc.compose(dpa.ComposedDpEvent(list(evs)))
    return acc.get_epsilon(DELTA)


def _dpa_rdp(evs: list) -> float:
    acc = rdp.RdpAccountant()
    acc.compose(dpa.ComposedDpEvent(list(evs)))
    return acc.get_epsilon(DELTA)


def test_gaussian_silos_compose_to_the_analytic_gaussian() -> None:
    # tolerance: PLD is pessimistic (≥ the analytic ε up to float error) and its adaptive
    # grid keeps it within ~0.1%; 1% allowed
    sigmas = {"a": 3.0, "b": 2.0, "c": 5.0, "d": 4.0}
    comp = person_composition({k: [dpa.GaussianDpEvent(s)] for k, s in sigmas.items()}, DELTA)
    by_sigma = sorted(sigmas, key=sigmas.__getitem__)
    for m in range(1, 5):
        row = comp.row(m)
        worst = by_sigma[:m]  # smaller σ dominates: the worst m silos are the noisiest-free
        mu = math.sqrt(sum(1 / sigmas[s] ** 2 for s in worst))
        exact = analytic_gaussian_eps(mu, DELTA)
        assert row.method == "exact" and sorted(row.silos) == sorted(worst)
        assert exact - 1e-9 <= row.epsilon <= exact * 1.01, (m, row.epsilon, exact)
        assert row.candidates == (4 if m == 1 else 1)  # a dominance chain: one candidate
        if m > 1:  # composition is far below the naive sum
            assert row.epsilon < 0.8 * row.naive_sum_epsilon


SUBSAMPLED = {"h1": (0.02, 1.0, 60), "h2": (0.04, 1.3, 60), "h3": (0.01, 0.8, 80)}


def _subsampled_events() -> dict:
    return {k: [dpsgd_event(q, s, t)] for k, (q, s, t) in SUBSAMPLED.items()}


def test_subsampled_gaussians_match_rdp_bound_and_a_finer_pld() -> None:
    comp = person_composition(_subsampled_events(), DELTA)
    names = list(SUBSAMPLED)
    for m in (2, 3):
        row = comp.row(m)
        assert row.method == "exact"
        brute = max(_dpa_pld([dpsgd_event(*SUBSAMPLED[n]) for n in s], 1e-4)
                    for s in itertools.combinations(names, m))
        evs = [dpsgd_event(*SUBSAMPLED[n]) for n in row.silos]
        # RDP is an upper bound of the true ε: never below ours (1e-6 float slack)
        assert _dpa_rdp(evs) >= row.epsilon - 1e-6
        # a dp_accounting PLD run on a finer 1e-4 grid: within 1% (both pessimistic)
        fine = _dpa_pld(evs, 1e-4)
        assert abs(row.epsilon - fine) <= 0.01 * fine, (m, row.epsilon, fine)
        assert abs(row.epsilon - brute) <= 0.01 * brute  # the worst set was found


def test_one_silo_equals_its_own_ledger_epsilon() -> None:
    ledgers = []
    for name, (q, s, t) in SUBSAMPLED.items():
        led = Ledger(name, PrivacyTarget(50.0, DELTA))
        for r in range(3):  # charged round by round, as a run does
            led.charge(dpsgd_event(q, s, t // 3), round=r)
        ledgers.append(led)
    comp = person_composition(ledger_events(ledgers), DELTA)
    own = {led.silo: led.epsilon() for led in ledgers}
    for name, eps in own.items():
        assert comp.silo_epsilons[name] == pytest.approx(eps, rel=1e-12)
    assert comp.row(1).epsilon == pytest.approx(max(own.values()), rel=1e-12)
    assert comp.row(1).silos == (max(own, key=own.__getitem__),)


MIXED = {  # A dominates B and C; B, C, D incomparable; E equals B (shared signature)
    "A": (0.05, 0.8, 40), "B": (0.02, 1.0, 40), "C": (0.03, 1.1, 40),
    "D": (0.06, 1.4, 30), "E": (0.02, 1.0, 40), "F": (0.01, 1.2, 40)}


def test_pruned_worst_case_equals_brute_force_over_every_set() -> None:
    evs = {k: [dpsgd_event(*v)] for k, v in MIXED.items()}
    comp = person_composition(evs, DELTA)
    names = list(MIXED)
    for m in (2, 3, 4):
        brute = max(tightest(dpa.ComposedDpEvent([dpsgd_event(*MIXED[n]) for n in s]),
                             DELTA)[0] for s in itertools.combinations(names, m))
        row = comp.row(m)
        # dominated sets were skipped: their computed ε may exceed the dominating set's by
        # the grid error (~0.1%) only
        assert row.epsilon >= brute * (1 - 3e-3), (m, row.epsilon, brute)
        assert row.epsilon <= brute + 1e-12
        assert row.candidates < math.comb(len(names), m)
        assert "A" in row.silos  # A dominates B, C and F: a worst set holds it


def test_dominance_claims_hold_for_the_computed_epsilons() -> None:
    sigs = [dominance.signature(Counter({dpsgd_event(q, s): t})) for q, s, t in MIXED.values()]
    for a, b in itertools.permutations(range(len(sigs)), 2):
        if dominance.dominates(sigs[a], sigs[b]):
            ea = tightest(_event(sigs[a]), 1e-6)[0]
            eb = tightest(_event(sigs[b]), 1e-6)[0]
            assert ea >= eb * (1 - 3e-3), (a, b, ea, eb)
    b = dominance.signature(Counter({dpsgd_event(0.02, 1.0): 40}))
    more = dominance.signature(Counter({dpsgd_event(0.02, 1.0): 41}))
    assert dominance.dominates(more, b) and not dominance.dominates(b, more)
    # two step types matched one to one (each B step needs its own dominating A step)
    a2 = dominance.signature(Counter(
        {dpsgd_event(0.05, 1.0): 1, dpa.GaussianDpEvent(2.0): 1}))
    b2 = dominance.signature(Counter({dpsgd_event(0.04, 1.1): 2}))
    assert not dominance.dominates(a2, b2)  # only the first A step dominates B's steps
    b3 = dominance.signature(Counter(
        {dpsgd_event(0.04, 1.1): 1, dpsgd_event(0.5, 2.5): 1}))
    assert dominance.dominates(a2, b3)
    lap = dominance.signature(Counter({dpa.LaplaceDpEvent(1.0): 1}))
    assert not dominance.dominates(a2, lap) and dominance.dominates(lap, lap)


def _event(sig: frozenset) -> dpa.DpEvent:
    return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(e, c) for e, c in sig])


def test_too_many_sets_fall_back_to_proved_bounds_or_say_not_computed() -> None:
    evs = {k: [dpsgd_event(*v)] for k, v in MIXED.items()}
    exact = person_composition(evs, DELTA)
    capped = person_composition(evs, DELTA, max_subsets=1)
    for m in (2, 3):
        row = capped.row(m)
        assert row.method == "bound" and row.silos is None and "upper bound" in row.reason
        assert row.epsilon >= exact.row(m).epsilon
    sigs = [dominance.signature(Counter({dpsgd_event(*v[:2]): v[2]})) for v in MIXED.values()]
    e, c = dominance.join_event(sigs)
    joined = dominance.signature(Counter({e: c}))
    assert all(dominance.dominates(joined, s) for s in sigs)
    assert dominance.join_event(sigs + [frozenset({(dpa.LaplaceDpEvent(1.0), 1)})]) is None
    # a maximum: A dominates B and C → m copies of A
    three = {"A": [dpsgd_event(0.05, 0.8, 40)], "B": [dpsgd_event(0.045, 0.82, 40)],
             "C": [dpsgd_event(0.048, 0.85, 40)]}
    row = person_composition(three, DELTA, max_subsets=1).row(2)
    assert row.method == "bound" and "'A'" in row.reason
    assert row.epsilon >= person_composition(three, DELTA).row(2).epsilon
    # several mechanism types and no maximum: the set of all three silos (one candidate)
    # still bounds m = 2
    multi = {"x": [dpsgd_event(0.02, 1.0, 20), dpa.LaplaceDpEvent(5.0)],
             "y": [dpsgd_event(0.05, 1.5, 20), dpa.LaplaceDpEvent(8.0)],
             "z": [dpsgd_event(0.01, 0.9, 20)]}
    capped = person_composition(multi, DELTA, max_subsets=1)
    assert capped.row(3).method == "exact"
    row = capped.row(2)
    assert row.method == "bound" and row.epsilon == capped.row(3).epsilon
    assert "m = 3" in row.reason
    assert row.epsilon >= person_composition(multi, DELTA).row(2).epsilon
    # events that do not compose (a node-level RDP curve with DP-SGD): no number made up
    from silofl.privacy.curves import FixedRdpCurveEvent
    from silofl.privacy.rdp_curves import RDP_ORDERS_FINE
    curve = FixedRdpCurveEvent(tuple(RDP_ORDERS_FINE), tuple(0.01 * a for a in RDP_ORDERS_FINE))
    mixed = {"x": [curve], "y": [dpsgd_event(0.05, 1.5, 20)], "z": [dpsgd_event(0.01, 0.9, 20)]}
    comp = person_composition(mixed, DELTA)
    assert comp.row(1).epsilon is not None
    for m in (2, 3):
        assert comp.row(m).method == "not computed" and comp.row(m).epsilon is None
        assert "do not compose" in comp.row(m).reason


def test_bounds_are_tightened_by_larger_sets() -> None:
    evs = {f"S{i}": [dpsgd_event(0.01 + 0.002 * i, 1.0 + 0.08 * i, 40)] for i in range(8)}
    capped = person_composition(evs, DELTA, max_subsets=8)
    exact = person_composition(evs, DELTA)
    figures = [r.epsilon for r in capped.rows]
    assert all(a <= b + 1e-12 for a, b in zip(figures[1:], figures[2:]))  # non-decreasing
    for m in range(2, 9):
        assert capped.row(m).epsilon >= exact.row(m).epsilon * (1 - 1e-9)
        if capped.row(m).method == "bound":
            assert capped.row(m).silos is None and "upper bound" in capped.row(m).reason
    assert {r.method for r in capped.rows} == {"exact", "bound"}


def test_declared_m_comparisons_and_errors() -> None:
    comp = person_composition(_subsampled_events(), DELTA, declared_m=2)
    assert comp.declared is comp.row(2)
    assert person_composition(_subsampled_events(), DELTA).declared.m == 3  # 0 = K
    own = sorted(comp.silo_epsilons.values(), reverse=True)
    row = comp.row(3)
    assert row.naive_sum_epsilon == pytest.approx(sum(own))
    assert row.naive_sum_delta == pytest.approx(3 * DELTA)
    assert row.group_epsilon == pytest.approx(3 * own[0])
    assert row.group_delta == pytest.approx(DELTA * (1 + math.exp(own[0]) + math.exp(2 * own[0])))
    assert row.epsilon < row.naive_sum_epsilon
    assert person_composition(_subsampled_events(), DELTA, declared_m=7).declared.m == 3
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(PrivacyError, match="persons_in_silos"):
            person_composition(_subsampled_events(), DELTA, declared_m=bad)
    for bad in (0, 2.5):
        with pytest.raises(PrivacyError, match="max_subsets"):
            person_composition(_subsampled_events(), DELTA, max_subsets=bad)
    with pytest.raises(PrivacyError, match="at least one silo"):
        person_composition({}, DELTA)
    with pytest.raises(PrivacyError, match="delta"):
        person_composition(_subsampled_events(), 0.7)


def test_person_report_is_json_ready_and_renders() -> None:
    from rich.console import Console
    evs = _subsampled_events()
    targets = {k: PrivacyTarget(10.0, DELTA) for k in evs}
    rep = person_report(evs, targets, DELTA, 2, overlap=[120.4, 9.7, -1.2])
    json.dumps(rep, allow_nan=False)
    assert rep["declared"]["m"] == 2 and rep["rows"][2]["persons_noisy"] == pytest.approx(-1.2)
    assert [s["target_epsilon"] for s in rep["silos"]] == [10.0] * 3
    con = Console(width=160, record=True)
    con.print(person_table(rep))
    text = con.export_text()
    assert "A person seen by m hospitals" in text and "naive sum" in text and "◀ M" in text
    with pytest.raises(PrivacyError, match="one entry per m"):
        person_report(evs, targets, DELTA, 2, overlap=[1.0, 2.0])
    from silofl.privacy.overlap import OverlapRelease
    rel = OverlapRelease(np.array([300.0, 40.0, 25.0]), 2.0, 2.0 * math.sqrt(2), tuple(evs))
    rep = person_report(evs, targets, DELTA, 2, overlap=rel)
    assert rep["overlap_above_declared"] == [3]  # 25 > 3 · 2.83
    con = Console(width=200, record=True)
    con.print(person_table(rep))
    assert "more than the declared M = 2" in con.export_text()
    rel = OverlapRelease(np.array([300.0, 40.0, 5.0]), 2.0, 2.0 * math.sqrt(2), tuple(evs))
    assert person_report(evs, targets, DELTA, 2, overlap=rel)["overlap_above_declared"] == []


def test_the_guides_example_runs_as_printed() -> None:
    import re
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "guides" / "persons-across-silos.md").read_text(encoding="utf-8")
    (code,) = re.findall(r"```python\n(.*?)```", page, re.DOTALL)
    env = {**os.environ, "COLUMNS": "160",
           "PYTHONPATH": str(root / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "A person seen by m hospitals" in proc.stdout
