"""ULDP-FL weighting (Kato et al., VLDB 2024, ULDP-SGD): person-level DP across silos.

A person may be treated at several silos. Each round, at the broadcast model w, every silo
k releases ONE share u_k = Σ_p w_{p,k}·ḡ_{p,k} + N(0, σ²C²/K) (ḡ_{p,k}: the average of the
person's clipped row gradients in silo k, norm ≤ C; `training.uldp`), the shares are summed
by SecAgg+ (the sum is the only release), and the server steps

    w ← w − lr · (Σ_k u_k / Z + l2·w),

Z a public normaliser. Since Σ_k w_{p,k} ≤ 1 for every person, removing all of a person's
rows in every silo moves Σ_k u_k by ≤ C: the aggregate is a Gaussian mechanism with
sensitivity C and noise σC per round, for a person in any number of silos
(`privacy.uldp`). One gradient step per round (FedSGD): several local steps would make a
person's contribution depend on the trajectory and break that bound.

Weights ("weighting"):
* "uniform": w_{p,k} = 1/M, M = `persons_in_silos` (the declared most silos one person is
  in; 0 = every silo, K). Data-independent; Z = Σ_k n_k / M (the exact total weight).
* "linked": record proportions w_{p,k} = n_{k,p} / Σ_j n_{j,p} from persons linked across
  silos (keyed pseudonyms; `person_weights`, one (n_persons_k,) array per silo in sorted
  person-id order). In the simulator, without given weights, equal person ids in different
  silos are the same person and the weights are derived from them. Z = Σ_k n_k (the
  person-silo pairs: public, an upper bound on the distinct persons, whose exact number is
  data-dependent and never released).
The numbers of persons per silo n_k are treated as public (as at person level).

Sampling (`sample_rate` q, default 1: every person every round): with q < 1 each person
takes part in a round in every silo or in none (`training.uldp.consortium_sample`, keyed
by a consortium secret drawn at the first round from the trainer's stream: OS entropy in
secure mode), and the server divides by the expected total weight q·Z.

SecAgg+: the simulator models SecAgg+ as an exact sum of the shares (hosting must be joint:
one trainer for all silos). Over the network (`share_step`, `sum_update`) the method runs
only with SecAgg+ (Flower's SuperLink route, `[server] secagg = true`): each silo sends its
share u_k, masked; the server unmasks only Σ_k u_k and steps. There, weighting is "uniform"
and q = 1 only: linked weights need every silo's weights of a person to sum to ≤ 1, which a
silo cannot check from its own rows (a linkage protocol over keyed pseudonyms would), and
the sampling PRF needs a consortium secret the server does not hold.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import dp_accounting as dpa
import numpy as np

from silofl.algorithms.base import Algorithm, ServerState, SiloState
from silofl.errors import ConfigError
from silofl.privacy import uldp as accounting
from silofl.privacy.overlap import record_weights
from silofl.training.uldp import consortium_sample, silo_release

if TYPE_CHECKING:
    from silofl.data.federation import Federation
    from silofl.models.base import Model
    from silofl.training.trainer import LocalTrainer

WEIGHTINGS = ("uniform", "linked")
#: slack on Σ_k w_{p,k} ≤ 1 for float sums of record proportions
WEIGHT_TOL = 1e-9


def record_proportion_weights(ids: list[np.ndarray]) -> list[np.ndarray]:
    """Linked weights from person ids shared across silos: w_{p,k} = n_{k,p} / Σ_j n_{j,p}.

    Parameters
    ----------
    ids : list of numpy.ndarray
        One (n_k,) array of person ids per silo (equal ids = the same person; keyed
        pseudonyms in a deployment).

    Returns
    -------
    list of numpy.ndarray
        Per silo, (n_persons_k,) weights in sorted person-id order (`PersonIndex`), each
        person's weights summing to one over the silos.
    """
    w = record_weights({str(k): list(np.asarray(a)) for k, a in enumerate(ids)})
    return [np.array([w[str(k)][p] for p in np.unique(np.asarray(a))])
            for k, a in enumerate(ids)]


def person_totals(ids: list[np.ndarray], weights: list[np.ndarray]) -> np.ndarray:
    """Σ_k w_{p,k} for every person of the consortium (equal ids = the same person).

    Parameters
    ----------
    ids : list of numpy.ndarray
        One (n_k,) array of person ids per silo.
    weights : list of numpy.ndarray
        One (n_persons_k,) array per silo in sorted person-id order.

    Returns
    -------
    numpy.ndarray
        Shape (n_distinct,): each person's total weight.
    """
    uniq = [np.unique(np.asarray(a)) for a in ids]
    _, inverse = np.unique(np.concatenate(uniq), return_inverse=True)
    totals = np.zeros(int(inverse.max()) + 1 if len(inverse) else 0)
    np.add.at(totals, inverse, np.concatenate([np.asarray(w, float) for w in weights]))
    return totals


class ULDP(Algorithm[SiloState, ServerState]):
    """ULDP-FL (FedSGD form): each person's contributions across silos weighted to ≤ 1.

    Parameters
    ----------
    weighting : {"uniform", "linked"}, default "uniform"
        w_{p,k} = 1/M, or record proportions over linked persons.
    persons_in_silos : int, default 0
        M, the declared most silos one person is in ("uniform"; 0 = every silo).
    person_weights : list of numpy.ndarray, optional
        "linked": one (n_persons_k,) array per silo, sorted person-id order (from keyed
        pseudonyms, `data.pseudonyms` / `privacy.overlap`); None: derived from the
        federation's person ids in the simulator.
    sample_rate : float, default 1.0
        q in (0, 1]: the consortium-wide Poisson sampling rate of persons per round.
    """

    name = "uldp"
    #: one σ for the whole consortium (`runtime.uldp_plan.plan_consortium`)
    consortium = True
    #: the server sums the shares; the FedAvg weights do not apply
    weighted = False
    #: one gradient step per round (FedSGD): the person-level bound needs it
    fixed_steps_per_pass = 1

    def __init__(self, weighting: str = "uniform", persons_in_silos: int = 0,
                 person_weights: list[np.ndarray] | None = None,
                 sample_rate: float = 1.0) -> None:
        if weighting not in WEIGHTINGS:
            raise ConfigError(f"uldp weighting must be 'uniform' (1/M for a declared M) or "
                              f"'linked' (record proportions over linked persons), got "
                              f"{weighting!r}")
        if isinstance(persons_in_silos, bool) or not isinstance(
                persons_in_silos, (int, np.integer)) or persons_in_silos < 0:
            raise ConfigError(f"[privacy] persons_in_silos (the most silos one person is in; "
                              f"0 = every silo) must be an integer ≥ 0, got "
                              f"{persons_in_silos!r}")
        if person_weights is not None and weighting != "linked":
            raise ConfigError("uldp: person_weights are linked weights; set weighting = "
                              "'linked' or drop them")
        self.weighting, self.declared_m = weighting, int(persons_in_silos)
        self.given = None if person_weights is None else [np.asarray(w, float)
                                                          for w in person_weights]
        self.sample_rate = accounting.check_rate(sample_rate)
        self.weights: list[np.ndarray] | None = None
        self.ids: list[np.ndarray] = []  # each silo's sorted person ids (sampling)
        self._key: bytes | None = None   # the consortium secret of the sampling
        self.num_silos = 0
        self._events: dict[float, dpa.DpEvent] = {}

    # -- binding (before planning: errors spend nothing) ----------------------------------
    @property
    def m(self) -> int:
        """The M of uniform weights (the declared one, or K)."""
        return self.declared_m or self.num_silos

    def bind_silos(self, names: list[str]) -> None:
        self.num_silos = len(names)

    def bind_data(self, fed: Federation, model: Model) -> None:
        """Set each silo's person weights and check Σ_k w_{p,k} ≤ 1 against the person ids
        (in the simulator every silo's ids are at hand; equal ids = the same person)."""
        self.bind_silos(fed.names)
        if not fed.has_persons:
            raise ConfigError("uldp weights persons across silos: set [data] person_column "
                              "(the person of every row) and [privacy] unit = \"person\"")
        ids = [np.asarray(s.person_train) for s in fed.silos]
        self.ids = [np.unique(a) for a in ids]
        n = [s.n_persons for s in fed.silos]
        if self.weighting == "uniform":
            weights = [np.full(nk, 1.0 / self.m) for nk in n]
        elif self.given is None:
            weights = record_proportion_weights(ids)
        else:
            weights = self._check_given(n)
        worst = float(person_totals(ids, weights).max())
        if worst > 1.0 + WEIGHT_TOL:
            what = (f"a person is in more than persons_in_silos = {self.m} silos; declare "
                    "the largest number of silos any person is in" if self.weighting ==
                    "uniform" else "the linked weights are not normalised; give record "
                    "proportions n_{k,p} / Σ_j n_{j,p}")
            raise ConfigError(f"uldp: a person's weights sum to {worst:.6g} > 1 over the "
                              f"silos ({what}); the person-level bound would not hold")
        self.weights = weights

    def _check_given(self, n: list[int]) -> list[np.ndarray]:
        """The given linked weights, checked per silo (shape, values in [0, 1])."""
        given = self.given or []
        if len(given) != len(n):
            raise ConfigError(f"uldp: {len(given)} person-weight arrays for {len(n)} silos")
        for k, (w, nk) in enumerate(zip(given, n)):
            if w.shape != (nk,) or not np.all(np.isfinite(w) & (w >= 0) & (w <= 1)):
                raise ConfigError(f"uldp: silo {k}'s person weights must be {nk} values in "
                                  f"[0, 1] (sorted person-id order), got shape {w.shape}")
        return given

    def check_plan(self, num_silos: int, rounds: int, accountant: str | None) -> None:
        if self.declared_m > num_silos:
            raise ConfigError(f"[privacy] persons_in_silos = {self.declared_m} exceeds the "
                              f"{num_silos} silos; give at most {num_silos} (0 = every silo)")

    # -- the algorithm ------------------------------------------------------------------
    def init(self, params0: np.ndarray, num_silos: int,
             rounds: int | None = None) -> tuple[SiloState, ServerState]:
        self._key = None  # every run samples with a secret of its own (independent runs)
        return super().init(params0, num_silos, rounds)

    def round_event(self, sigma: float) -> dpa.DpEvent:
        """The per-round charge (the same object every round: the ledgers' fast path)."""
        ev = self._events.get(sigma)
        if ev is None:
            ev = self._events[sigma] = accounting.round_event(sigma, self.sample_rate)
        return ev

    def normaliser(self, n_persons: np.ndarray) -> float:
        """q·Z: Z = Σ_k n_k / M (uniform, the total weight) or Σ_k n_k (linked); public."""
        total = float(np.sum(n_persons)) * self.sample_rate
        return total / self.m if self.weighting == "uniform" else total

    def round_weights(self, trainer: LocalTrainer, round: int) -> list[np.ndarray]:
        """Each silo's person weights this round: 0 for persons not sampled (q < 1)."""
        weights = self.weights or []
        if self.sample_rate >= 1.0:
            return weights
        if self._key is None:  # 256 bits from the trainer's stream (secure: OS entropy)
            self._key = np.asarray(trainer.rng.uniform(4), dtype=np.float64).tobytes()[:32]
        return [w * consortium_sample(self._key, ids, round, self.sample_rate)
                for w, ids in zip(weights, self.ids)]

    def silo_step(self, silos: SiloState, message: np.ndarray, trainer: LocalTrainer,
                  round: int) -> tuple[SiloState, np.ndarray]:
        n = np.asarray(trainer.data.n)
        if self.weights is None or len(n) != self.num_silos:
            raise ConfigError("uldp runs with every silo on one trainer (the simulator's "
                              "joint hosting) after bind_data(fed, model) (simulate does it)")
        K = self.num_silos
        W = np.tile(message, (K, 1))
        event, share_std = None, 0.0
        if trainer.rule.private:
            sigmas = np.asarray(trainer.rule.sigmas, dtype=float)
            if not np.all(sigmas == sigmas[0]):
                raise ConfigError("uldp needs one σ for the consortium (plan it with "
                                  "runtime.plan.plan_job)")
            event = self.round_event(float(sigmas[0]))
            share_std = float(sigmas[0]) * float(trainer.rule.clip) / math.sqrt(K)
        shares = silo_release(trainer, W, self.round_weights(trainer, round), event,
                              share_std, round)
        # post-processing by public constants; the server sums the K rows (SecAgg+)
        delta = -trainer.lr * (shares / self.normaliser(n) + trainer.l2 * W / K)
        return replace(silos, params=W), delta

    # -- over the network: one silo's share, the server's step on the SecAgg+ sum -------
    def share_step(self, silos: SiloState, message: np.ndarray, trainer: LocalTrainer,
                   round: int, sigma: float | None) -> tuple[SiloState, np.ndarray]:
        """One networked silo's round: its share u_k for the SecAgg+ sum, charged first.

        Parameters
        ----------
        silos : SiloState
            This silo's one-row state.
        message : numpy.ndarray
            Shape (P,): the broadcast model.
        trainer : LocalTrainer
            This silo's one-silo trainer over its persons (`PersonSource`).
        round : int
            The round (for the ledger).
        sigma : float or None
            The consortium's σ (the largest any silo calibrated; its share's noise is
            σC/√K); None: a non-private job.

        Returns
        -------
        (SiloState, numpy.ndarray)
            The state (the broadcast model) and u_k, shape (1, P): Σ_p (1/M)·ḡ_p +
            N(0, σ²C²/K), whose every coordinate is below `secagg.share_range`'s bound
            outside a 6-std noise tail.
        """
        if self.weighting != "uniform" or self.sample_rate < 1.0:
            raise ConfigError(
                "uldp over the network runs with uniform weights 1/M (declared [privacy] "
                "persons_in_silos) and every person every round: linked weights need a "
                "linkage protocol between the silos and sampling a consortium secret, which "
                "the network does not have; use the simulator for those")
        n = np.asarray(trainer.data.n)
        if len(n) != 1 or self.num_silos < 2:
            raise ConfigError("uldp share_step: one silo's trainer, in a job of ≥ 2 silos")
        W = np.asarray(message, dtype=float).reshape(1, -1)
        event, share_std = None, 0.0
        if sigma is not None:
            event = self.round_event(float(sigma))
            share_std = float(sigma) * float(trainer.rule.clip) / math.sqrt(self.num_silos)
        share = silo_release(trainer, W, [np.full(int(n[0]), 1.0 / self.m)], event,
                             share_std, round)
        return replace(silos, params=W), share

    def sum_update(self, params: np.ndarray, share_sum: np.ndarray, n_persons: np.ndarray,
                   lr: float, l2: float) -> np.ndarray:
        """The server's change from the SecAgg+ sum: −lr·(Σ_k u_k / Z + l2·w).

        Parameters
        ----------
        params : numpy.ndarray
            Shape (P,): the current shared model w.
        share_sum : numpy.ndarray
            Shape (P,): Σ_k u_k, the only release.
        n_persons : numpy.ndarray
            Shape (K,): every silo's number of persons (public; their join replies).
        lr, l2 : float
            The job's step size and L2 penalty.

        Returns
        -------
        numpy.ndarray
            Shape (1, P): the change `server_step` adds.
        """
        z = self.normaliser(np.asarray(n_persons, dtype=float))
        return (-lr * (np.asarray(share_sum, dtype=float) / z + l2 * np.asarray(params)))[None]

    def server_step(self, server: ServerState, update: np.ndarray | None,
                    weights: np.ndarray) -> ServerState:
        if update is None:
            return server
        return ServerState(server.params + np.asarray(update).sum(0))

    def personal_models(self, silos: SiloState, server: ServerState) -> np.ndarray:
        return np.tile(server.params, (silos.params.shape[0], 1))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "weighting": self.weighting,
                "persons_in_silos": self.m if self.weighting == "uniform" else None,
                "local_steps": 1, "person_sampling_rate": self.sample_rate,
                "sampling": ("none (every person, every round)" if self.sample_rate >= 1 else
                             "Poisson over persons, the same in every silo (keyed PRF)"),
                "secagg": "SecAgg+ sum of the shares (the simulator: an exact sum; the "
                          "network: Flower's SecAgg+, quantized)"}


__all__ = ["ULDP", "WEIGHTINGS", "person_totals", "record_proportion_weights"]
