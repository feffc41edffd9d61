"""What a pandemic run spends and what it records about privacy.

The node-level events of a region's rounds and of its private preprocessing release, the
charges a run (or a privately tuned run) reserves in the budget store before any record is
read, and the privacy entry every saved model carries (guarantee, adjacency, assumptions,
what was not charged).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dp_accounting as dpa

from silofl.io import array_digest
from silofl.pandemic.dataset import PandemicData
from silofl.pandemic.engine import method_of, selection_charges, selection_summary
from silofl.pandemic.inputs import SUMMARY_DECLARED_SOURCE
from silofl.pandemic.tables import DECLARED_SOURCES
from silofl.privacy.budget import SCRATCH_NOTE, BudgetStore, PlannedCharge
from silofl.privacy.node_level import (
    ADJACENCY_TEXT,
    PRUNING_ASSUMPTION,
    NodeLevelDpEvent,
    affected_examples,
)
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.job import Job, open_job
from silofl.runtime.plan import SEEDED_NOTE, SiloPlan
from silofl.training import sampling as TS

if TYPE_CHECKING:
    from silofl.pandemic.config import PandemicConfig
    from silofl.pandemic.region import Region


#: the label of each kind of charge in ledgers and the budget store (the method is
#: ``cfg.method``, MR-MTL by default)
ROUND_LABEL = TS.NODE_LABEL  # "node-dpsgd"


PREPROCESS_LABEL = "preprocess"


#: what every node-level model assumes besides the pruning
SIZES_ASSUMPTION = ("region sizes n are treated as public: they set each region's "
                    "sampling rate b/n, its noise calibration and the averaging weights")


#: the items that preprocessing="uncharged" reads without any charge
UNCHARGED_ITEMS = (
    "age standardization (mean and standard deviation of the region's ages)",
    "household-size Box-Cox λ (maximum likelihood on the region) and standardization",
    "location longitude/latitude standardization (over the listed locations)",
    ("contact statistics: mean and standard deviation of log duration and log count over "
     "the region's kept edges"),
    ("model-input standardization (mean and standard deviation of every input column over "
     "the region's examples)"),
)


def passes_per_round(cfg: PandemicConfig) -> int:
    """Local passes per round of ``cfg.method`` (Ditto: 2)."""
    return method_of(cfg).passes_per_round


def round_event(r: Region, cfg: PandemicConfig) -> NodeLevelDpEvent:
    """The node-level DP charge of one round of ``r``'s local training."""
    return NodeLevelDpEvent(r.n, r.S, cfg.batch_size, r.sigma, r.steps_per_round,
                            cfg.adjacency)


def preprocess_event(r: Region, cfg: PandemicConfig) -> NodeLevelDpEvent:
    """The charge of ``r``'s private preprocessing release: one "step" of the node-level
    mechanism (a Gaussian sum over ``pre_batch`` examples, see `private_release`)."""
    return NodeLevelDpEvent(r.n, r.S, r.pre_batch, r.pre_sigma, 1, cfg.adjacency)


def planned_charges(r: Region, cfg: PandemicConfig, rounds: list[int] | None = None,
                    preprocess: bool | None = None) -> list[PlannedCharge]:
    """What ``r`` will spend: the private preprocessing (if any) and ``rounds`` (default:
    every round), as budget-store charges."""
    rounds = list(range(1, cfg.rounds + 1)) if rounds is None else rounds
    preprocess = cfg.private_preprocessing if preprocess is None else preprocess
    out = []
    if preprocess:
        out.append(PlannedCharge(r.name, cfg.method, PREPROCESS_LABEL,
                                 preprocess_event(r, cfg)))
    if rounds:
        out.append(PlannedCharge(r.name, cfg.method, ROUND_LABEL, round_event(r, cfg),
                                 len(rounds) * passes_per_round(cfg)))
    if cfg.private:  # the IFCA family's private cluster selections (label "select")
        out += selection_charges(method_of(cfg), r.name, cfg.method, cfg.epsilon, rounds,
                                 cfg.rounds)
    return out


#: ledger labels of a tuned run: the pivot's passes, the RepeatAndSelect release
PIVOT_LABEL, TUNING_LABEL = "dpsgd-pivot", "tuning"


def tuned_charges(r: Region, cfg: PandemicConfig, alg) -> list[PlannedCharge]:
    """What a tuned run of ``r`` spends: the private preprocessing (if any), the pivot's
    passes (every round) and one RepeatAndSelect of a trial — the very events
    `TunedPersonalization` charges, so the job's ledgers allow exactly them."""
    from silofl.privacy import selection as TA
    from silofl.tuning.private import score_sigma
    ev = round_event(r, cfg)
    out = planned_charges(r, cfg, rounds=[])
    out.append(PlannedCharge(r.name, cfg.method, PIVOT_LABEL, ev, cfg.rounds))
    out.append(PlannedCharge(r.name, cfg.method, TUNING_LABEL, TA.select_event(
        ev, cfg.rounds, alg.dist, score_sigma(ev, cfg.rounds, alg.score_ratio))))
    return out


def tuning_entry(r: Region, k: int, cfg: PandemicConfig, alg) -> dict:
    """Region k's tuning record: the distribution of h (h_k itself stays secret), the
    grid, the score (window, persons, Δ, noise), the ε of the RepeatAndSelect charge alone
    and the released setting."""
    from silofl.pandemic.tuning import describe_release
    from silofl.privacy import accounting, events
    from silofl.tuning.private import score_sigma
    out = describe_release(alg, k)
    sig = score_sigma(round_event(r, cfg), cfg.rounds, alg.score_ratio)
    out["validation"].update(noise_multiplier=sig,
                             noise_std=sig * alg.validation[k].sensitivity())
    out["trial_steps"] = r.steps_per_round * cfg.rounds
    sel = [e for e in (r.ledger.entries if r.ledger else []) if e.label == TUNING_LABEL]
    if sel:
        out["charged_epsilon"] = accounting.epsilon(sel[0].event, r.delta, "rdp")
        out["event"] = events.to_dict(sel[0].event)
    return out


def charged_event(charges: list[PlannedCharge]) -> dpa.DpEvent:
    """``charges`` (each its event × count) as one composed dp_accounting event."""
    return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(c.event, c.count) for c in charges])


def region_fingerprint(data: PandemicData, r: Region) -> str:
    """A short hash of the region's persons and states, recorded with its charges so a
    change of the data shows in the (silo-internal) budget store."""
    return array_digest(data.pids[r.persons], data.states[r.persons])


def reserve_regions(store: BudgetStore, regions: list[Region], cfg: PandemicConfig,
                    plans: list[SiloPlan], *, command: str,
                    charges: dict[str, list[PlannedCharge]] | None = None,
                    fingerprints: dict[str, str] | None = None) -> Job:
    """`runtime.job.open_job` for the regions: register each region's lifetime target
    (``cfg``'s, unless the store already holds one) and reserve ``charges`` (default: the
    whole run, `planned_charges`: labels "preprocess"/"node-dpsgd", which must cover the
    ``plans``' declared rounds) in one transaction — BudgetExceeded, nothing reserved, if
    any region's lifetime budget cannot pay.  Each region then gets the job's ledger
    (``r.ledger``), which may spend only what was reserved; `simulate` is handed the same
    ledgers through the job."""
    charges = charges if charges is not None else {r.name: planned_charges(r, cfg)
                                                   for r in regions}
    job = open_job(store, {cfg.method: plans},
                   lifetime={r.name: PrivacyTarget(cfg.epsilon, r.delta) for r in regions},
                   command=command, noise=cfg.noise, accountant="rdp",
                   fingerprints=fingerprints,
                   reserve={cfg.method: [c for r in regions for c in charges[r.name]]})
    for r, led in zip(regions, job.ledgers(cfg.method)):
        r.ledger = led
    return job


def node_unit(names, cfg: PandemicConfig) -> TS.NodeUnit:
    return TS.NodeUnit(cfg.S, cfg.adjacency, tuple(names), cfg.seed)


def uncharged_items(cfg: PandemicConfig) -> list[str]:
    """The data-dependent constants this config reads without any charge (by name)."""
    if cfg.preprocessing != "uncharged":
        return []
    return list(UNCHARGED_ITEMS if cfg.standardize else UNCHARGED_ITEMS[:-1])


def run_notes(cfg: PandemicConfig, scratch: bool) -> list[str]:
    """What every reader of this run's outputs must be told."""
    if not cfg.private:
        return ["NON-PRIVATE run: no differential privacy; no budget was charged"] + [
            f"uncharged: {u}" for u in uncharged_items(cfg)]
    out = []
    if cfg.noise == "seeded":
        out.append(SEEDED_NOTE)
    if scratch:
        out.append(SCRATCH_NOTE)
    out += [f"uncharged: {u}" for u in uncharged_items(cfg)]
    return out


def preprocessing_entry(r: Region, cfg: PandemicConfig) -> dict:
    """How ``r``'s data-dependent constants were obtained."""
    out = {"mode": cfg.preprocessing,
           "items": {"feature constants": (r.constants.source if r.constants else
                                           cfg.preprocessing),
                     "model-input standardization": (
                         "none" if not cfg.standardize else
                         "identity (declared)" if cfg.pooling != "summary"
                         and cfg.preprocessing != "uncharged" else cfg.preprocessing),
                     "location standardization": (
                         "uncharged" if cfg.preprocessing == "uncharged" else "declared")},
           "uncharged": uncharged_items(cfg)}
    if cfg.preprocessing != "uncharged":  # where the declared numbers come from
        out["declared_sources"] = {**DECLARED_SOURCES,
                                   "model inputs": SUMMARY_DECLARED_SOURCE}
        if cfg.declared:
            out["declared_overrides"] = dict(cfg.declared)
    if cfg.private_preprocessing and r.pre_sigma is not None:
        ev = preprocess_event(r, cfg)
        out.update(noise_multiplier=r.pre_sigma, batch=r.pre_batch,
                   epsilon_alone=ev.epsilon(r.delta), event=ev.to_dict())
    return out


def privacy_entry(r: Region, cfg: PandemicConfig, rounds: int,
                  store: BudgetStore | None = None, run_id: str | None = None) -> dict:
    """What the model records about one region's privacy after ``rounds`` rounds: the
    guarantee, its adjacency and assumptions, the noise mode, the preprocessing, and —
    with a ``store`` — the region's lifetime position."""
    entry = {"region": r.name, "method": cfg.method, "n": r.n, "S": r.S,
             "batch_size": cfg.batch_size,
             "steps": r.steps_per_round * rounds * passes_per_round(cfg),
             "noise_multiplier": r.sigma, "private": cfg.private, "noise": cfg.noise}
    if cfg.private:
        entry.update(adjacency=cfg.adjacency, adjacency_text=ADJACENCY_TEXT[cfg.adjacency],
                     affected_examples=affected_examples(r.n, r.S, cfg.adjacency),
                     assumptions=[PRUNING_ASSUMPTION, SIZES_ASSUMPTION],
                     preprocessing=preprocessing_entry(r, cfg),
                     notes=run_notes(cfg, store is None or store.scratch))
        sel = selection_summary(method_of(cfg), r.n, r.S, cfg.adjacency, cfg.epsilon, rounds)
        if sel:  # the IFCA family's cluster selections (in epsilon_spent)
            entry["selections"] = sel
    if r.ledger:
        entry.update(target_epsilon=cfg.epsilon, delta=r.ledger.target.delta,
                     epsilon_spent=r.ledger.epsilon("rdp"), accountant="rdp")
    if store is not None:
        life = store.spent(r.name)
        entry.update(budget_store=None if store.path is None else str(store.path),
                     run_id=run_id, lifetime_target_epsilon=life["target_epsilon"],
                     lifetime_delta=life["delta"], lifetime_epsilon_spent=life["epsilon"])
    return entry
