"""The white-box audit of a job's private preprocessing release: Dirac canaries in
auditing-only rows of the release (`data.column_stats.ReleaseProbe`).

The release is one Gaussian mechanism per silo: its (d, 3) statistics plus N(0, (σΔ)²) on
every coordinate, Δ the L2 sensitivity of one record. The probe appends m rows to each
audited silo's statistics before the noise — the same draw, the same σΔ — and puts each
"in" canary's full sensitivity Δ into its own row (the auditor's coin, probability ½). A
row is then N(Δ·b, (σΔ)²) in its first coordinate: the release as its accountant sees it,
for a record that uses all of its sensitivity. The score is that coordinate over Δ.

Per silo, from ONE release: a rigorous pooled Clopper–Pearson bound (out and in rows are
independent draws), and the estimate μ̂ with its one-sided lower limit read as the ε of a
Gaussian mechanism with that μ (`bounds.gdp_epsilon`: exact for a single Gaussian release,
whose tradeoff curve *is* G_μ; the estimate's only approximation is the normal law of μ̂).
The claim is the release's own ε. The canaries change no record and no statistic the
release outputs; their rows depend only on the noise and the coin flips. The release reads
the silos' data: it is reserved and settled like a job's preprocessing, on a scratch store.
"""

from __future__ import annotations

import numpy as np

from silofl.audit.bounds import gdp_epsilon, multi_run_epsilon
from silofl.audit.engine import SiloAudit, per_unit
from silofl.audit.estimate import mu_hat
from silofl.data.preprocess import (
    PreprocessSpec,
    apply_preprocessing,
    plan_preprocessing,
    weakened_for_audit,
)
from silofl.errors import ConfigError
from silofl.privacy import evaluate
from silofl.privacy.budget import BudgetStore, PlannedCharge
from silofl.privacy.randomness import Randomness
from silofl.runtime.job import NO_METHOD, fingerprints, open_job

#: canary rows per audited silo (a release is cheap: rows cost memory, not privacy)
DEFAULT_ROWS = 200_000
COMMAND = "silofl audit (preprocessing release, white box)"


class ReleaseCanaries:
    """The release probe: m canary rows per audited silo (module docstring)."""

    def __init__(self, included: dict[str, np.ndarray], sensitivity: float):
        self.included, self.delta = included, float(sensitivity)
        self.rows: dict[str, np.ndarray] = {}

    def extend(self, silo: str, stats: np.ndarray) -> np.ndarray:
        inc = self.included.get(silo)
        if inc is None:
            return stats
        extra = np.zeros((inc.size, stats.shape[1]))
        extra[:, 0] = self.delta * inc
        return np.concatenate([stats, extra])

    def observe(self, silo: str, released: np.ndarray) -> None:
        inc = self.included.get(silo)
        if inc is not None:
            self.rows[silo] = released[-inc.size:, 0] / self.delta


def audit_release_rows(raw, *, spec: PreprocessSpec, store: BudgetStore, silos: list[str],
                       targets: dict, confidence: float, accountant: str, noise: str,
                       seed: int, rows: int = DEFAULT_ROWS,
                       rng: np.random.Generator | None = None,
                       noise_factor: float | None = None) -> list[SiloAudit]:
    """One charged release of `raw`'s private preprocessing with `rows` canary rows per
    silo of `silos`; one SiloAudit each (claim: the release's ε). `noise_factor` (the
    self-test): the release's noise × factor under the honest claim. `store` must be a
    scratch store (the release reads data; it is an experiment, not a release)."""
    if not store.scratch:
        raise ConfigError("a release audit is an experiment, not a release: run it on a "
                          "scratch store (--scratch, or [budget] scratch = true)")
    if rows < 20:
        raise ConfigError(f"a white-box release audit needs at least 20 canary rows, got "
                          f"{rows} (--canaries)")
    plan = plan_preprocessing(raw, spec, targets, accountant)
    if not plan.private:
        raise ConfigError("the job's preprocessing releases no private statistic: make a "
                          "step private to audit it ([data] standardize = \"private\", e.g. "
                          "--set data.standardize=private)")
    ran = plan if noise_factor is None else weakened_for_audit(plan, noise_factor)
    rng = rng if rng is not None else np.random.default_rng()
    probe = ReleaseCanaries({n: rng.random(rows) < 0.5 for n in silos}, plan.sensitivity)
    charges = [PlannedCharge(n, NO_METHOD, "preprocess", e)
               for n, e in plan.events.items() if e is not None]
    job = open_job(store, {}, lifetime=targets, command=COMMAND, noise=noise,
                   accountant=accountant, fingerprints=fingerprints(raw), extra=charges)
    try:
        for ch in charges:
            job.spend_extra(ch.silo, "preprocess")
        apply_preprocessing(raw, ran, Randomness.for_mode(noise, [seed, 0x9E7, 1]), probe)
    except BaseException:
        job.settle("failed")
        raise
    job.settle()
    out = []
    c_unit = per_unit(confidence, len(silos))
    for n in silos:
        x, inc, t = probe.rows[n], probe.included[n], targets[n]
        claim = evaluate.epsilon(plan.events[n], t.delta, kind=accountant)  # type: ignore
        pooled = multi_run_epsilon({"row": x[~inc]}, {"row": x[inc]}, t.delta,
                                   1 - (1 - c_unit) / 2)
        pooled.pop("threshold", None)  # a noise value of the release: not reported
        mu, lower, se = mu_hat(x[~inc], x[inc], 1 - (1 - c_unit) / 2)
        est = {"mu": mu, "mu_lower": lower, "se": se,
               "epsilon": gdp_epsilon(mu, t.delta),
               "epsilon_lower": gdp_epsilon(lower, t.delta),
               "assumes": "a Gaussian release (exact for this mechanism); the interval is "
                          "normal theory for μ̂"}
        details = {"view": "release (white box)", "canaries": int(rows),
                   "included": int(inc.sum()), "pooled": pooled, "estimate": est,
                   "noise_factor": noise_factor, "sensitivity": plan.sensitivity,
                   "claimed_noise_multiplier": plan.noise_multipliers[n]}
        out.append(SiloAudit(n, claim, plan.spec.share * t.epsilon, t.delta,
                             pooled["epsilon"], details, estimate_lower=est["epsilon_lower"]))
    return out


def audit_job(cfg, *, silo: str | None = None, rows: int | None = None,
              confidence: float = 0.95, store: BudgetStore | None = None,
              spec: PreprocessSpec | None = None, noise_factor: float | None = None,
              seed: int | None = None) -> list[SiloAudit]:
    """`audit_release_rows` of the job `cfg` describes (its data, targets, accountant,
    noise mode and preprocessing, or `spec`); `store` default: a scratch store when
    [budget] scratch, else refused."""
    from silofl.audit.jobs import audited_silos
    from silofl.audit.release import release_store
    from silofl.experiments import build
    store = release_store(cfg, store)
    raw, names = audited_silos(cfg, silo)
    return audit_release_rows(
        raw, spec=spec or build.preprocess_spec(cfg.data), store=store, silos=names,
        targets={s.name: s.target for s in raw.silos}, confidence=confidence,
        accountant=cfg.privacy.accountant, noise=cfg.privacy.noise, seed=cfg.training.seed,
        rows=DEFAULT_ROWS if rows is None else int(rows), rng=np.random.default_rng(seed),
        noise_factor=noise_factor)
