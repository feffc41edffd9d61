"""Private tuning inside training (thesis appendix E.3): each silo tries a random number
h_k of settings and releases only the best one.

    alg = TunedPersonalization(grid, dist, validation, pivot_lam=0.1)   # MR-MTL, λ tuned
    simulate(fed, model, alg, cfg)                                      # as any method

Per silo k (all silos in one process here, each with its own draws):
1. before its first trial it is charged, in its ledger, `select_event`: Papernot & Steinke's
   RepeatAndSelect of one trial (DP-SGD for the whole run + a Gaussian validation score);
2. it draws h_k ~ D (TNB(η, γ) or Poisson(μ)) from its own randomness, independently of all
   other silos, and h_k settings (λ, lr) uniformly from the grid. h_k never leaves the silo:
   knowing h would void the random-stopping analysis;
3. every round it trains a *pivot* model and sends only the pivot's update, so the server
   step is unchanged: MR-MTL with a public λ̄ (`pivot = "mrmtl"`), or Ditto's global model
   (`pivot = "ditto"`, FedAvg steps; trials then pull towards the broadcast global model);
   it also takes one local pass on each of its h_k trial models, regularized towards the
   server's model with the trial's λ — these passes are paid by the charge of step 1 and
   kept apart in per-trial sub-ledgers that allow exactly one trial's steps each;
4. after the last round it scores each trial on its own validation rows (clipped loss or
   error rate, sensitivity 1/(m_k − 1) as in `training.selection`; graph data: a
   node-level score, `pandemic.tuning.NodeValidation`) plus Gaussian noise, and
   releases the trial with the best noisy score as its personal model. h_k = 0 (Poisson)
   releases the pivot, which was released already.

Noise: one σ_k per silo (the planner calibrates it so that pivot + RepeatAndSelect meets
the silo's target). The score's noise multiplier is a public function of the run,
σ_s = score_ratio · σ_k / (q_k √T) (T: a trial's steps): σ_k/(q_k√T) is, to first order in
q, the noise of one Gaussian release with the RDP of the trial's T steps, so the default
ratio 2 gives the score about a fifth of a trial's RDP.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import dp_accounting as dpa
import numpy as np

from silofl.algorithms.base import (
    Algorithm,
    ServerState,
    SiloState,
    apply_mean_update,
    check_nonnegative,
)
from silofl.errors import ConfigError
from silofl.privacy import events
from silofl.privacy import selection as TA
from silofl.privacy.ledger import Ledger
from silofl.privacy.node_tuning import is_node_event, node_score_sigma
from silofl.training import selection
from silofl.training.trainer import LocalTrainer
from silofl.tuning.distributions import TrialDistribution

PIVOTS = ("mrmtl", "ditto")


class Validation(Protocol):
    """A silo's validation score as a plug-in of the one tuning path, for units whose
    score is not rows (X, y) scored by `training.selection` — e.g. graph data's node-level
    score (`pandemic.tuning.NodeValidation`)."""

    @property
    def size(self) -> int:
        """The examples (or persons) scored: public, a function of the silo's size."""

    def scores(self, model, candidates: np.ndarray) -> np.ndarray:
        """(G,) raw scores (lower is better) of the candidates (G, P); reads private data."""

    def sensitivity(self, model=None) -> float:
        """The score's sensitivity under the unit's neighbouring relation."""


#: "random": random h, best by a Gaussian-noised score (RepeatAndSelect); "em": every grid
#: setting once, the best chosen by the exponential mechanism (composition + ε²/8-zCDP)
SELECTS = ("random", "em")


def score_sigma(round_event, rounds: int, ratio: float) -> float:
    """Noise multiplier of the validation-score release (see the module docstring; node
    level: `privacy.node_tuning.node_score_sigma`)."""
    if is_node_event(round_event):
        return node_score_sigma(round_event, rounds, ratio)
    sigma = TA.noise_of(round_event)
    counts = events.flatten(round_event)
    (base, steps), = counts.items()
    q = float(base.sampling_probability)
    return float(ratio) * sigma / (q * math.sqrt(steps * rounds))


@dataclass
class TunedSiloState(SiloState):
    """params (K, P): each silo's *released* model (the pivot until the release). The rest
    stays in the silos: pivot (K, P); trials (T, P), T = Σ h_k, owned by silo `owner[t]`
    with setting lam[t], lr[t]; h (K,) the number of trials per silo; chosen (K,) the
    released trial (−1: the pivot)."""

    pivot: np.ndarray | None = None
    trials: np.ndarray | None = None
    owner: np.ndarray | None = None
    lam: np.ndarray | None = None
    lr: np.ndarray | None = None
    h: np.ndarray | None = None
    chosen: np.ndarray | None = None


class TunedPersonalization(Algorithm):
    """MR-MTL (or Ditto) with λ (and lr) tuned privately per silo. `lams`, `lrs`: the grid
    (lrs None: the run's lr); `dist`: the distribution of h; `validation`: one (X, y) per
    silo, rows disjoint from its training rows, or one `Validation` per silo (the unit's own
    score); `pivot_lam` λ̄ (public)."""

    name = "mrmtl_tuned"

    def __init__(self, lams: list[float], dist: TrialDistribution,
                 validation: list[tuple[np.ndarray, np.ndarray]] | list[Validation], *,
                 lrs: list[float] | None = None, pivot: str = "mrmtl",
                 pivot_lam: float = 0.1, score_ratio: float = 2.0,
                 loss_bound: float = selection.DEFAULT_LOSS_BOUND, weighted: bool = True,
                 select: str = "random", em_fraction: float = 0.05):
        if not lams:
            raise ConfigError("tuning lam grid is empty; list the λ values to try, e.g. "
                              "lam = [0.01, 0.1, 1]")
        self.lams = [check_nonnegative("tuning lam", v) for v in lams]
        if lrs is not None and not lrs:
            raise ConfigError("tuning lr grid is empty; list learning rates or leave it out "
                              "(then the run's lr is used)")
        self.lrs = None if lrs is None else [float(v) for v in lrs]
        if self.lrs and not all(math.isfinite(v) and v > 0 for v in self.lrs):
            raise ConfigError(f"tuning lr values must be positive, got {self.lrs}")
        if pivot not in PIVOTS:
            raise ConfigError(f"tuning pivot must be one of {', '.join(PIVOTS)}, got {pivot!r}")
        self.pivot = pivot
        self.name = "mrmtl_tuned" if pivot == "mrmtl" else "ditto_tuned"
        self.passes_per_round = 1
        self.pivot_lam = check_nonnegative("tuning pivot_lam (the public λ̄)", pivot_lam)
        if not (math.isfinite(score_ratio) and score_ratio > 0):
            raise ConfigError(f"tuning score_ratio must be positive, got {score_ratio}")
        self.score_ratio = float(score_ratio)
        if select not in SELECTS:
            raise ConfigError(f"tuning.select must be one of {', '.join(SELECTS)}, got "
                              f"{select!r}")
        self.select = select
        if select == "random":
            TA.check_accountable(dist)
        elif not 0 < em_fraction < 1:
            raise ConfigError(f"tuning.em_fraction (the share of each silo's ε spent on the "
                              f"exponential-mechanism choice) must be in (0, 1), got "
                              f"{em_fraction}")
        self.em_fraction = float(em_fraction)
        self.dist = dist
        self.validation = validation
        self.loss_bound = float(loss_bound)
        self.weighted = bool(weighted)
        self._rounds: int | None = None
        self._subs: dict = {}
        self.last_release: list[dict] | None = None

    # -- privacy ---------------------------------------------------------------------------
    def privacy_events(self, round_event, rounds, target=None):
        if self.select == "em":
            return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(round_event, rounds),
                                        self._em_charge(round_event, rounds, target)])
        return TA.tuned_event(round_event, rounds, self.dist,
                              score_sigma(round_event, rounds, self.score_ratio))

    def grid_size(self) -> int:
        return len(self.lams) * len(self.lrs or [None])

    def _em_charge(self, round_event, rounds, target):
        """All grid settings trained once, then one ε_sel-exponential-mechanism choice
        (ε_sel = em_fraction · the silo's ε), charged before the first trial."""
        if target is None:
            raise ConfigError("tuning.select = 'em' needs each silo's privacy target")
        return dpa.ComposedDpEvent([
            dpa.SelfComposedDpEvent(round_event, rounds * self.grid_size()),
            selection.selection_event(self.em_fraction * target.epsilon)])

    def check_plan(self, num_silos, rounds, accountant):
        if len(self.validation) != num_silos:
            raise ConfigError(f"private tuning needs one validation set per silo "
                              f"({num_silos}), got {len(self.validation)}")
        small = [k for k, v in enumerate(self.validation) if _size(v) < 2]
        if small:
            raise ConfigError(f"private tuning scores trials on each silo's validation rows; "
                              f"silo(s) {small} have fewer than 2. Raise the validation "
                              "fraction or merge small silos")

    # -- the silo and server steps -----------------------------------------------------
    def init(self, params0, num_silos, rounds=None):
        if rounds is None:
            raise ConfigError("private tuning releases after the last round and needs it: "
                              "call init(params0, num_silos, rounds=...)")
        self._rounds, self._subs = int(rounds), {}
        P = np.tile(params0, (num_silos, 1))
        return TunedSiloState(P.copy(), pivot=P.copy()), ServerState(params0.copy())

    def silo_step(self, silos: TunedSiloState, message, trainer, round):
        K = silos.params.shape[0]
        if silos.h is None:
            silos = self._start(silos, trainer, message, round)
        anchor = np.tile(message, (K, 1))
        if self.pivot == "mrmtl":
            new_pivot = trainer.run(silos.pivot, anchor=anchor, lam=self.pivot_lam,
                                    round=round, label="dpsgd-pivot")
            update = new_pivot - silos.pivot
        else:  # Ditto: FedAvg steps from the broadcast global model
            new_pivot = trainer.run(anchor, round=round, label="dpsgd-pivot")
            update = new_pivot - anchor
        trials = silos.trials.copy()
        for sub, rows in self._sub_trainers(silos, trainer):
            trials[rows] = sub.run(trials[rows], anchor=anchor[silos.owner[rows]],
                                   lam=silos.lam[rows], round=round, label="trial")
        out = TunedSiloState(new_pivot.copy(), pivot=new_pivot, trials=trials,
                             owner=silos.owner, lam=silos.lam, lr=silos.lr, h=silos.h)
        if round >= self._rounds:
            out = self._release(out, trainer, round)
        return out, update

    def server_step(self, server, update, weights):
        return apply_mean_update(server, update, weights)

    def describe(self):
        return {"name": self.name, "tuned": "lam" + ("+lr" if self.lrs else ""),
                "select": self.select,
                **({"em_fraction": self.em_fraction} if self.select == "em" else {}),
                "lam_grid": self.lams, "lr_grid": self.lrs, "pivot": self.pivot,
                "pivot_lam": self.pivot_lam, "score_ratio": self.score_ratio,
                "weighted": self.weighted,
                **(self.dist.describe() if self.select == "random" else
                   {"grid_size": self.grid_size()}),
                # after the run: each silo's released setting (part of the tuned output)
                **({"released": self.last_release} if self.last_release else {})}

    # -- inside each silo ------------------------------------------------------------------
    def _start(self, silos, trainer, message, round):
        """Charge RepeatAndSelect, then draw h_k and the settings (silo-side randomness)."""
        K = silos.params.shape[0]
        if trainer.rule.private:
            evs = [self._select_event(trainer, k) if self.select == "random" else
                   self._em_charge(trainer.round_events()[k], self._rounds, trainer.ledgers[k].target)
                   for k in range(K)]
            for led, ev in zip(trainer.ledgers, evs):  # all silos can pay, or none is charged
                led.check(ev, round=round, label="tuning")
            for led, ev in zip(trainer.ledgers, evs):
                led.charge(ev, round=round, label="tuning")
        return self._draw(silos, trainer)

    def _draw(self, silos, trainer) -> TunedSiloState:
        """h_k and the h_k settings of every silo, from its own randomness (em: the whole
        grid); nothing is read or charged here."""
        K = silos.params.shape[0]
        G, L = len(self.lams), len(self.lrs or [trainer.lr])
        if self.select == "em":  # the whole grid, once, in every silo
            h = np.full(K, G * L)
            owner = np.repeat(np.arange(K), h)
            li, ri = np.tile(np.repeat(np.arange(G), L), K), np.tile(np.arange(L), G * K)
        else:
            h = self.dist.draw(trainer.rng, K)
            owner = np.repeat(np.arange(K), h)
            u = np.asarray(trainer.rng.uniform((len(owner), 2)), dtype=float)
            li = np.minimum((u[:, 0] * G).astype(int), G - 1)
            ri = np.minimum((u[:, 1] * L).astype(int), L - 1)
        lrs = np.asarray(self.lrs or [trainer.lr], dtype=float)
        return TunedSiloState(silos.params, pivot=silos.pivot,
                              trials=silos.pivot[owner].copy(), owner=owner,
                              lam=np.asarray(self.lams, float)[li], lr=lrs[ri], h=h)

    def _select_event(self, trainer, k):
        rev = trainer.round_events()[k]
        return TA.select_event(rev, self._rounds, self.dist,
                               score_sigma(rev, self._rounds, self.score_ratio))

    def _sub_trainers(self, silos, trainer):
        """One LocalTrainer per learning rate, hosting that lr's trials as pseudo-silos (a
        copy of the owner's rows each), with prepaid sub-ledgers: each allows exactly one
        trial (its rounds of steps and one score release), nothing more."""
        key = (id(trainer), id(silos.owner))
        hit = self._subs.get(key)
        if hit is not None:
            return hit
        out = []
        for lr in np.unique(silos.lr):
            rows = np.nonzero(silos.lr == lr)[0]
            if not rows.size:
                continue
            own = silos.owner[rows]
            d = trainer.data
            data = d.take(own) if hasattr(d, "take") else TrialSource(d, own)
            ledgers, rule = None, trainer.rule
            if trainer.rule.private:
                rule = trainer.rule.subset(own)
                ledgers = []
                for _t, k in zip(rows, own):
                    parent = trainer.ledgers[k]
                    trial = self._select_event(trainer, k).event if self.select == "random" \
                        else dpa.SelfComposedDpEvent(trainer.round_events()[k], self._rounds)
                    ledgers.append(Ledger(f"{parent.silo}#trial", parent.target,
                                          parent.accountant,
                                          allowance=Counter(events.flatten(trial))))
            sub = LocalTrainer(model=trainer.model, data=data, rule=rule,
                               batch_size=trainer.batch_size,
                               steps_per_round=trainer.steps_per_round[own], lr=float(lr),
                               l2=trainer.l2, rng=trainer.rng, ledgers=ledgers,
                               **_node_kwargs(trainer, own, rows))
            out.append((sub, rows))
        self._subs = {key: out}
        return out

    def _release(self, silos, trainer, round):
        """Score every trial on its silo's validation rows (noisy), release the best."""
        K = silos.params.shape[0]
        subs = {int(t): (sub, j) for sub, rows in self._sub_trainers(silos, trainer)
                for j, t in enumerate(rows)}
        params, chosen = silos.pivot.copy(), np.full(K, -1)
        for k in range(K):
            mine = np.nonzero(silos.owner == k)[0]
            if not mine.size:
                continue  # h_k = 0: the pivot (already released) stays the model
            if trainer.rule.private and self.select == "random":
                sig = score_sigma(trainer.round_events()[k], self._rounds, self.score_ratio)
                for t in mine:  # each trial's sub-ledger pays its score before it is read
                    sub, j = subs[int(t)]
                    sub.ledgers[j].charge(TA.trial_event(trainer.round_events()[k],
                                                         self._rounds, sig).events[1],
                                          round=round, label="score")
            s, sens = self._scores(trainer.model, k, silos.trials[mine])
            if trainer.rule.private and self.select == "em":  # paid in `_start`
                eps = self.em_fraction * trainer.ledgers[k].target.epsilon
                best = mine[selection.noisy_argmin(s, eps, sens, trainer.rng)]
            else:
                if trainer.rule.private:
                    s = s + sig * sens * np.asarray(trainer.rng.normal(len(mine)), dtype=float)
                best = mine[int(np.argmin(s))]
            params[k], chosen[k] = silos.trials[best], best
        out = TunedSiloState(params, pivot=silos.pivot, trials=silos.trials,
                             owner=silos.owner, lam=silos.lam, lr=silos.lr, h=silos.h,
                             chosen=chosen)
        self.last_release = released_settings(out)  # what left the silos (not h_k)
        return out

    def _scores(self, model, k: int, candidates: np.ndarray) -> tuple[np.ndarray, float]:
        """(raw scores (G,), sensitivity) of silo k's candidates on its validation set:
        rows (X, y) scored by `training.selection`, or an object with ``scores`` and
        ``sensitivity`` (graph data: `pandemic.tuning.NodeValidation`, node-level Δ)."""
        v = self.validation[k]
        if hasattr(v, "scores"):
            return v.scores(model, candidates), v.sensitivity(model)
        X, y = v
        return (selection.scores(model, candidates, X, y, self.loss_bound),
                selection.sensitivity(model, len(y), self.loss_bound))


def _size(validation) -> int:
    """Rows (or persons) a validation set scores over."""
    return validation.size if hasattr(validation, "scores") else len(validation[1])


class TrialSource:
    """A trainer data source whose silo t is silo ``owner[t]`` of ``source`` (the trials
    of a graph region read the region's examples; `SiloArrays` are copied instead)."""

    def __init__(self, source, owner: np.ndarray):
        self.source, self.owner = source, np.asarray(owner)
        self.n = source.n[self.owner]

    def start_round(self, round: int) -> None:
        start = getattr(self.source, "start_round", None)
        if start is not None:
            start(round)

    def gather(self, silos: np.ndarray, idx: np.ndarray):
        return self.source.gather(self.owner[np.asarray(silos)], idx)


def _node_kwargs(trainer, own: np.ndarray, rows: np.ndarray) -> dict:
    """A trial sub-trainer's privacy unit: the parent's (node level: one name per trial,
    so seeded trials draw their own batches and noise, not their region's)."""
    if trainer.node is None:
        return {}
    from dataclasses import replace
    names = tuple(f"{trainer.node.names[k]}#trial{t}" for k, t in zip(own, rows))
    return {"node": replace(trainer.node, names=names), "label": trainer.label}


def released_settings(silos: TunedSiloState) -> list[dict]:
    """Per silo, the setting of the released model (part of the RepeatAndSelect output:
    the best trial and its hyperparameters). h_k is NOT included: it must stay secret."""
    out = []
    for t in (silos.chosen if silos.chosen is not None else []):
        out.append({"lam": None, "lr": None, "pivot": True} if t < 0 else
                   {"lam": float(silos.lam[t]), "lr": float(silos.lr[t]), "pivot": False})
    return out
