"""The server's view, white box: Dirac gradient canaries at the DP-SGD step.

A federated server sees every update a silo releases, round after round; the accountant
assumes even more — every DP-SGD step's noisy gradient. This module puts m canaries per
audited silo into that view without touching the real records:

* `AuditedModel` appends m *auditing-only* coordinates to the model's parameters. No
  record's gradient touches them and predictions ignore them, but the DP-SGD noise is added
  to all P + m coordinates, exactly as to the model's own.
* `DiracCanaries` is the step probe (`training.dpsgd.StepProbe`): at every step each
  canary of silo k joins the batch with the silo's sampling rate q_k (Poisson, like every
  record) when it is "in" (the auditor's coin flip); its gradient is `norm_factor`·C along
  its own coordinate, clipped by the run's rule to C — the largest contribution a record
  may make. After the noise, it sums what each coordinate receives over each local pass:
  the (m, B) per-pass sums `estimate.llr_scores` scores.

The canaries are not records: they do not change n, q, σ or any real record's batch, and
since a DP-SGD guarantee holds for every record whatever the others are, each canary is
exactly as protected as a record (per-example clipping, the same noise). Their scores are
functions of the noise and the auditor's coin flips only — they do not depend on the
silo's data.

`weakened` builds the deliberately broken copies of the rule that `silofl audit
--self-test` runs (noise × ½, × ¼, clipping off, replayed noise): they keep the claim and
the accounting of the real rule (the ledgers charge the nominal σ) and change only what
the step does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from silofl.models.base import Model
from silofl.training.dpsgd import GradientRule

#: a canary's gradient norm before clipping, in units of C: clipping must cut it to C
NORM_FACTOR = 8.0


class AuditedModel(Model):
    """`base` with m auditing-only coordinates appended to its parameters (P + m): they
    receive DP-SGD noise (and canaries) like every parameter but no record's gradient, and
    predictions and losses ignore them."""

    def __init__(self, base: Model, m: int):
        self.base, self.m, self.P = base, int(m), int(base.num_params)
        self.num_params = self.P + self.m
        self.name, self.tasks = base.name, base.tasks

    def __getattr__(self, name: str) -> Any:  # metric, hidden, ... of the base model
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def init_params(self) -> np.ndarray:
        return np.concatenate([self.base.init_params(), np.zeros(self.m)])

    def check_task(self, task: str) -> None:
        self.base.check_task(task)

    def per_example_grads(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        g = self.base.per_example_grads(w[: self.P], X, y)
        return np.concatenate([g, np.zeros((g.shape[0], self.m))], axis=1)

    def loss(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        return self.base.loss(w[..., : self.P], X, y)

    def predict(self, w: np.ndarray, X: np.ndarray) -> np.ndarray:
        return self.base.predict(w[..., : self.P], X)

    def _pad(self, g: np.ndarray) -> np.ndarray:
        out = np.zeros((g.shape[0], self.num_params))
        out[:, : self.P] = g
        return out

    def clipped_grad_sum(self, W: np.ndarray, X: np.ndarray, y: np.ndarray, mask: np.ndarray,
                         clip: float, **aux: Any) -> np.ndarray:
        return self._pad(self.base.clipped_grad_sum(W[:, : self.P], X, y, mask, clip, **aux))

    def grad_sum(self, W: np.ndarray, X: np.ndarray, y: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self._pad(self.base.grad_sum(W[:, : self.P], X, y, mask))


class DiracCanaries:
    """The step probe: m gradient canaries per audited silo (see the module docstring).

    Parameters
    ----------
    P : int
        The model's own parameters; canary i of a silo lives in coordinate P + i.
    included : dict of int to numpy.ndarray
        Silo index (in the trainer's order) → (m,) bool, the auditor's coin flips.
    q : numpy.ndarray
        (K,) each silo's Poisson sampling rate (the trainer's q_k = min(1, b/n_k)).
    pass_steps : numpy.ndarray
        (K,) DP-SGD steps of one local pass per silo: the per-pass sums' length.
    rng : numpy.random.Generator
        The canaries' sampling: the auditor's own coins, not privacy noise (NumPy PCG64,
        from OS entropy unless the audit is seeded).
    weaken : callable, optional
        rule → rule: a deliberately weakened copy for the self-test (`weakened`).
    """

    def __init__(self, P: int, included: dict[int, np.ndarray], q: np.ndarray,
                 pass_steps: np.ndarray, rng: np.random.Generator, weaken=None):
        self.P, self.included = int(P), {int(k): np.asarray(v, bool)
                                         for k, v in included.items()}
        self.m = len(next(iter(self.included.values())))
        self.q, self.pass_steps = np.asarray(q, float), np.asarray(pass_steps, int)
        self.rng, self.weaken = rng, weaken
        self._acc = {k: np.zeros(self.m) for k in self.included}
        self._n = dict.fromkeys(self.included, 0)
        self.sums: dict[int, list[np.ndarray]] = {k: [] for k in self.included}
        self.steps: dict[int, list[int]] = {k: [] for k in self.included}
        self.segment = -1  # one per run (method) the probe is attached to
        self._segments: dict[int, list[int]] = {k: [] for k in self.included}
        self.rules: list[GradientRule] = []  # the rules the job trained with

    def attach(self, rule: GradientRule) -> GradientRule:
        """The rule a run trains with: `rule` (or its weakened copy) with this probe. Each
        attach starts a segment (a job's next method), so passes never straddle methods."""
        for k in self.included:
            self._flush(k)
        self.segment += 1
        rule = self.weaken(rule) if self.weaken is not None else rule
        rule = dataclasses.replace(rule, probe=self)
        self.rules.append(rule)
        return rule

    def add(self, rule: GradientRule, silos: np.ndarray, clipped: np.ndarray) -> None:
        size = float(rule.clipped_norm(NORM_FACTOR * rule.clip))
        for j, k in enumerate(np.atleast_1d(silos)):
            inc = self.included.get(int(k))
            if inc is not None:
                joined = self.rng.random(self.m, dtype=np.float32) < self.q[int(k)]
                clipped[j, self.P:] += (joined & inc) * size

    def observe(self, silos: np.ndarray, noisy: np.ndarray) -> None:
        for j, k in enumerate(np.atleast_1d(silos)):
            k = int(k)
            if k in self.included:
                self._acc[k] += noisy[j, self.P:]
                self._n[k] += 1
                if self._n[k] == self.pass_steps[k]:
                    self._flush(k)

    def _flush(self, k: int) -> None:
        if self._n[k]:
            self.sums[k].append(self._acc[k].copy())
            self.steps[k].append(self._n[k])
            self._segments[k].append(self.segment)
            self._acc[k][:] = 0.0
            self._n[k] = 0

    def per_pass(self, k: int, clip: float) -> tuple[np.ndarray, np.ndarray]:
        """Silo k's (m, B) per-pass sums in units of C, and (B,) steps per pass (a last,
        partial pass included)."""
        self._flush(k)
        if not self.sums[k]:
            return np.zeros((self.m, 0)), np.zeros(0, dtype=int)
        return np.stack(self.sums[k], axis=1) / clip, np.array(self.steps[k])

    def segments(self, k: int) -> list[int]:
        """(B,) the segment (method, in run order) of each of silo k's passes."""
        self._flush(k)
        return list(self._segments[k])


def clipping_check(rule: GradientRule, model: Model, shape: tuple, task: str, classes: int,
                   rng: np.random.Generator, records: int = 48) -> dict:
    """Does the run's clipping keep *every* record's gradient within C? The canaries are
    clipped by the rule's formula (`clipped_norm`), so a fault in a model's own
    per-example clipping would not reach them; this check sends synthetic records (public:
    random features at scales 0.1 … 1000 in the model's input `shape`, random labels)
    through the run's `rule.clipped_sum` one at a time, at the model's start and at a
    random parameter point, and reports the largest norm over C ("ratio"). DP-SGD's
    guarantee is for every possible record, so one record above C refutes the calibration:
    a record of norm r·C under noise σ·C is as private as noise σ/r."""
    scales = np.logspace(-1, 3, records)
    X = rng.normal(size=(records,) + tuple(shape)) * scales.reshape((-1,) + (1,) * len(shape))
    y = (rng.normal(size=records) if task == "regression"
         else rng.integers(0, max(classes, 2), size=records).astype(float))
    worst = 0.0
    for w in (model.init_params(), rng.normal(size=model.num_params)):
        for i in range(records):
            g = rule.clipped_sum(model, w[None], X[None, i:i + 1], y[None, i:i + 1],
                                 np.ones((1, 1)))
            worst = max(worst, float(np.linalg.norm(g)))
    return {"records": 2 * records, "largest_norm": worst, "clip": rule.clip,
            "ratio": worst / rule.clip, "ok": worst <= rule.clip * (1 + 1e-9)}


# --- deliberately weakened copies (the self-test) ------------------------------------------

@dataclasses.dataclass(frozen=True)
class _ScaledNoise(GradientRule):
    """Noise × `scale`; the accounting (sigmas) stays the claimed one."""

    scale: float = 1.0

    def noise_std(self) -> np.ndarray:
        return super().noise_std() * self.scale


@dataclasses.dataclass(frozen=True)
class _NoClipping(GradientRule):
    """Per-example gradients summed unclipped; noise still σ·C."""

    def clipped_sum(self, model, W, X, y, mask, **aux):
        return model.grad_sum(W, X, y, mask)

    def clipped_norm(self, norm):
        return np.asarray(norm, dtype=float)


@dataclasses.dataclass(frozen=True)
class _ReplayedNoise(GradientRule):
    """Every step re-adds the noise its silo drew at its first step (a generator that is
    never advanced)."""

    first: dict = dataclasses.field(default_factory=dict, compare=False)

    def __call__(self, model, W, X, y, mask, expected_batch, silos, rng,
                 standard_normal=None, noise=None, **aux):
        ids = np.atleast_1d(np.asarray(silos))
        if noise is None:
            noise = np.asarray(rng.normal(W.shape)) * self.noise_std()[ids][:, None]
        noise = np.stack([self.first.setdefault(int(k), np.array(noise[j]))
                          for j, k in enumerate(ids)])
        return super().__call__(model, W, X, y, mask, expected_batch, silos, rng,
                                noise=noise, **aux)


@dataclasses.dataclass(frozen=True)
class _SharedNoise(GradientRule):
    """Every silo of a step draws the same standard normals (one stream shared), each at
    its own σ_k·C: a server can subtract two silos' updates and cancel the noise."""

    def __call__(self, model, W, X, y, mask, expected_batch, silos, rng,
                 standard_normal=None, noise=None, **aux):
        ids = np.atleast_1d(np.asarray(silos))
        std = self.noise_std()[ids]
        z = (np.asarray(rng.normal(W.shape[1:])) if noise is None else noise[0] / std[0])
        return super().__call__(model, W, X, y, mask, expected_batch, silos, rng,
                                noise=z[None, :] * std[:, None], **aux)


@dataclasses.dataclass(frozen=True)
class _LooseModelClip(GradientRule):
    """The records' clipping in the model's code at 4·C (the canaries', from the rule's
    formula, still at C): the fault the canaries cannot see and `clipping_check` can."""

    def clipped_sum(self, model, W, X, y, mask, **aux):
        return model.clipped_grad_sum(W, X, y, mask, 4 * self.clip, **aux)


#: the self-test's weakenings: name → (what it does, rule → weakened rule, noise scale the
#: accountant can evaluate it at — None: no finite ε holds)
WEAKENINGS: dict[str, tuple[str, Any, float | None]] = {
    "noise x1/2": ("DP-SGD noise halved", lambda r: _ScaledNoise(
        r.clip, r.noise_multiplier, scale=0.5), 0.5),
    "noise x1/4": ("DP-SGD noise quartered", lambda r: _ScaledNoise(
        r.clip, r.noise_multiplier, scale=0.25), 0.25),
    "clipping off": ("per-example gradients not clipped (noise still σ·C)",
                     lambda r: _NoClipping(r.clip, r.noise_multiplier), None),
    "replayed noise": ("every step re-adds its silo's first noise draw",
                       lambda r: _ReplayedNoise(r.clip, r.noise_multiplier), None),
    "shared noise": ("every silo draws the same noise (one stream for all)",
                     lambda r: _SharedNoise(r.clip, r.noise_multiplier), None),
    "model clips at 4C": ("the records' per-example clipping at 4·C in the model's code",
                          lambda r: _LooseModelClip(r.clip, r.noise_multiplier), 0.25),
}
