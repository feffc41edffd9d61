"""Persons linked across silos in a job: the private overlap release and linked ULDP weights.

With ``[privacy] unit = "person"`` and a consortium linkage key (``[privacy]
linkage_key_file`` or the environment variable ``SILOFL_LINKAGE_KEY``,
`silofl.data.pseudonyms`), a `silofl run` job (and `silofl persons`):

1. plans the overlap release before anything is reserved: the noisy histogram "persons in
   exactly m silos" (`silofl.privacy.overlap`) at ``[privacy] overlap_epsilon`` (default
   `DEFAULT_SHARE` of the smallest silo ε; 0 = no release), a `GaussianDpEvent(z)` per
   silo, composed into every silo's training calibration exactly as private preprocessing
   is (`merged` → `runtime.plan.plan_job(extra=...)`), so the whole job stays within each
   silo's target;
2. reserves it in every silo's lifetime store together with the training (`charges`,
   label `OVERLAP_LABEL`);
3. releases it (`release`): each silo's ledger for the release is allowed exactly the
   reserved event and records the charge in the store before any person id is
   pseudonymized; the histogram is computed from the silos' pseudonym sets at the
   linkage party and only its noisy version leaves.

Nothing of the exact histogram, no pseudonym and no key byte reaches an output.

``[training] uldp_weighting = "linked"`` gives `algorithms.uldp.ULDP` record-proportion
weights computed from the keyed pseudonyms (never from raw ids, `linked_weights`). That
tells each silo, for each of its persons, how many records the other silos hold about
them: no DP mechanism covers it, and every output says so (`LINKED_NOTE`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import dp_accounting as dpa
import numpy as np

from silofl.data.pseudonyms import KEY_ENV, LinkageKey, load_linkage_key, pseudonymize
from silofl.errors import ConfigError
from silofl.privacy import events
from silofl.privacy.budget import PlannedCharge
from silofl.privacy.ledger import Ledger
from silofl.privacy.overlap import (
    SENSITIVITY,
    OverlapRelease,
    noise_for,
    overlap_event,
    record_weights,
    release_overlap,
)
from silofl.privacy.randomness import Randomness
from silofl.runtime.job import NO_METHOD, Job

if TYPE_CHECKING:
    from silofl.config import Config

#: the label of the overlap release in ledgers and the budget store
OVERLAP_LABEL = "overlap"
#: default [privacy] overlap_epsilon as a share of the smallest silo ε
DEFAULT_SHARE = 0.05
#: the stream tag of the release's seeded noise ([training] seed, this tag)
_NOISE_TAG = 0x0E1
LINKED_NOTE = ("uldp_weighting = \"linked\": each silo is given record-proportion weights "
               "n_k,p / Σ_j n_j,p computed from keyed pseudonyms, so each silo learns, for "
               "each of its persons, the other silos' record counts of that person; no "
               "differential privacy covers that disclosure (uniform weighting avoids it)")


@dataclass
class LinkagePlan:
    """What a job does with the linkage key, fixed before anything is reserved.

    Attributes
    ----------
    key : LinkageKey
        The consortium secret (never printed, never pickled).
    epsilon : float
        ε of the overlap release per silo (0: no release).
    delta : float
        δ the release's noise was calibrated at (the smallest silo δ).
    noise_multiplier : float or None
        z of the release (noise std z·√2 persons per bin); None: no release.
    events : dict of str to dp_accounting.DpEvent
        Silo → the release's event (empty without a release).
    linked : bool
        ULDP weights from the pseudonyms ([training] uldp_weighting = "linked").
    released : OverlapRelease or None
        Set by `release`: the noisy histogram.
    """

    key: LinkageKey
    epsilon: float
    delta: float
    noise_multiplier: float | None
    events: dict[str, dpa.DpEvent] = field(default_factory=dict)
    linked: bool = False
    released: OverlapRelease | None = None


def key_configured(cfg: Config, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the job names a linkage key.

    Parameters
    ----------
    cfg : Config
        The job ([privacy] linkage_key_file).
    environ : mapping of str to str, optional
        The environment to read `KEY_ENV` from (default: ``os.environ``).

    Returns
    -------
    bool
        A key file or the environment variable is set (not yet read nor checked).
    """
    env = os.environ if environ is None else environ
    return bool(cfg.privacy.linkage_key_file or env.get(KEY_ENV))


def plan_linkage(cfg: Config, fed: Any, *, release: bool = True, standalone: bool = False,
                 environ: Mapping[str, str] | None = None) -> LinkagePlan | None:
    """The job's linkage plan: key loaded and checked, the release's noise calibrated.

    Parameters
    ----------
    cfg : Config
        The job; a plan is made for a private person-level job that names a key.
    fed : Federation or RawFederation
        The silos (their names and targets; no row is read).
    release : bool, default True
        Plan the overlap release (False: the key only, e.g. for linked weights).
    standalone : bool, default False
        A release of its own (`silofl persons`), not composed into a job's training: a
        uldp job's configuration may then release it too.
    environ : mapping, optional
        The environment (default `os.environ`).

    Returns
    -------
    LinkagePlan or None
        None: no key configured (or a non-private / example-level job).

    Raises
    ------
    ConfigError
        A bad key (`LinkageKeyError`: unreadable, too short), linked weights without a
        key, an overlap ε a silo cannot pay, or an overlap release with uldp.
    """
    pc, tc = cfg.privacy, cfg.training
    linked = "uldp" in tc.methods and tc.uldp_weighting == "linked"
    if not (pc.enabled or linked):
        return None
    if pc.unit != "person" or not key_configured(cfg, environ):
        if linked:
            raise ConfigError(
                "[training] uldp_weighting = \"linked\" weights persons linked by keyed "
                "pseudonyms: set [privacy] unit = \"person\" and [privacy] linkage_key_file "
                f"(or the environment variable {KEY_ENV}) to the consortium's key, or use "
                "uldp_weighting = \"uniform\" (1/M, no linkage)")
        return None
    key = load_linkage_key(pc.linkage_key_file or None, environ=environ)
    if not pc.enabled:  # no budget to charge: the key serves linked weights only
        return LinkagePlan(key, 0.0, pc.delta, None, linked=linked)
    targets = [s.target for s in fed.silos]
    delta = min(t.delta for t in targets)
    eps = pc.overlap_epsilon
    if "uldp" in tc.methods and not standalone:  # one σ for the consortium: nothing
        # else composes into it
        if eps:
            raise ConfigError(
                "[privacy] overlap_epsilon: uldp calibrates one σ for the consortium's "
                "aggregate and runs without other releases; set overlap_epsilon = 0 here "
                "and release the overlap with `silofl persons` before training")
        eps = 0.0
    if eps is None:
        eps = DEFAULT_SHARE * min(t.epsilon for t in targets)
    if not release or eps == 0:
        return LinkagePlan(key, 0.0, delta, None, linked=linked)
    for s in fed.silos:
        if not eps < s.target.epsilon:
            raise ConfigError(f"[privacy] overlap_epsilon = {eps:g} is not below silo "
                              f"{s.name!r}'s ε = {s.target.epsilon:g}; lower it (default: "
                              f"{DEFAULT_SHARE:g}·ε)")
    z = noise_for(float(eps), delta)
    ev = overlap_event(z)
    return LinkagePlan(key, float(eps), delta, z, {s.name: ev for s in fed.silos},
                       linked=linked)


def merged(extra: Mapping[str, dpa.DpEvent], plan: LinkagePlan | None
           ) -> dict[str, dpa.DpEvent]:
    """Per silo, everything spent outside the methods: preprocessing (`extra`) composed
    with the overlap release — what σ is calibrated with and what the reports compose.

    Parameters
    ----------
    extra : mapping of str to DpEvent
        Silo → its preprocessing release.
    plan : LinkagePlan or None

    Returns
    -------
    dict of str to DpEvent
    """
    out = dict(extra)
    for name, ev in (plan.events if plan else {}).items():
        out[name] = ev if name not in out else dpa.ComposedDpEvent([out[name], ev])
    return out


def note_calibration(plans: list[list[Any]], extra: Mapping[str, Any],
                     plan: LinkagePlan | None) -> None:
    """Say in each plan's ``calibrated_for`` that the overlap release is composed in
    (`plan_job` names every pre-training release "preprocessing").

    Parameters
    ----------
    plans : list of list of SiloPlan
        Per method, per silo (updated in place).
    extra : mapping of str to DpEvent
        Silo → its private preprocessing event (silos with none are absent).
    plan : LinkagePlan or None
        The job's linkage (None, or no release: nothing changes).
    """
    if not plan or not plan.events:
        return
    for ps in plans:
        for p in ps:
            if p.name not in plan.events:
                continue
            what = "the overlap histogram"
            if p.name in extra:
                what = "preprocessing, " + what
            text = p.calibrated_for
            p.calibrated_for = (text.replace("preprocessing", what, 1)
                                if "preprocessing" in text else f"{text}, {what}")


def charges(plan: LinkagePlan | None) -> list[PlannedCharge]:
    """The overlap release's charges, reserved with the job (`open_job(extra=...)`).

    Parameters
    ----------
    plan : LinkagePlan or None
        The job's linkage.

    Returns
    -------
    list of PlannedCharge
        One per silo (label `OVERLAP_LABEL`); empty without a release.
    """
    return [PlannedCharge(n, NO_METHOD, OVERLAP_LABEL, ev)
            for n, ev in (plan.events if plan else {}).items()]


def _lazy(key: LinkageKey, ids: Any) -> Iterator[str]:
    # a generator: the silo's ids are read only when the histogram is computed, after
    # every silo's charge
    yield from pseudonymize(key, ids).tolist()


def release(plan: LinkagePlan | None, fed: Any, job: Job, noise: str,
            seed: int) -> OverlapRelease | None:
    """Charge every silo (ledger and lifetime store), then release the noisy histogram.

    Parameters
    ----------
    plan : LinkagePlan or None
        Nothing happens without a planned release.
    fed : Federation or RawFederation
        The silos; each one's training person ids are pseudonymized with the key.
    job : Job
        The open job whose reservation holds the `charges`.
    noise : {"secure", "seeded"}
        The job's noise mode.
    seed : int
        [training] seed (seeded noise only).

    Returns
    -------
    OverlapRelease or None
        Also kept as ``plan.released``.
    """
    if plan is None or plan.noise_multiplier is None:
        return None
    ledgers = []
    for s in fed.silos:
        ev = plan.events[s.name]
        ledgers.append(Ledger(s.name, s.target, job.accountant,
                              allowance=events.flatten(ev), run_id=job.run_id,
                              on_charge=_recorder(job, s.name)))
    sets = {s.name: _lazy(plan.key, s.person_train) for s in fed.silos}
    rng = Randomness.for_mode(noise, [seed, _NOISE_TAG])
    plan.released = release_overlap(sets, ledgers, plan.noise_multiplier, rng,
                                    label=OVERLAP_LABEL)
    return plan.released


def _recorder(job: Job, silo: str):
    def record(event: dpa.DpEvent, round: int, label: str) -> None:
        job.spend_extra(silo, label)  # the store records it before any id is read
    return record


def linked_weights(key: LinkageKey, fed: Any) -> list[np.ndarray]:
    """ULDP record-proportion weights from keyed pseudonyms, never from raw ids.

    Parameters
    ----------
    key : LinkageKey
    fed : Federation or RawFederation
        Silos with training person ids.

    Returns
    -------
    list of numpy.ndarray
        Per silo, (n_persons_k,) weights n_k,p / Σ_j n_j,p in sorted person-id order (the
        order `algorithms.uldp.ULDP` expects).
    """
    rows = {s.name: pseudonymize(key, s.person_train) for s in fed.silos}
    w = record_weights({n: r.tolist() for n, r in rows.items()})
    out = []
    for s in fed.silos:
        ids = np.asarray(s.person_train)
        uniq, first = np.unique(ids, return_index=True)
        pseud = rows[s.name][first]  # each sorted person's pseudonym
        out.append(np.array([w[s.name][p] for p in pseud.tolist()], dtype=float))
    return out


def link_algorithms(algorithms: list[Any], plan: LinkagePlan | None, fed: Any) -> list[Any]:
    """Give a "linked" uldp its weights from the pseudonyms.

    Parameters
    ----------
    algorithms : list of Algorithm
        The job's methods.
    plan : LinkagePlan or None
        The job's linkage (None, or not linked: `algorithms` as given).
    fed : Federation or RawFederation
        The silos, with person ids.

    Returns
    -------
    list of Algorithm
        `algorithms`, each "linked" `ULDP` replaced by one with its person weights (others
        unchanged).
    """
    if plan is None or not plan.linked:
        return algorithms
    from silofl.algorithms.uldp import ULDP
    out = []
    for a in algorithms:
        if isinstance(a, ULDP) and a.weighting == "linked":
            a = ULDP("linked", a.declared_m, person_weights=linked_weights(plan.key, fed),
                     sample_rate=a.sample_rate)
        out.append(a)
    return out


def describe(plan: LinkagePlan | None) -> dict[str, Any] | None:
    """privacy_report.json's ``linkage``: what was linked, released and charged.

    Parameters
    ----------
    plan : LinkagePlan or None
        The job's linkage.

    Returns
    -------
    dict or None
        The key's source (the key withheld), the pseudonym scheme, the overlap release
        (noisy figures only: never a pseudonym or the exact histogram) and its notes;
        None without linkage.
    """
    if plan is None:
        return None
    out: dict[str, Any] = {
        "key": f"consortium linkage key from {plan.key.source} (withheld)",
        "pseudonyms": "HMAC-SHA256(key, person id), computed at each silo; the linkage "
                      "party sees pseudonym sets, never ids or the key",
        "notes": [LINKED_NOTE] if plan.linked else []}
    if plan.noise_multiplier is None:
        out["overlap"] = None
        out["notes"].append("no overlap histogram released ([privacy] overlap_epsilon = 0 "
                            "or uldp): the person table uses the declared M only")
        return out
    rel = plan.released.to_dict() if plan.released is not None else None
    out["overlap"] = {
        "label": OVERLAP_LABEL, "epsilon": plan.epsilon, "delta": plan.delta,
        "noise_multiplier": plan.noise_multiplier,
        "noise_std_persons": plan.noise_multiplier * SENSITIVITY,
        "charged": "to every silo's ledger and lifetime budget store, reserved with the "
                   "training; each silo's training σ is calibrated with it composed in",
        "release": rel}
    out["notes"].append(
        f"the overlap histogram (persons in exactly m silos) was released with Gaussian "
        f"noise (std {plan.noise_multiplier * SENSITIVITY:.3g} persons per bin, ε = "
        f"{plan.epsilon:.3g} at δ = {plan.delta:g}) and charged to every silo"
        if rel is not None else "the overlap release was reserved and composed into σ but "
        "not redone on resume; this run's person table has no noisy column")
    return out
