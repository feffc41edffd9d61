"""Audit of a job's private preprocessing release (`silofl.data.preprocess`, the "private"
standardize/impute modes): per silo one Gaussian release of (count, Σu, Σ(u² − 1)) per
column, post-processed into the centers, scales and fills saved with the models.

Neighbouring datasets D (the silo's data) and D′ = D + one canary record (at the declared
column bounds, `canaries.make_canaries`: the record of largest sensitivity, observed in
every released column at u = ±1). Each run is ONLY the preprocessing release -- planned,
charged, applied -- on D or D′ (interleaved, so a drift in time cannot pose as a signal),
with the job's noise mode; the attacker sees every silo's released centers, scales and
fills, and adds one statistic of its own: the audited silo's released means summed along
the canary (`ALIGNED`; at heart's noise it separates D from D′ ~1.7× better than the best
single column). It picks one statistic, a direction and a threshold on the first half of
the runs, the second half giving a Clopper–Pearson bound (`bounds.multi_run_epsilon`).
The claim is the release's own: ε of the plan's ``events[silo]`` at the silo's δ under the
job's accountant (``share``·ε_k as calibrated).

What it can see (heart, ε = 1, share 0.1: claim 0.1; 500 + 500 releases): the release
without noise (bound 3.9 at 4 silos' Bonferroni); noise × 0.03 (true ε 4.8) only with
~1000 + 1000 (bound ~1.1); not noise × 0.1 (true ε 1.2) or milder. The release's claim is
small, and a Clopper–Pearson bound from a few hundred runs cannot certify a small ε.

``weaken=True`` audits a deliberately broken copy (`preprocess.weakened_for_audit`: the
release without noise, the honest claim unchanged -- an uncharged standardization): the
check, for ``silofl audit --self-test``, that this audit has the power to see it.

Charging: every run reads the silos' training rows, so every run's release is reserved and
settled like a job's ("preprocess" charges of every silo with a private release) -- each
run on its own fresh in-memory scratch store, as the multi-run training audit does. That is
an experiment, not a release: the audit refuses unless the caller's store is a scratch one
(``--scratch`` or ``[budget] scratch = true``); nothing is charged to a real store and
nothing computed here is saved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from silofl.audit.bounds import multi_run_epsilon
from silofl.audit.canaries import Canaries, check_canaries, insert, make_canaries
from silofl.audit.engine import SiloAudit, check_confidence, check_runs, per_unit
from silofl.data.preprocess import (
    PreprocessPlan,
    PreprocessSpec,
    apply_preprocessing,
    plan_preprocessing,
    weakened_for_audit,
)
from silofl.data.raw import RawFederation
from silofl.errors import ConfigError
from silofl.experiments import build
from silofl.privacy import evaluate
from silofl.privacy.accounting import DEFAULT_ACCOUNTANT
from silofl.privacy.budget import BudgetStore, PlannedCharge
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.job import NO_METHOD, fingerprints, open_job

#: releases on each of D and D′ per audited silo (each costs milliseconds: no training)
DEFAULT_RUNS = 500
COMMAND = "silofl audit (preprocessing release)"
CHARGED_NOTE = ("each run's preprocessing release was charged to its own in-memory scratch "
                "store (an experiment, not a release); nothing was charged to a real store")
#: the statistic that sums the audited silo's released means along the canary (`_aligned`)
ALIGNED = "released means along the canary"
_NOISE_SEED_TAG = 0x9E7  # the tag `experiments.run` seeds the release's noise stream with


@dataclasses.dataclass
class _Neighbour:
    """D or D′ of one audited silo: the raw federation, its plan and what a run charges."""

    raw: RawFederation
    plan: PreprocessPlan          # what runs (weakened: no noise)
    claimed_sigma: dict[str, float]  # the honest plan's σ_k, what the claim is for
    charges: list[PlannedCharge]
    fingerprints: dict[str, str]
    accountant: str
    targets: dict[str, PrivacyTarget]


def audit_release(raw: RawFederation, *, spec: PreprocessSpec, store: BudgetStore,
                  silos: Sequence[str] | None = None, runs: int = DEFAULT_RUNS,
                  confidence: float = 0.95, canary: Canaries | None = None,
                  weaken: bool = False, accountant: str = DEFAULT_ACCOUNTANT,
                  noise: str = "secure", seed: int = 0,
                  rng: np.random.Generator | None = None,
                  on_progress: Callable[[int, int], None] | None = None) -> list[SiloAudit]:
    """Audit the private preprocessing release of `raw` on neighbouring datasets.

    Every input is checked before any run (and before any charge). Each run is charged to
    its own fresh scratch store (see the module docstring); `store` is the store the caller
    would charge and must itself be a scratch store (the user's consent to an experiment).

    Parameters
    ----------
    raw : RawFederation
        Encoded, split silos with their privacy targets attached (`with_targets`).
    spec : PreprocessSpec
        The preprocessing audited; at least one step must be "private".
    store : BudgetStore
        The caller's store; ConfigError unless ``store.scratch``.
    silos : sequence of str, optional
        The audited silos (default: every silo); with K of them each bound is taken at
        1 − (1 − confidence)/K, so `confidence` is family-wise.
    runs : int, default 500
        Releases on each of D and D′ per silo (at least `engine.MIN_RUNS`).
    confidence : float, default 0.95
        Family-wise confidence of the lower bounds, in [0.5, 1).
    canary : Canaries, optional
        Its first record is the canary (raw encoded features (1, d), label (1,));
        default: one drawn by `make_canaries` from `rng`.
    weaken : bool, default False
        Audit the release without noise under the honest claim (the self-test).
    accountant : {"pld", "rdp"}
        The job's accountant: σ is calibrated and the claim evaluated under it.
    noise : {"secure", "seeded"}
        The job's noise mode; "seeded" replays one noise draw in every run, as re-running
        a seeded job does (and an audit flags it).
    seed : int
        The job's training seed (seeded noise only).
    rng : numpy.random.Generator, optional
        Draws the canary (default: OS entropy).
    on_progress : callable (done, total) -> None, optional
        Called after each release.

    Returns
    -------
    list of SiloAudit
        Per silo: claimed ε of its release (``claimed_epsilon``; ``target_epsilon`` the
        share of ε_k it was calibrated to), δ, the lower bound, and details
        (`multi_run_epsilon`'s, with "runs", "weakened", "noise_multiplier" (what ran),
        "claimed_noise_multiplier", "sensitivity", "canary" and "charged").

    Raises
    ------
    ConfigError, DataError
        A non-scratch store, no private step, unknown silos, too few runs, a confidence
        outside [0.5, 1), a canary that does not fit, a silo without a privacy target.
    """
    names, targets = _checked(raw, store, silos, runs, confidence)
    c = canary if canary is not None else make_canaries(raw, 1, rng or
                                                        np.random.default_rng())
    c = Canaries(np.asarray(c.X)[:1], np.asarray(c.y)[:1])
    pairs = {n: _neighbours(raw, n, c, spec, accountant, weaken, targets) for n in names}
    total, done = 2 * runs * len(names), 0
    rows = []
    for name, pair in pairs.items():
        stats: tuple[dict, dict] = ({}, {})
        for i in range(2 * runs):
            which = i % 2  # interleaved, as the engine's multi-run audit
            for key, v in _one_release(pair[which], noise, seed).items():
                stats[which].setdefault(key, []).append(v)
            done += 1
            if on_progress:
                on_progress(done, total)
        for part in stats:  # one more statistic: the audited silo's means along the canary
            part[f"{name}: {ALIGNED}"] = _aligned(raw, name, c, pair[0].plan, part)
        # the canary moves only its own silo's release: the others' statistics could only
        # be chosen by chance, at the cost of power
        stats = tuple({k: v for k, v in part.items() if k.startswith(f"{name}: ")}
                      for part in stats)  # type: ignore[assignment]
        row = _row(targets[name], name, pair[0], stats, runs, weaken,
                   per_unit(confidence, len(names)))
        row.details["canary"] = {"X": c.X[0].tolist(), "y": float(c.y[0])}  # public facts
        rows.append(row)
    return rows


def _aligned(raw: RawFederation, silo: str, c: Canaries, plan: PreprocessPlan,
             stats: dict[str, list[float]]) -> list[float]:
    """Per run Σ_j u_j·m_j over the released columns j of `silo`: u_j the canary's value
    and m_j the released mean, both mapped to [-1, 1] by the declared bounds (m_j read
    back from the private center, else the private fill). Post-processing of the release
    and the public canary; adding the canary moves every m_j towards u_j, so the sum
    gathers the shift of all columns at once (a single column sees ~1/√d of it)."""
    total = np.zeros(len(next(iter(stats.values()))))
    private = {(st.what, st.column) for st in plan.steps if st.mode == "private"}
    for j in plan.released:
        col = raw.specs[j]
        lo, hi = col.bounds  # type: ignore[misc]  # a released column has bounds
        mid, half = (lo + hi) / 2, (hi - lo) / 2
        u = float(np.clip((c.X[0, j] - mid) / half, -1.0, 1.0))
        what = "center" if ("standardize", col.name) in private else "fill"
        total += u * (np.asarray(stats[f"{silo}: {what} of {col.name}"]) - mid) / half
    return total.tolist()


def _checked(raw: RawFederation, store: BudgetStore, silos: Sequence[str] | None, runs: int,
             confidence: float) -> tuple[list[str], dict[str, PrivacyTarget]]:
    """(audited silos, every silo's target), or the error of a bad input."""
    check_runs(runs)
    check_confidence(confidence)
    if not store.scratch:
        raise ConfigError(
            f"a release audit computes the silos' private preprocessing statistics {runs} "
            "times on each of D and D′: an experiment, not a release, that would spend many "
            "releases' worth of each silo's lifetime budget. Run it on a scratch store "
            "(--scratch, or [budget] scratch = true)")
    names = list(raw.names if silos is None else silos)
    if not names:
        raise ConfigError("no silo to audit; name at least one")
    for name in names:
        raw.silo(name)  # a clear error for an unknown silo
    return names, _targets(raw)


def _targets(raw: RawFederation) -> dict[str, PrivacyTarget]:
    """Every silo's (ε, δ); ConfigError for a silo without one."""
    out = {}
    for s in raw.silos:
        if s.target is None:
            raise ConfigError(f"silo {s.name!r} has no ε claim; attach its (ε, δ) target")
        out[s.name] = s.target
    return out


def _neighbours(raw: RawFederation, silo: str, c: Canaries, spec: PreprocessSpec,
                accountant: str, weaken: bool,
                targets: dict[str, PrivacyTarget]) -> tuple[_Neighbour, _Neighbour]:
    """(D, D′) of `silo`, planned from public facts (σ depends on the target only)."""
    check_canaries(raw, silo, c)
    out = []
    for inc in (False, True):
        r = insert(raw, silo, c, np.array([inc]))
        plan = plan_preprocessing(r, spec, targets, accountant)  # type: ignore[arg-type]
        if not plan.private:
            raise ConfigError(
                f"preprocessing standardize={spec.standardize!r}, impute={spec.impute!r} "
                "releases no private statistic, so there is no DP release to audit "
                "(declared steps read no data; uncharged ones claim nothing and are listed "
                "as uncharged). Make a step private to audit it: [data] standardize = "
                "\"private\" (or impute = \"private\"), e.g. --set "
                "data.standardize=private")
        charges = [PlannedCharge(n, NO_METHOD, "preprocess", e)
                   for n, e in plan.events.items() if e is not None]
        out.append(_Neighbour(r, weakened_for_audit(plan, 0.0) if weaken else plan,
                              dict(plan.noise_multipliers), charges,
                              fingerprints(r), accountant, targets))
    return out[0], out[1]


def _one_release(nb: _Neighbour, noise: str, seed: int) -> dict[str, float]:
    """One charged release on `nb`: reserve on a fresh scratch store, record, apply,
    settle. Returns every silo's released center, scale and fill by name."""
    job = open_job(BudgetStore(None), {}, lifetime=nb.targets,
                   command=COMMAND, noise=noise, accountant=nb.accountant,
                   fingerprints=nb.fingerprints, extra=nb.charges)
    try:
        for ch in nb.charges:
            job.spend_extra(ch.silo, "preprocess")
        fed = apply_preprocessing(nb.raw, nb.plan,
                                  Randomness.for_mode(noise, [seed, _NOISE_SEED_TAG]))
    except BaseException:
        job.settle("failed")
        raise
    job.settle()
    out = {}
    for silo, own in fed.meta["constants"]["silos"].items():
        for col, (center, scale) in own["standardize"].items():
            out[f"{silo}: center of {col}"] = float(center)
            out[f"{silo}: scale of {col}"] = float(scale)
        for col, fill in own["fill"].items():
            out[f"{silo}: fill of {col}"] = float(fill)
    return out


def _row(target: PrivacyTarget, silo: str, nb: _Neighbour, stats: tuple[dict, dict],
         runs: int, weaken: bool, confidence: float) -> SiloAudit:
    """The SiloAudit of `silo`: the claim of its release event, the bound from `stats`
    (per neighbour, statistic name -> one value per run)."""
    plan = nb.plan
    event = plan.events[silo]  # the honest event: a weakened plan keeps the claim
    claimed = (evaluate.epsilon(event, target.delta, kind=nb.accountant)  # type: ignore[arg-type]
               if event is not None else 0.0)
    res = multi_run_epsilon({k: np.array(v) for k, v in stats[0].items()},
                            {k: np.array(v) for k, v in stats[1].items()},
                            target.delta, confidence)
    # the threshold is a value of a released statistic (a silo's noisy mean, released on a
    # scratch store, uncharged): it is not reported; the statistic's name and the bound are
    res.pop("threshold", None)
    res.update(runs=runs, weakened=bool(weaken), release="preprocessing",
               noise_multiplier=plan.noise_multipliers.get(silo, 0.0),
               claimed_noise_multiplier=nb.claimed_sigma.get(silo, 0.0),
               sensitivity=plan.sensitivity, charged=CHARGED_NOTE)
    return SiloAudit(silo, claimed, plan.spec.share * target.epsilon, target.delta,
                     res["epsilon"], res)


def release_store(cfg, store: BudgetStore | None) -> BudgetStore:
    """The store a release audit of `cfg` charges: `store`, else a scratch store when
    [budget] scratch; ConfigError when privacy is off or no scratch store is allowed."""
    if not cfg.privacy.enabled:
        raise ConfigError("a release audit compares a claimed ε with an empirical lower "
                          "bound, but this config has no ε claim (privacy is disabled); "
                          "enable [privacy] with epsilon and delta")
    if store is None:
        if not cfg.budget.scratch:
            raise ConfigError("a release audit is an experiment, not a release: run it on a "
                              "scratch store (--scratch, or [budget] scratch = true)")
        store = BudgetStore(None)
    return store


def audit_job_release(cfg, *, silo: str | None = None, runs: int = DEFAULT_RUNS,
                      confidence: float = 0.95, store: BudgetStore | None = None,
                      spec: PreprocessSpec | None = None, canary: Canaries | None = None,
                      weaken: bool = False, seed: int | None = None,
                      on_progress: Callable[[int, int], None] | None = None
                      ) -> list[SiloAudit]:
    """`audit_release` of the job `cfg` describes: its data, targets, accountant, noise
    mode and preprocessing (or `spec`, e.g. ``PreprocessSpec("private", impute)`` to
    audit a private release for a job whose preprocessing is declared).

    Parameters
    ----------
    cfg : Config
        The job (`load_config`); privacy must be enabled.
    silo : str, optional
        The audited silo (default: every silo, Bonferroni over them).
    runs, confidence, canary, weaken, on_progress
        As `audit_release`.
    store : BudgetStore, optional
        The caller's store (default: a scratch store when [budget] scratch, else refused):
        it must be a scratch store; each run is charged to its own fresh one.
    spec : PreprocessSpec, optional
        The preprocessing audited (default: the job's [data] standardize/impute/share).
    seed : int, optional
        Seed of the canary (default: OS entropy).

    Returns
    -------
    list of SiloAudit
        One row per audited silo (see `audit_release`).

    Raises
    ------
    ConfigError
        Privacy disabled, a non-scratch store, or bad input (see `audit_release`).
    """
    store = release_store(cfg, store)
    raw = build.apply_privacy(build.load_raw(cfg.data), cfg)
    return audit_release(
        raw, spec=spec or build.preprocess_spec(cfg.data), store=store,
        silos=None if silo is None else [silo], runs=runs, confidence=confidence,
        canary=canary, weaken=weaken, accountant=cfg.privacy.accountant,
        noise=cfg.privacy.noise, seed=cfg.training.seed, rng=np.random.default_rng(seed),
        on_progress=on_progress)
