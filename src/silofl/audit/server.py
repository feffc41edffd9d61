"""The server-view (white-box) audit of a `silofl run` job: the real job, with m Dirac
gradient canaries per audited silo in auditing-only coordinates (`audit.whitebox`), each
"in" with probability ½ (the auditor's coin flip); every canary's per-pass sums are scored
with the claimed mechanism's log-likelihood ratio (`estimate.llr_scores`).

Per silo three statements, at a family-wise `confidence` (Bonferroni over silos, then
split: ¼ of the error to each rigorous bound, ½ to the estimate):

* one run (Steinke, Nasr & Jagielski 2023): guesses on the top/bottom LLR scores →
  a rigorous (ε, δ) lower bound (`bounds.one_run_audit`);
* pooled canaries: the "out" canaries are draws of the no-canary view, the "in" canaries
  of the canary view — independent coordinates, independent coin flips — so a threshold
  chosen on half and Clopper–Pearson on the other half is a rigorous lower bound too
  (`bounds.multi_run_epsilon`, over the LLR score and a QDA score fitted on the first half);
* the estimate (`estimate.estimate`): μ̂ of the LLR score read through the claimed
  mechanism family; its lower end is labelled as an estimate.

A silo is flagged when a rigorous bound or the estimate's lower end exceeds its claim.
`detectable` beside each row says the smallest true ε the estimate would have flagged.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable
from functools import lru_cache

import dp_accounting as dpa
import numpy as np

from silofl.audit.bounds import multi_run_epsilon, one_run_audit
from silofl.audit.engine import Claim, SiloAudit, per_unit
from silofl.audit.estimate import detectable, estimate, llr_scores, qda_scores
from silofl.audit.whitebox import AuditedModel, DiracCanaries, clipping_check
from silofl.errors import ConfigError
from silofl.privacy import events
from silofl.privacy.evaluate import epsilon
from silofl.privacy.ledger import tightest

#: canaries per audited silo in the server view when not given (they are coordinates,
#: not records: they cost memory and time, not privacy, and never change n or q) ...
DEFAULT_CANARIES = 50_000
#: ... unless the per-pass sums of all audited silos would exceed this many numbers
DEFAULT_CELLS = 40_000_000
#: the most canaries per silo (memory: the model grows by m parameters per silo)
MAX_CANARIES = 200_000

#: noise scales whose ε every row reports (what a copy with that much less noise would claim)
NOISE_SCALES = (0.5, 0.25)

SERVER_NOTE = ("server view (white box): m Dirac gradient canaries per audited silo in "
               "auditing-only coordinates, each in with probability 1/2; every DP-SGD step "
               "samples each canary with the silo's q and cuts its gradient (8·C) to the "
               "rule's clipping bound (the model's own per-example clipping is checked "
               "separately on public synthetic records; the records' batch sampler is not "
               "exercised: bugs there are not seen); the auditor "
               "sees every step's noisy sum, summed per local pass "
               "(what a server receives per round); the canaries are not records: they "
               "change no record's batch, n, q or σ, and their scores depend only on the "
               "noise and the coin flips")


def canary_count(canaries: int | None, silos: int = 1, passes: int = 1) -> int:
    """m for the server view: `canaries`, else `DEFAULT_CANARIES` capped so that `silos` ×
    `passes` × m stays within `DEFAULT_CELLS` (at least 1000); ConfigError outside
    [20, MAX_CANARIES]."""
    m = (min(DEFAULT_CANARIES, max(1000, DEFAULT_CELLS // max(1, silos * passes)))
         if canaries is None else int(canaries))
    if not 20 <= m <= MAX_CANARIES:
        raise ConfigError(f"the server-view audit needs between 20 and {MAX_CANARIES} "
                          f"canaries per silo (--canaries), got {m}")
    return m


@dataclasses.dataclass
class Observed:
    """One audited silo's canaries over one or more jobs: per-pass sums (m, B), steps per
    pass (B,), σ per pass (B,), q, coin flips (m,), and the job's claim and events."""

    u: np.ndarray
    steps: np.ndarray
    sigma: np.ndarray
    segment: np.ndarray
    q: float
    included: np.ndarray
    claim: Claim
    counts: Counter


def plan_probe(p, names: list[str], m: int, rng: np.random.Generator,
               seed: int | None, weaken=None) -> tuple[AuditedModel, DiracCanaries]:
    """The wrapped model and the probe for a prepared job `p` (experiments.run._prepare)."""
    order = list(p.raw.names)
    plans = p.plans[0]
    included = {order.index(n): rng.random(m) < 0.5 for n in names}
    q = np.array([pl.q for pl in plans])
    steps = np.array([pl.steps_per_pass for pl in plans])
    stream = np.random.default_rng(seed)  # the auditor's own coins (None: OS entropy)
    model = AuditedModel(p.model, m)
    return model, DiracCanaries(model.P, included, q, steps, stream, weaken=weaken)


def observe(p, probe: DiracCanaries, results, claims: dict[str, Claim], clip: float,
            extra: dict) -> dict[str, Observed]:
    """What the probe saw, per audited silo (after `_run_job`)."""
    order = list(p.raw.names)
    out = {}
    for k, inc in probe.included.items():
        name = order[k]
        u, steps = probe.per_pass(k, clip)
        seg = np.array(probe.segments(k), dtype=int)
        sig = np.array([p.plans[min(s, len(p.plans) - 1)][k].noise_multiplier
                        for s in seg], dtype=float)
        counts: Counter = Counter()
        if name in extra:
            counts += events.flatten(extra[name])
        for r in results:
            counts += r.ledgers[k].spent_counts()
        out[name] = Observed(u, steps, sig, seg, float(probe.q[k]), inc, claims[name], counts)
    return out


def pool(parts: list[dict[str, Observed]]) -> dict[str, Observed]:
    """Several jobs' observations of the same silos as one (canaries concatenated)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    return {n: dataclasses.replace(o, u=np.concatenate([x[n].u for x in parts]),
                                   included=np.concatenate([x[n].included for x in parts]))
            for n, o in first.items()}


def scaled_counts(counts: Counter, scale: float) -> dpa.DpEvent:
    """The job's executed events with every DP-SGD step's noise multiplier × `scale`."""
    out: Counter = Counter()
    for e, c in counts.items():
        if isinstance(e, dpa.PoissonSampledDpEvent) and isinstance(e.event, dpa.GaussianDpEvent):
            e = dpa.PoissonSampledDpEvent(e.sampling_probability, dpa.GaussianDpEvent(
                e.event.noise_multiplier * scale))
        out[e] += c
    return events.compose(out)


#: below this DP-SGD noise multiplier the PLD accountant's grid outgrows memory (σ = 0.1,
#: q = 0.08, 360 steps: terabytes); a copy with less noise than the job gets RDP's ε there
PLD_MIN_NOISE = 0.25


def _min_noise(counts: Counter) -> float:
    """The smallest DP-SGD noise multiplier among the events (inf if none)."""
    return min((e.event.noise_multiplier for e in counts
                if isinstance(e, dpa.PoissonSampledDpEvent)
                and isinstance(e.event, dpa.GaussianDpEvent)), default=math.inf)


def true_epsilon_fn(o: Observed) -> Callable[[float], float]:
    """c ↦ the accountant's ε (the claim's: the tighter of RDP and PLD) of the job's
    mechanism with its DP-SGD noise × c. For c < 1 whose noise falls below
    `PLD_MIN_NOISE` it is RDP's ε alone: an upper bound on the tighter one, larger than
    the claim either way (less noise than the job), so no verdict changes."""
    low = _min_noise(o.counts)

    @lru_cache(maxsize=256)
    def f(c: float) -> float:
        event = scaled_counts(o.counts, c)
        if c < 1 and low * c < PLD_MIN_NOISE:
            return float(epsilon(event, o.claim.delta, "rdp"))
        return tightest(event, o.claim.delta)[0]
    return f


def scores(o: Observed) -> dict[str, np.ndarray]:
    """(m,) scores of each canary: "llr" (each pass at its own σ), "qda" (fitted on the
    first half of each class, the half `multi_run_epsilon` chooses on) and "spread", the
    spread of its per-pass sums over √steps within each method's passes of one length —
    under fresh noise the same for every canary, under noise that repeats from pass to
    pass ~0 without the canary."""
    llr = np.zeros(o.u.shape[0])
    for s in np.unique(o.sigma):
        cols = o.sigma == s
        llr += llr_scores(o.u[:, cols], o.steps[cols], o.q, float(s))
    inc = o.included
    fit = _fit_half(inc)
    z = o.u / np.sqrt(o.steps)[None, :]
    spread = np.zeros(len(inc))
    for key in set(zip(o.segment.tolist(), o.steps.tolist())):
        cols = (o.segment == key[0]) & (o.steps == key[1])
        spread += np.sum((z[:, cols] - z[:, cols].mean(axis=1, keepdims=True)) ** 2, axis=1)
    return {"llr": llr, "qda": qda_scores(o.u, inc, fit), "spread": spread}


def cross_scores(obs: dict[str, Observed]) -> dict[str, np.ndarray]:
    """Per silo, the LLR score of its per-pass sums with what the other silos' sums predict
    of them removed (least squares on the silo's "out" canaries of the fitting half; every
    silo's canary i shares coordinate P + i). A server sees every silo's update: if the
    silos' noise is not independent (one stream shared), the residual cancels it. Under
    independent noise the prediction is ~0 and the score is ~the plain LLR."""
    out: dict[str, np.ndarray] = {}
    for name, o in obs.items():
        others = [x.u for n, x in obs.items() if n != name and x.u.shape[0] == o.u.shape[0]]
        if not others or not o.u.size:
            continue
        X = np.concatenate(others, axis=1)
        fit = _fit_half(o.included) & ~o.included
        if fit.sum() <= 2 * X.shape[1]:  # too few canaries to fit the prediction
            continue
        beta, *_ = np.linalg.lstsq(X[fit], o.u[fit], rcond=None)
        r = o.u - X @ beta
        llr = np.zeros(o.u.shape[0])
        for s in np.unique(o.sigma):
            cols = o.sigma == s
            llr += llr_scores(r[:, cols], o.steps[cols], o.q, float(s))
        out[name] = llr
    return out


def _fit_half(inc: np.ndarray) -> np.ndarray:
    """The first half of each class (in canary order): where scores are fitted and the
    pooled test chooses its threshold (`multi_run_epsilon` splits the same way)."""
    fit = np.zeros_like(inc)
    for cls in (inc, ~inc):
        idx = np.flatnonzero(cls)
        fit[idx[: len(idx) // 2]] = True
    return fit


def check_clipping(probe: DiracCanaries, model, fed, rng: np.random.Generator) -> dict:
    """`whitebox.clipping_check` of every rule the job trained with (the worst)."""
    shape = fed.silos[0].X_train.shape[1:]
    checks = [clipping_check(r, model, shape, fed.task, fed.num_classes, rng)
              for r in {id(r): r for r in probe.rules}.values()]
    return max(checks, key=lambda c: c["ratio"])


def assess(name: str, o: Observed, confidence: float, units: int,
           cross: np.ndarray | None = None, clip: dict | None = None) -> SiloAudit:
    """One silo's row: both rigorous bounds, the estimate, its power. `cross`: the
    silo's `cross_scores` (a further score for the pooled bound); `clip`: the job's
    `check_clipping` (a record above C is a rigorous refutation: ε at noise ÷ ratio)."""
    c_unit = per_unit(confidence, units)
    c_rig, c_est = 1 - (1 - c_unit) / 4, 1 - (1 - c_unit) / 2
    sc = scores(o)
    if cross is not None:
        sc["llr, other silos' noise removed"] = cross
    inc, d = o.included, o.claim.delta
    one = one_run_audit({"llr": sc["llr"]}, inc, d, c_rig)
    pooled = multi_run_epsilon({k: v[~inc] for k, v in sc.items()},
                               {k: v[inc] for k, v in sc.items()}, d, c_rig)
    f = true_epsilon_fn(o)
    sigma = float(np.median(o.sigma))  # σ of the family the estimate reads μ̂ through
    e = estimate(sc["llr"][~inc], sc["llr"][inc], o.steps, o.q, sigma, f, c_est)
    power = detectable(o.steps, o.q, sigma, o.claim.epsilon, int((~inc).sum()),
                           int(inc.sum()), c_est, f)
    rigorous = max(one["epsilon"], pooled["epsilon"])
    if clip is not None and not clip["ok"]:  # a record as private as noise σ/ratio
        clip = dict(clip, epsilon=f(1 / clip["ratio"]))
        rigorous = max(rigorous, clip["epsilon"])
    details = {"view": "server", "canaries": int(inc.size), "included": int(inc.sum()),
               "passes": int(o.steps.size), "steps": int(o.steps.sum()),
               "sampling_rate": o.q, "noise_multiplier": sigma,
               "one_run": _trim(one), "pooled": pooled, "estimate": e,
               "clipping_check": clip,
               "power": power, "rigorous_lower_bound": rigorous,
               "estimate_lower": e["epsilon_lower"], "detectable_epsilon":
               power["detectable_epsilon"], "confidence_rigorous": c_rig,
               "confidence_estimate": c_est,
               # the accountant's ε were the noise smaller (the self-test's copies)
               "epsilon_at_noise_scale": {f"{c:g}": f(c) for c in NOISE_SCALES}}
    return SiloAudit(name, o.claim.epsilon, o.claim.target_epsilon, d, rigorous, details,
                     estimate_lower=e["epsilon_lower"])


def _trim(one: dict) -> dict:
    return {k: v for k, v in one.items() if k != "tries"}
