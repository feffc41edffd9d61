"""Private tuning on a subsample, then one full run (Koskela & Kulkarni 2023, adapted to
MR-MTL under silo-specific DP): `[tuning] select = "subsample"`.

Per silo k, at the first round (before the silos' first full pass):
1. it is charged, in its ledger, RepeatAndSelect of one *subsample trial* — `rounds`
   local passes whose Poisson rate is γ·q_k instead of q_k (same σ_k, same steps), plus
   a Gaussian validation score (`privacy.selection.subsample_tuned_event`);
2. it draws h_k ~ D and h_k settings, as `TunedPersonalization` does (h_k stays inside);
3. tuning phase, `rounds` rounds inside this first step: a pivot MR-MTL model with the
   public λ̄ trains at rate γ·q_k (each pass charged to the silo's ledger as it runs) and
   is averaged by the server rule; the h_k trials train at rate γ·q_k towards that
   average, in prepaid sub-ledgers; the silo scores them (noisy) and keeps the best
   setting (λ_k, lr_k) and its trial model — the RepeatAndSelect output;
4. final phase, the run's own `rounds` rounds: MR-MTL at the full rate q_k with the
   silo's own λ_k (and lr_k), from the run's initial model, every pass charged.

Cost = pivot(γq) + RepeatAndSelect(trial(γq) + score) + one full run; for small q the
subsampled Gaussian's RDP falls about as γ², so the selection costs a fraction of a run
(ratios in docs/guides/tuning.md). The score's noise multiplier is the full-rate formula
of `private.score_sigma` (the trials are cheaper; the score need not be noisier).
In-process (simulator, example level, joint hosting) only.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import numpy as np

from silofl.algorithms.base import ServerState, check_fraction, weighted_mean
from silofl.errors import ConfigError
from silofl.privacy import events
from silofl.privacy import selection as TA
from silofl.privacy.ledger import Ledger
from silofl.training.trainer import LocalTrainer
from silofl.tuning.private import TunedPersonalization, TunedSiloState, score_sigma


@dataclass
class SubsampleSiloState(TunedSiloState):
    """`TunedSiloState` plus each silo's chosen setting for the final phase: lam_k (K,),
    lr_k (K,); `params` are the personal models (the released ones after the run)."""

    lam_k: np.ndarray | None = None
    lr_k: np.ndarray | None = None


def thinned(trainer: LocalTrainer, fraction: float, **overrides) -> LocalTrainer:
    """A trainer like `trainer` (or with `overrides`) whose Poisson rate is γ·q_k.

    Parameters
    ----------
    trainer : LocalTrainer
        Example-level trainer (its q_k = min(1, b/n_k)).
    fraction : float
        γ in (0, 1].
    **overrides
        LocalTrainer fields to replace (data, rule, steps_per_round, lr, ledgers).

    Returns
    -------
    LocalTrainer
        Rate γ·q_k, expected batch γ·q_k·n_k; its round events (what its ledgers are
        charged) are built from that rate.
    """
    kw = dict(model=trainer.model, data=trainer.data, rule=trainer.rule,
              batch_size=trainer.batch_size, steps_per_round=trainer.steps_per_round,
              lr=trainer.lr, l2=trainer.l2, rng=trainer.rng, ledgers=trainer.ledgers)
    kw.update(overrides)
    out = LocalTrainer(**kw)
    out.q = float(fraction) * np.minimum(1.0, out.batch_size / out.data.n)
    out.expected_batch = out.q * out.data.n
    out._events = {}
    return out


class SubsampleTuned(TunedPersonalization):
    """MR-MTL with (λ, lr) tuned per silo on a γ-subsample, then trained once in full.
    Arguments as `TunedPersonalization` (select is "subsample"), plus `fraction` γ."""

    def __init__(self, lams, dist, validation, *, fraction: float = 0.1, **kw):
        kw.pop("select", None)
        super().__init__(lams, dist, validation, select="random", **kw)
        if self.pivot != "mrmtl":
            raise ConfigError("tuning select = 'subsample' trains the chosen setting with "
                              "MR-MTL; set tuning.method = 'mrmtl'")
        self.select = "subsample"
        self.fraction = check_fraction("tuning.subsample_fraction", fraction,
                                       low_open=True, high_open=False)

    def privacy_events(self, round_event, rounds, target=None):
        return TA.subsample_tuned_event(round_event, rounds, self.dist,
                                        score_sigma(round_event, rounds, self.score_ratio),
                                        self.fraction)

    def describe(self):
        return {**super().describe(), "select": "subsample",
                "subsample_fraction": self.fraction}

    def init(self, params0, num_silos, rounds=None):
        silos, server = super().init(params0, num_silos, rounds)
        return SubsampleSiloState(silos.params, pivot=silos.pivot), server

    # -- the silo step -----------------------------------------------------------------
    def silo_step(self, silos, message, trainer, round):
        if trainer.node is not None:
            raise ConfigError("tuning select = 'subsample' runs at example level only")
        K = silos.params.shape[0]
        if silos.lam_k is None:
            silos = self._tune(silos, trainer, message, round)
            # the final run starts afresh from the server's model (the trials, trained on
            # γ of the rows per step, are far noisier than a full-rate start)
            silos = dataclasses.replace(silos, params=np.tile(message, (K, 1)))
        anchor, old = message, silos.params
        new = silos.params.copy()
        for lr in np.unique(silos.lr_k):  # one pass per silo, at its own lr
            mask = silos.lr_k == lr
            saved, trainer.lr = trainer.lr, float(lr)
            try:
                out = trainer.run(silos.params, anchor=np.tile(anchor, (K, 1)),
                                  lam=silos.lam_k, round=round, silos=mask)
            finally:
                trainer.lr = saved
            new[mask] = out[mask]
        update = new - old
        return SubsampleSiloState(new, pivot=silos.pivot, trials=silos.trials,
                                  owner=silos.owner, lam=silos.lam, lr=silos.lr, h=silos.h,
                                  chosen=silos.chosen, lam_k=silos.lam_k,
                                  lr_k=silos.lr_k), update

    def server_step(self, server, update, weights):
        return ServerState(server.params + weighted_mean(update, weights))

    # -- the tuning phase ---------------------------------------------------------------
    def _tune(self, silos, trainer, message, round):
        """Charge, draw, run the tuning phase at rate γ·q, release each silo's best."""
        K, T = silos.params.shape[0], int(self._rounds)
        if trainer.rule.private:
            evs = [self._select_event(trainer, k) for k in range(K)]
            for led, ev in zip(trainer.ledgers, evs):  # all silos can pay, or none is
                led.check(ev, round=round, label="tuning")
            for led, ev in zip(trainer.ledgers, evs):
                led.charge(ev, round=round, label="tuning")
        st = self._draw(silos, trainer)
        piv = thinned(trainer, self.fraction)
        w = trainer.data.n.astype(float) if self.weighted else np.ones(K)
        pivot, server = np.tile(message, (K, 1)), np.asarray(message, float).copy()
        trials, subs = st.trials.copy(), self._trial_trainers(st, trainer)
        for _ in range(T):
            anchor = np.tile(server, (K, 1))
            new = piv.run(pivot, anchor=anchor, lam=self.pivot_lam, round=round,
                          label="tuning-pivot")
            server = server + weighted_mean(new - pivot, w)  # the server rule, released
            pivot = new
            for sub, rows in subs:
                trials[rows] = sub.run(trials[rows], anchor=anchor[st.owner[rows]],
                                       lam=st.lam[rows], round=round, label="trial")
        self._subs = {(id(trainer), id(st.owner)): subs}
        done = TunedSiloState(pivot, pivot=pivot, trials=trials, owner=st.owner, lam=st.lam,
                              lr=st.lr, h=st.h)
        self.select = "random"  # the parent's release: noisy scores, charged per trial
        try:
            rel = self._release(done, trainer, round)
        finally:
            self.select = "subsample"
        chosen = rel.chosen
        lam_k = np.where(chosen >= 0, rel.lam[np.maximum(chosen, 0)] if len(rel.lam) else 0,
                         self.pivot_lam)
        lr_k = np.where(chosen >= 0, rel.lr[np.maximum(chosen, 0)] if len(rel.lr) else 0,
                        trainer.lr)
        return SubsampleSiloState(rel.params, pivot=pivot, trials=trials, owner=st.owner,
                                  lam=st.lam, lr=st.lr, h=st.h, chosen=chosen,
                                  lam_k=np.asarray(lam_k, float), lr_k=np.asarray(lr_k, float))

    def _select_event(self, trainer, k):
        rev = trainer.round_events()[k]
        return TA.select_event(TA.subsample_event(rev, self.fraction), self._rounds,
                               self.dist, score_sigma(rev, self._rounds, self.score_ratio))

    def _trial_trainers(self, st: TunedSiloState, trainer: LocalTrainer) -> list:
        """Per lr, a thinned trainer hosting that lr's trials (a copy of the owner's rows
        each), with prepaid sub-ledgers allowing exactly one subsample trial each."""
        out = []
        d = trainer.data
        if not hasattr(d, "take"):
            raise ConfigError("tuning select = 'subsample' needs in-memory silo rows")
        for lr in np.unique(st.lr):
            rows = np.nonzero(st.lr == lr)[0]
            own = st.owner[rows]
            data = d.take(own)
            ledgers, rule = None, trainer.rule
            if trainer.rule.private:
                rule = trainer.rule.subset(own)
                ledgers = [Ledger(f"{trainer.ledgers[k].silo}#trial", trainer.ledgers[k].target,
                                  trainer.ledgers[k].accountant,
                                  allowance=Counter(events.flatten(
                                      self._select_event(trainer, k).event)))
                           for k in own]
            out.append((thinned(trainer, self.fraction, data=data, rule=rule,
                                steps_per_round=trainer.steps_per_round[own], lr=float(lr),
                                ledgers=ledgers), rows))
        return out
