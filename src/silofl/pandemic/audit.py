"""Node-level audit of the pandemic pipeline with canary *persons* (`silofl pandemic audit`).

The node-level guarantee (`privacy.node_level`) is for *replacement* of one person: under
"node+edges" the person's attributes, states and contacts, under "node" their attributes
and states on a fixed contact graph. The audit tests exactly that relation. It appends m
*canary slots* to one region; each slot holds either

* the canary (in): a synthetic person of its own one-person household at a declared age,
  with ``contacts`` home contacts to region members (4 h every evening, at the contact's
  residence) and an infection history the model cannot explain — S and I alternating
  every day, so every training window holds a new infection (a positive label in each of
  its examples) while its own contacts need not be infectious; or
* the null person (out): the same slot never infected (state S every day; label 0) and —
  under "node+edges" — without any contact. Under "node" the graph is public and fixed,
  so the null person keeps the canary's contacts and only the states differ.

Either way the region has the same n in D and D′, so σ, b/n and the accounting are those
of the real job. This module is the audit engine's plug-in (`silofl.audit.engine`) for the
pandemic pipeline: the engine draws the coin flips, runs the one-run and multi-run
procedures and turns the scores into bounds. Training is the real
`pandemic.pipeline.train` (its planner, σ, node-level ledgers, budget reservation,
preprocessing mode); the auditor then scores each canary black-box: minus its mean loss
under the released region model over every training window of its "in" examples
(features rebuilt on the region with every slot "in").

* one run: each slot "in" with probability ½ (OS-entropy coin flips unless seeded), one
  training job, `bounds.one_run_audit`;
* many runs: one slot, `runs` jobs with it "out" (D) and `runs` with it "in" (D′),
  interleaved; statistics (the score and every coordinate of the region's model) feed
  `bounds.multi_run_epsilon`. Needs a scratch store.

Canaries read only public facts (region membership and the contacts' residence ids, which
describe places); the scores are post-processing of the release.

The *white-box* view (``view="white-box"``, the one-run default: the server's threat
model) needs no canary persons: `pandemic.whitebox.NodeCanaries` puts m Dirac node
canaries into auditing-only coordinates of the real job (every region's model widened, the
data untouched), each a person whose K = S or 2S − 1 affected examples move by ±C per step
they are drawn in, and scores them with the exact log-likelihood ratio of the per-pass
sums (`whitebox.node_llr_scores`). The bound is `bounds.one_run_audit`'s; beside it the
estimate `whitebox.node_estimate` (μ̂ read through the claimed mechanism family).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from silofl.audit.engine import (
    AUDIT_NOTE,
    LOWER_BOUND_NOTE,
    AuditReport,
    Claim,
    SiloAudit,
    canary_count,
    check_confidence,
    check_kind,
    check_runs,
    multi_run,
    one_run,
)
from silofl.data.ids import IdIndex
from silofl.errors import ConfigError
from silofl.pandemic.dataset import ContactNetwork
from silofl.pandemic.schema import ActivityType
from silofl.privacy.budget import SCRATCH_NOTE, BudgetStore

#: canaries when not given: at most 200, at most the region's persons
DEFAULT_CANARIES = 200
#: white-box (Dirac node) canaries when not given, and at most
DEFAULT_NODE_CANARIES, MAX_NODE_CANARIES = 1000, 20000
#: what a pandemic audit scores: the server's view (white box) or the released models' loss
VIEWS = ("white-box", "black-box")
#: contacts of each canary when not given (at most S − 1)
DEFAULT_CONTACTS = 5
CANARY_AGE = 40
_EVENING, _HOURS = 18 * 3600, 4 * 3600


def neighbouring_text(adjacency: str, view: str = "black-box") -> str:
    """What D and D′ differ in, for the output (the accountant's relation, made concrete)."""
    from silofl.privacy.node_level import ADJACENCY_TEXT
    if view == "white-box":
        return (f"{adjacency}: {ADJACENCY_TEXT[adjacency]}. In the audit each canary is a "
                "Dirac node canary in an auditing-only coordinate: a person whose affected "
                "examples each contribute +C ('in') or -C ('out') to that coordinate at "
                "every step they are drawn in; the region's persons and n are unchanged")
    what = ("the canary (its record, its alternating S/I history and its home contacts) or "
            "the null person (never infected, no contacts)" if adjacency == "node+edges" else
            "the canary (alternating S/I history) or the null person (never infected) — "
            "with the same contacts in both, the graph being public")
    return (f"{adjacency}: {ADJACENCY_TEXT[adjacency]}. In the audit each canary slot of "
            f"the region holds {what}; the region's size is the same in D and D′")


@dataclasses.dataclass(frozen=True)
class CanaryPersons:
    """m canary slots for `region` (a silo name): contacts (m, k) global person indices."""

    region: str
    contacts: np.ndarray

    @property
    def m(self) -> int:
        return int(self.contacts.shape[0])


def _regions(data, cfg) -> dict[str, np.ndarray]:
    from silofl.pandemic.regions import region_groups
    return {r.name: r.persons for r in region_groups(data, cfg)}


def make_canary_persons(data, cfg, region: str, m: int, contacts: int,
                        rng: np.random.Generator) -> CanaryPersons:
    """`m` canary slots for `region`, each with `contacts` distinct contacts drawn
    uniformly from the region's members. ConfigError for an unknown region, m outside
    [1, n_region], or contacts outside [1, min(S − 1, n_region)]."""
    members = _regions(data, cfg)
    if region not in members:
        raise ConfigError(f"unknown region {region!r}; this dataset's regions are "
                          f"{', '.join(members)} (--region)")
    n = members[region].size
    if not 1 <= m <= n:
        raise ConfigError(f"{m} canaries do not fit {region} ({n} persons): use between 1 "
                          f"and {n} (--canaries); more would outnumber the persons whose "
                          "guarantee is audited")
    hi = min(cfg.S - 1, n)
    if not 1 <= contacts <= hi:
        raise ConfigError(f"a canary needs between 1 and {hi} contacts (S − 1 = "
                          f"{cfg.S - 1}, {n} persons in {region}), got {contacts}")
    picks = np.stack([rng.choice(members[region], size=contacts, replace=False)
                      for _ in range(m)])
    return CanaryPersons(region, picks.astype(np.int64))


def insert_persons(data, c: CanaryPersons, included: np.ndarray, adjacency: str):
    """`data` with the m slots of `c` appended as persons (ids after the largest), "in"
    slots as the canary, "out" slots as the null person (module docstring). Returns a new
    PandemicData (the input is not modified) and the slots' global person indices (m,)."""
    inc = np.asarray(included, bool)
    m, k = c.contacts.shape
    P, T = data.num_persons, data.num_days
    slots = np.arange(P, P + m)
    first = c.contacts[:, 0]
    region = data.region[first]  # the region of its contacts (centralized: any)

    def cat(a, v):
        return np.concatenate([a, np.asarray(v).astype(a.dtype)])
    pids = cat(data.pids, int(data.pids.max()) + 1 + np.arange(m))
    hids = int(data.households["hid"].max()) + 1 + np.arange(m)
    households = data.households.__class__(
        {"hid": cat(data.households["hid"].to_numpy(), hids),
         "hh_size": cat(data.households["hh_size"].to_numpy(), np.ones(m))})
    alternating = (np.arange(T) % 2).astype(np.int8)  # S, I, S, I, ...: a new infection daily
    states = np.zeros((m, T), np.int8)
    states[inc] = alternating
    has_edges = inc if adjacency == "node+edges" else np.ones(m, bool)
    src = np.repeat(slots[has_edges], k)
    dst = c.contacts[has_edges].ravel()
    lid = np.repeat(data.home_lid[first][has_edges], k)
    if np.any(lid < 0):  # a contact without a residence: meet at any listed location
        lid = np.where(lid < 0, data.network.lid[0] if len(data.network) else 0, lid)
    e = src.size
    net = data.network
    network = ContactNetwork(
        src=cat(net.src, src), dst=cat(net.dst, dst), lid=cat(net.lid, lid),
        start_time=cat(net.start_time, np.full(e, _EVENING)),
        duration=cat(net.duration, np.full(e, _HOURS)),
        activity1=cat(net.activity1, np.full(e, int(ActivityType.HOME))),
        activity2=cat(net.activity2, np.full(e, int(ActivityType.HOME))))
    new = dataclasses.replace(
        data, pids=pids, pid_index=IdIndex(pids), hid=cat(data.hid, hids),
        person_number=cat(data.person_number, np.ones(m)),
        age=cat(data.age, np.full(m, CANARY_AGE)), sex=cat(data.sex, np.ones(m)),
        hh_size=cat(data.hh_size, np.ones(m)), home_lid=cat(data.home_lid, data.home_lid[first]),
        county=cat(data.county, data.county[first]), region=cat(data.region, region),
        households=households, network=network,
        states=np.ascontiguousarray(np.concatenate([data.states, states])),
        target=None if data.target is None else cat(data.target, np.zeros(m)))
    return new, slots


def canary_scores(data_in, pm, region: str, slots: np.ndarray) -> np.ndarray:
    """(m,) black-box scores: minus each canary's mean focal loss under `region`'s released
    (raw-input) model over all training windows, its examples built on `data_in` (every
    slot "in") with the constants the model was trained with (declared/private; uncharged:
    refit, as in prediction)."""
    from silofl.pandemic.inputs import model_inputs
    from silofl.pandemic.pipeline import new_model
    from silofl.pandemic.regions import as_constants, build_features, region_groups
    cfg = pm.config
    r = next(g for g in region_groups(data_in, cfg) if g.name == region)
    saved = pm.constants.get(region) if cfg.preprocessing == "private" else None
    build_features(data_in, r, cfg, None if saved is None else as_constants(saved))
    F = r.features
    assert F is not None  # built just above
    local = np.searchsorted(r.persons, slots)  # region persons are sorted indices
    lo, hi = F.train_window_range
    model = new_model(F, cfg)
    w = pm.weights[pm.regions.index(region)]
    total = np.zeros(local.size)
    for we in range(lo, hi + 1):  # one batch per window: a batch holds ≤ n persons
        X, y = F.gather(local, we)
        total += model.loss(w, model_inputs(F, X, cfg.pooling), y.astype(np.float64))
    return -total / (hi - lo + 1)


#: the report of a pandemic audit is the engine's, its relation the node-level one
PandemicAuditReport = AuditReport


def _claim(pm, region: str) -> Claim:
    p = next(p for p in pm.privacy if p["region"] == region)
    return Claim(p["epsilon_spent"], p["target_epsilon"], p["delta"])


class _Trained:
    """A finished one-run training job: its canaries' scores on the D with every slot in."""

    def __init__(self, mech: PandemicMechanism, pm, c: CanaryPersons, slots: np.ndarray):
        self.mech, self.pm, self.c, self.slots = mech, pm, c, slots

    def scores(self, unit: str) -> dict[str, np.ndarray]:
        everyone, _ = insert_persons(self.mech.data, self.c, np.ones(self.c.m, bool),
                                     self.mech.cfg.adjacency)
        return {"black-box": canary_scores(everyone, self.pm, unit, self.slots)}

    def claim(self, unit: str) -> Claim:
        return _claim(self.pm, unit)


class PandemicMechanism:
    """The engine's plug-in for node-level `pipeline.train(data, cfg)`: canary persons in
    one region's slots; records the last trained model (its notes and run id)."""

    def __init__(self, data, cfg, members: dict[str, np.ndarray], canaries: int | None,
                 contacts: int, store: BudgetStore | None):
        self.data, self.cfg, self.members = data, cfg, members
        self.canaries, self.contacts, self.store = canaries, contacts, store
        self.pm: Any = None  # the last trained PandemicModel
        self.st: BudgetStore | None = None

    def draw(self, unit: str, canaries, rng: np.random.Generator) -> CanaryPersons:
        m = canary_count(canaries, min(DEFAULT_CANARIES, self.members[unit].size))
        return make_canary_persons(self.data, self.cfg, unit, m, self.contacts, rng)

    def prepare_one(self, chosen):
        (c, inc), = chosen.values()
        audited, slots = insert_persons(self.data, c, inc, self.cfg.adjacency)
        return audited, c, slots

    def run_one(self, prepared) -> _Trained:
        from silofl.pandemic.pipeline import train
        audited, c, slots = prepared
        self.st = st = self.store if self.store is not None else BudgetStore(None)
        self.pm = train(audited, self.cfg, store=st, command="silofl pandemic audit (one run)")
        return _Trained(self, self.pm, c, slots)

    def neighbours(self, unit: str, canary: CanaryPersons):
        return tuple(insert_persons(self.data, canary, np.array([w]), self.cfg.adjacency)
                     for w in (False, True))

    def run_neighbour(self, unit: str, pair, which: int):
        from silofl.pandemic.pipeline import train
        self.pm = pm = train(pair[which][0], self.cfg, store=BudgetStore(None),
                             command="silofl pandemic audit (multi run)")
        out = {"black-box": float(canary_scores(pair[1][0], pm, unit, pair[1][1])[0])}
        for j, v in enumerate(pm.weights[pm.regions.index(unit)]):
            out[f"model coordinate {j}"] = float(v)
        return out, _claim(pm, unit)


def _true_epsilon(entry: dict, cfg):
    """c ↦ the accountant's ε of the region's DP-SGD steps with their noise × c."""
    from silofl.privacy.node_level import node_epsilon
    return lambda c: node_epsilon(int(entry["n"]), int(entry["S"]), cfg.batch_size,
                                  float(entry["noise_multiplier"]) * c, int(entry["steps"]),
                                  entry["delta"], adjacency=cfg.adjacency)


def _white_box(data, cfg, region: str, members: dict[str, np.ndarray], canaries,
               confidence: float, rng: np.random.Generator, store: BudgetStore | None,
               weaken=None):
    """One job with m Dirac node canaries on `region` (module docstring): (row, model,
    store charged). ConfigError before any budget for a bad canary count."""
    from silofl.audit.bounds import one_run_audit
    from silofl.pandemic.charges import passes_per_round
    from silofl.pandemic.pipeline import train
    from silofl.pandemic.whitebox import (
        NodeCanaries,
        node_detectable,
        node_estimate,
        node_llr_scores,
    )
    from silofl.privacy.node_level import affected_examples
    m = canary_count(canaries, DEFAULT_NODE_CANARIES)
    if m > MAX_NODE_CANARIES:
        raise ConfigError(f"{m} canaries: a white-box audit takes at most "
                          f"{MAX_NODE_CANARIES} (--canaries); the bound gains little "
                          "beyond a few thousand")
    n = members[region].size
    if cfg.batch_size > n:
        raise ConfigError(f"batch_size {cfg.batch_size} is larger than {region} ({n} "
                          "persons)")
    inc = rng.random(m) < 0.5
    K = affected_examples(n, cfg.S, cfg.adjacency)
    probe = NodeCanaries(list(members).index(region), inc, n, K, cfg.batch_size,
                         np.random.default_rng(rng.integers(2 ** 63)), weaken)
    st = store if store is not None else BudgetStore(None)
    pm = train(data, cfg, store=st, command="silofl pandemic audit (white box)",
               probe=probe)
    entry = next(p for p in pm.privacy if p["region"] == region)
    L = int(entry["steps"]) // (cfg.rounds * passes_per_round(cfg))
    u, steps = probe.per_pass(max(L, 1), cfg.clip)
    sigma = float(entry["noise_multiplier"])
    score = node_llr_scores(u, steps, n, K, cfg.batch_size, sigma)
    claim = _claim(pm, region)
    res = one_run_audit({"white-box": score}, inc, claim.delta, confidence)
    facts = (steps, n, K, cfg.batch_size, sigma)
    true_eps = _true_epsilon(entry, cfg)
    res["estimate"] = node_estimate(score[~inc], score[inc], *facts, true_eps, confidence)
    res["estimate"]["flags"] = res["estimate"]["epsilon_lower"] > claim.epsilon
    res["detectable"] = node_detectable(*facts, claim.epsilon, int(np.sum(~inc)),
                                        int(np.sum(inc)), confidence, true_eps)
    res.update(view="white-box", affected_examples=K, passes=int(steps.size),
               steps_per_pass=int(L))
    row = SiloAudit(region, claim.epsilon, claim.target_epsilon, claim.delta,
                    res["epsilon"], res)
    return row, pm, st


def _resolve_region(members: dict[str, np.ndarray], region: str | None) -> str:
    region = next(iter(members)) if region is None else str(region)
    if region not in members and f"region-{region}" in members:
        region = f"region-{region}"  # a bare county code
    if region not in members:
        raise ConfigError(f"unknown region {region!r}; this dataset's regions are "
                          f"{', '.join(members)} (--region)")
    return region


def _check_view(view: str | None, kind: str) -> str:
    """The audit's view (default: white box for one run, black box for many); `silofl
    audit`'s names "server" and "model" are the same two views."""
    view = {"server": "white-box", "model": "black-box"}.get(view, view) if view else view
    view = view if view is not None else "white-box" if kind == "one-run" else "black-box"
    if view not in VIEWS:
        raise ConfigError(f"unknown audit view {view!r}; choose one of {', '.join(VIEWS)}")
    if view == "white-box" and kind != "one-run":
        raise ConfigError("the white-box pandemic audit is one-run only; use --kind one-run, "
                          "or the black-box view for a multi-run audit")
    return view


def _one_run(data, cfg, region, members, view, canaries, contacts, confidence, rng, store,
             weaken, on_progress, notes: list[str]):
    """The one-run audit in `view`: (row, run ids, scratch, store path); `notes` extended."""
    if view == "white-box":
        if on_progress:
            on_progress(0, 1)
        row, pm, st = _white_box(data, cfg, region, members, canaries, confidence, rng,
                                 store, weaken)
        if on_progress:
            on_progress(1, 1)
        notes.append(f"white box: {row.details['canaries']} Dirac node canaries in "
                     "auditing-only coordinates of every region's model, scored by the "
                     "exact log-likelihood ratio of their per-pass sums (a pass: one "
                     f"round's local training of {region}, as the node-level accountant "
                     "sees it, every step released); the estimate covers the region's "
                     f"DP-SGD steps only: {row.details['estimate']['assumes']}")
    else:
        notes.append(_canary_note(contacts, region))
        mech = PandemicMechanism(data, cfg, members, canaries, contacts, store)
        (row,), _p, _job = one_run(mech, [region], canaries, confidence, rng, on_progress)
        pm, st = mech.pm, mech.st
    run_ids = [next(p for p in pm.privacy if p["region"] == region).get("run_id") or "-"]
    notes += [n for n in pm.notes if n not in notes]
    notes.append("the audit job trains every region, so it is charged to every region's "
                 "budget" + (" (the audited region's with its canary slots in)"
                             if view == "black-box" else ""))
    return row, run_ids, st.scratch, None if st.path is None else str(st.path)


def _canary_note(contacts: int, region: str) -> str:
    return (f"canaries: {contacts} home contacts each, drawn uniformly from {region}'s "
            "members; the job's σ was calibrated for the region with its canary slots in")


def audit_pandemic(data, cfg, *, region: str | None = None, kind: str = "one-run",
                   canaries: int | None = None, contacts: int = DEFAULT_CONTACTS,
                   runs: int = 100, confidence: float = 0.95,
                   store: BudgetStore | None = None, seed: int | None = None,
                   on_progress: Callable[[int, int], None] | None = None,
                   view: str | None = None, weaken=None) -> AuditReport:
    """Audit node-level `pipeline.train(data, cfg)` for `region` (default: the first).

    Parameters
    ----------
    view : {"white-box", "black-box"}, optional
        White box: Dirac node canaries scored in the server's view (the one-run default);
        black box: canary persons scored by their loss (multi-run is black box only).
    canaries : int, optional
        One run: white box default 1000 (at most 20000); black box the slots, default
        min(200, n_region). Multi-run uses one (leave it None or 1).
    contacts : int
        Home contacts of each canary person (black box).
    runs : int
        Multi-run: jobs on each of D and D′.
    store : BudgetStore, optional
        One run: the budget store charged (None: an in-memory scratch store, said so);
        multi-run: must be None or scratch.
    seed : int, optional
        Canaries and coin flips (default OS entropy).
    weaken : callable, optional
        White box: rule → rule, a deliberately weakened mechanism (tests, self-test); the
        claim stays the real one's.

    Returns
    -------
    AuditReport
        One row (the region): claimed ε, the one-run or multi-run lower bound and details
        (white box: also "estimate" and "detectable"). Everything that can fail on bad
        input fails before any budget is reserved.
    """
    t0 = time.perf_counter()
    check_kind(kind)
    view = _check_view(view, kind)
    cfg.validate()
    if not cfg.private:
        raise ConfigError("an audit compares a claimed ε with an empirical lower bound, but "
                          "this run is not private (--no-privacy); drop it")
    check_confidence(confidence)
    members = _regions(data, cfg)
    region = _resolve_region(members, region)
    rng = np.random.default_rng(seed)
    neighbouring = neighbouring_text(cfg.adjacency, view)
    notes = [AUDIT_NOTE, f"neighbouring: {neighbouring}"]
    if kind == "one-run":
        row, run_ids, scratch, path = _one_run(data, cfg, region, members, view, canaries,
                                               contacts, confidence, rng, store, weaken,
                                               on_progress, notes)
    else:
        if store is not None and not store.scratch:
            raise ConfigError("a multi-run audit trains `runs` jobs on each of D and D′: "
                              "an experiment, not a release, that would spend many jobs' "
                              "worth of the region's lifetime budget. Run it on a scratch "
                              "store (--scratch), or use --kind one-run on the real store")
        if canaries not in (None, 1):
            raise ConfigError("a multi-run audit uses one canary (D′ = D with the canary "
                              "in its slot); leave --canaries out or set it to 1")
        check_runs(runs)
        notes.append(_canary_note(contacts, region))
        mech = PandemicMechanism(data, cfg, members, canaries, contacts, store)
        c = make_canary_persons(data, cfg, region, 1, contacts, rng)
        (row,) = multi_run(mech, [region], c, runs, confidence, on_progress)
        run_ids = [f"{2 * runs} scratch jobs"]
        notes += [SCRATCH_NOTE, f"multi-run: {runs} jobs on D and {runs} on D′, each on "
                  "its own scratch store"]
        notes += [n for n in mech.pm.notes if n not in notes]
        scratch, path = True, None
    row.details["adjacency"] = cfg.adjacency
    return AuditReport(kind, [row], [cfg.method], notes, path, scratch, run_ids,
                       time.perf_counter() - t0, confidence, cfg.noise,
                       neighbouring=neighbouring)


__all__ = ["audit_pandemic", "make_canary_persons", "insert_persons", "canary_scores",
           "CanaryPersons", "PandemicAuditReport", "PandemicMechanism", "neighbouring_text",
           "LOWER_BOUND_NOTE", "VIEWS"]
