"""Weight Erosion (Algorithm 1 of the seed's section 4.5): one model personalized for a
single user silo u_0, trained by SGD on a weighted mean of all silos' gradients.

Every silo starts with weight α_i = 1. Each round r every silo computes one gradient g_i at
the current global model on a batch of expected size b; the server computes
    d_i = ‖g_i − g_0‖ / ‖g_0‖                      (g_0: the user's gradient)
    Δα_i = (1 + p_s·⌊(r − 1)·b / |S_i|⌋) · p_d · d_i
    α_i ← max(0, α_i − Δα_i)
    w ← w − lr·Σ α_i g_i / Σ α_i.
The user's own distance is 0, so α_0 stays 1 and Σ α_i ≥ 1. p_d (distance penalty) sets how
fast dissimilar silos lose weight; p_s (size penalty) erodes faster once a silo's examples
have been seen ⌊(r − 1)b/|S_i|⌋ times, so small silos are not over-represented. p_d = 0 is
SGD on the plain mean of the silos' gradients. When ‖g_0‖ = 0 the distance is +∞ (the
seed's Example 4) for every silo whose gradient differs from g_0.

Privacy. Each g_i is one DP-SGD gradient under silo i's own target (`LocalTrainer.gradients`:
one Poisson-sampled Gaussian step per round — on graph data one node-level step, b persons
without replacement, `NodeLevelDpEvent(steps=1)` — charged before the data is read); distances,
weights and the update are post-processing. The plan fixes one step per round whatever
`local_epochs` says (with `update = "local_sgd"`: the pass's steps, see below). The server
uses |S_i| (training counts, as weighted FedAvg does).

Robustness. A gradient that is not finite or not of shape (P,) is dropped from the round
(its α unchanged, counted in `aggregation.rejected`); without the user's gradient there is
no reference, so the round leaves w and α as they are. A robust `aggregation` rule replaces
the α-weighted mean by the rule over the silos still holding weight (α_i > 0), unweighted:
erosion decides who takes part, the rule bounds what any one of them can do.

Options (the seed's discussion of Algorithm 1; defaults are Algorithm 1 as printed):

* `update = "local_sgd"` (footnote 16, "local SGD updates, which are used in the same
  way"): each silo runs its local DP-SGD pass from the broadcast model w (`LocalTrainer.run`,
  s_i = `steps_per_pass` steps, from `local_epochs`) and sends the pseudo-gradient
  g_i = (w − w_i^end) / lr, the sum of its pass's step directions. Distances, α and the
  update w ← w − lr·Σ α_i g_i / Σ α_i use g_i exactly as a single gradient would be used, so
  the server moves by the α-weighted mean of the silos' model updates, as FedAvg does (a
  mean direction, (w − w_i^end)/(lr·s_i), would move one lr-step per round and learn s_i
  times slower for the same privacy cost). The plan and the ledgers count s_i DP-SGD steps
  per round (`fixed_steps_per_pass` is None), not one.
* Silos coming and going ("Resilience"): `participation = p` — each round every silo but
  the user takes part independently with probability p; `join_round[i] = r` — silo i takes
  part from round r on; `leave_round[i] = r` — silo i takes part before round r only. The
  schedule is drawn from PUBLIC randomness (a generator keyed by `seed` and the round, never
  by data: see `participation`), so who took part is public. A silo that does not take
  part in a round computes nothing, reads nothing and is charged nothing for it; the job
  reserves the worst case (every round) and settles to what ran. An absent silo keeps its α
  and is left out of ḡ. The user takes part in every round.
* `count = "participated"`: the size penalty's ⌊(r − 1)·b/|S_i|⌋ uses, for r, the number of
  rounds silo i took part in up to and including this one (default "rounds": the round).
* `newcomer = "mean" | "median"`: a silo with a join round r > 1 gets, when it first takes
  part, the mean or median α of "all agents" (the seed) — every silo that holds a weight
  then (joined and not left, absent this round or not, the user included), before that
  round's erosion; default "one" (α = 1, Algorithm 1). Until then its α is NaN (no weight).

The result is the global model w, personalized for u_0: `personal_models` gives it to every
silo, so the other silos' metrics show how u_0's model does on their data.

`alpha_history` holds α (K,) after every server step since the last `init`, one entry per
round (a resumed run holds the rounds after resuming only). α is computed from DP
gradients: post-processing, as the model. `round_log` keeps, per round, what was released
and public on the server: the broadcast model `params` (P,), the released gradients `grads`
(K, P) (rows dropped by screening, and rows of silos not taking part, are NaN), α after
the round, the step size `lr` and `present` (K,) bool, the silos that took part (the
contribution report is computed from these alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dp_accounting as dpa
import numpy as np

from silofl.algorithms.base import (
    Algorithm,
    ServerState,
    SiloState,
    check_fraction,
    check_nonnegative,
)
from silofl.algorithms.robust import Aggregator, screen
from silofl.errors import ConfigError, PrivacyError

if TYPE_CHECKING:
    from silofl.privacy.targets import PrivacyTarget
    from silofl.training.trainer import LocalTrainer

UPDATES = ("gradient", "local_sgd")     # what each silo sends
COUNTS = ("rounds", "participated")     # r in the size penalty
NEWCOMERS = ("one", "mean", "median")   # a late joiner's first α


@dataclass
class ErosionServer(ServerState):
    alpha: np.ndarray  # (K,) the silos' weights α_i after the last round
    last_step: np.ndarray | None = None  # (P,) the previous ḡ (centered clipping's centre)


@dataclass
class ErosionUpdate:
    grads: np.ndarray   # (K, P) each silo's gradient at the broadcast model (NaN: absent)
    epochs: np.ndarray  # (K,) ⌊(r − 1)·b / |S_i|⌋: times each silo's examples were used
    lr: float           # the (public) step size of the global update
    present: np.ndarray | None = None  # (K,) bool: took part this round (None: all)
    round: int = 0                     # the (1-based) round


def check_option(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """`value` if it is one of `choices`, else ConfigError naming the setting `name`."""
    if value not in choices:
        raise ConfigError(f"weight_erosion {name} must be one of "
                          f"{', '.join(map(repr, choices))}, got {value!r}")
    return value


def _check_rounds(name: str, rounds: Any) -> dict[str | int, int]:
    """{silo name or index: round ≥ 1} from the config table `name`; ConfigError otherwise."""
    if rounds is None:
        return {}
    if not isinstance(rounds, dict):
        raise ConfigError(f"weight_erosion {name} must map silo names to rounds, e.g. "
                          f"{{\"silo-03\" = 5}}, got {rounds!r}")
    out: dict[str | int, int] = {}
    for k, r in rounds.items():
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 1:
            raise ConfigError(f"weight_erosion {name}[{k!r}] must be a round number ≥ 1, "
                              f"got {r!r}")
        out[k] = int(r)
    return out


def participation(round: int, num_silos: int, user: int, p: float, join: dict[int, int],
                  leave: dict[int, int], seed: int) -> np.ndarray:
    """(K,) bool: the silos taking part in `round`. Public: a function of the round, the
    settings and the public `seed` only (numpy's generator keyed by (seed, round); no data,
    no secret). The user always takes part; silo i takes part only in rounds
    join[i] ≤ r < leave[i], then (p < 1) with probability p, independently."""
    present = np.ones(num_silos, bool)
    if p < 1:
        present = np.random.default_rng([int(seed), int(round), 0xE05]).random(num_silos) < p
    for k, r in join.items():
        present[k] &= round >= r
    for k, r in leave.items():
        present[k] &= round < r
    present[user] = True
    return present


def relative_distances(grads: np.ndarray, user: int) -> np.ndarray:
    """(K,) d_i = ‖g_i − g_0‖ / ‖g_0‖; +∞ where ‖g_0‖ = 0 and g_i ≠ g_0, 0 where g_i = g_0."""
    diff = np.linalg.norm(grads - grads[user], axis=1)
    norm0 = np.linalg.norm(grads[user])
    if norm0 > 0:
        return diff / norm0
    return np.where(diff > 0, np.inf, 0.0)


def erode(alpha: np.ndarray, grads: np.ndarray, epochs: np.ndarray, user: int,
          p_s: float, p_d: float) -> tuple[np.ndarray, np.ndarray]:
    """One round of Algorithm 1's aggregation: (new α (K,), ḡ (P,))."""
    d = relative_distances(grads, user)
    if p_d == 0:
        step = np.zeros_like(d)  # 0·∞ would be NaN; no distance penalty means no erosion
    else:
        step = (1.0 + p_s * np.asarray(epochs, dtype=float)) * p_d * d
    new = np.maximum(0.0, alpha - step)
    return new, (new[:, None] * grads).sum(0) / new.sum()


class WeightErosion(Algorithm[SiloState, ErosionServer]):
    name = "weight_erosion"
    weighted = False  # ḡ is weighted by α only, not by silo sizes
    fixed_steps_per_pass: int | None = 1  # per instance: None with update = "local_sgd"

    def __init__(self, user: int | str, p_s: float = 0.2, p_d: float = 0.01,  # the seed's
                 aggregation: Aggregator | None = None, *, update: str = "gradient",
                 participation: float = 1.0, join_round: dict | None = None,
                 leave_round: dict | None = None, count: str = "rounds",
                 newcomer: str = "one", seed: int = 0) -> None:
        if isinstance(user, bool) or not isinstance(user, (int, np.integer, str)) \
                or user == "":
            raise ConfigError(f"weight_erosion needs the user silo u_0 (we_user): a silo "
                              f"name or index, got {user!r}")
        if not isinstance(user, str) and user < 0:
            raise ConfigError(f"weight_erosion: user index must be >= 0, got {user}")
        self.user = user if isinstance(user, str) else int(user)
        self.p_s = check_nonnegative("weight_erosion size penalty p_s (we_p_s)", p_s)
        self.p_d = check_nonnegative("weight_erosion distance penalty p_d (we_p_d)", p_d)
        self.user_index: int | None = None if isinstance(self.user, str) else self.user
        self.aggregation = aggregation or Aggregator()
        self.update = check_option("update (we_update)", update, UPDATES)
        self.participation = check_fraction("weight_erosion participation (we_participation)",
                                            participation, low_open=True, high_open=False)
        self.join_round = _check_rounds("join round (we_join_round)", join_round)
        self.leave_round = _check_rounds("leave round (we_leave_round)", leave_round)
        for k, r in self.leave_round.items():
            if k in self.join_round and r <= self.join_round[k]:
                raise ConfigError(f"weight_erosion: silo {k!r} leaves at round {r}, not after "
                                  f"it joins (round {self.join_round[k]}); we_leave_round must "
                                  "be greater than we_join_round")
        self.count = check_option("count (we_count)", count, COUNTS)
        self.newcomer = check_option("newcomer (we_newcomer)", newcomer, NEWCOMERS)
        self.seed = int(seed)
        # one gradient per round, or a local pass of `local_epochs` (the plan reads this)
        self.fixed_steps_per_pass = 1 if self.update == "gradient" else None
        self.alpha_history: list[np.ndarray] = []  # α after each round since `init`
        self.round_log: list[dict] = []  # released, per round (see module docstring)
        self._join: dict[int, int] = {}   # by silo index, once bound
        self._leave: dict[int, int] = {}
        self._present: list[np.ndarray] = []  # the schedule of rounds 1.. (cache)
        self._taken: list[np.ndarray] = []
        self._K = 0

    @property
    def scheduled(self) -> bool:
        """Whether silos may miss rounds (otherwise every silo takes part in every one)."""
        return self.participation < 1 or bool(self.join_round) or bool(self.leave_round)

    def bind_silos(self, names: list[str]) -> None:
        if isinstance(self.user, str):
            if self.user not in names:
                raise ConfigError(f"weight_erosion: user {self.user!r} is not a silo of this "
                                  f"federation; silos are {', '.join(names)}")
            self.user_index = names.index(self.user)
        self._join = self._resolve(self.join_round, "we_join_round", names)
        self._leave = self._resolve(self.leave_round, "we_leave_round", names)

    @staticmethod
    def _resolve(rounds: dict, key: str, names: list[str] | None) -> dict[int, int]:
        out = {}
        for k, r in rounds.items():
            if isinstance(k, str) and names is not None and k in names:
                out[names.index(k)] = r
            elif isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 0 \
                    and (names is None or k < len(names)):
                out[int(k)] = r
            else:
                where = f"; silos are {', '.join(names)}" if names is not None else \
                    " (plan with the federation to resolve silo names)"
                raise ConfigError(f"weight_erosion {key}: {k!r} is not a silo of this "
                                  f"federation{where}")
        return out

    @property
    def user_silo(self) -> int:
        """The user silo's index u_0 (resolved by `bind_silos` when given by name)."""
        if self.user_index is None:
            raise ConfigError(f"weight_erosion: user {self.user!r} is a silo name; plan with "
                              "the federation (plan_silos / simulate) to resolve it")
        return self.user_index

    def check_plan(self, num_silos: int, rounds: int | None,
                   accountant: str | None) -> None:
        if self.user_silo >= num_silos:
            raise ConfigError(f"weight_erosion: user index {self.user_index} is not a silo of "
                              f"this federation of {num_silos} silos (indices 0..{num_silos - 1})")
        if not self._join and not self._leave:  # not bound to names: indices only
            self._join = self._resolve(self.join_round, "we_join_round", None)
            self._leave = self._resolve(self.leave_round, "we_leave_round", None)
        for key, table in (("we_join_round", self._join), ("we_leave_round", self._leave)):
            for k, r in table.items():
                if k >= num_silos:
                    raise ConfigError(f"weight_erosion {key}: index {k} is not a silo of this "
                                      f"federation of {num_silos} silos")
                if k == self.user_index:
                    raise ConfigError(f"weight_erosion {key}: the user silo {self.user!r} "
                                      "takes part in every round; remove it from " + key)
                if rounds is not None and r > rounds:
                    raise ConfigError(f"weight_erosion {key}: round {r} for silo {k} is after "
                                      f"the last round ({rounds}); use 1..{rounds}")
        self.aggregation.check(num_silos)

    def privacy_events(self, round_event: dpa.DpEvent, rounds: int,
                       target: PrivacyTarget | None = None) -> dpa.DpEvent:
        # one step: a Poisson-sampled Gaussian (example level) or a node-level DP-SGD event
        # with steps = 1 (`privacy.node_level.NodeLevelDpEvent`, graph data)
        one_step = isinstance(round_event, dpa.PoissonSampledDpEvent) or (
            type(round_event).__name__ == "NodeLevelDpEvent" and round_event.steps == 1)
        if self.update == "gradient" and not one_step:
            raise PrivacyError("weight_erosion takes one DP-SGD step per round: its round "
                               "event must be one Poisson-sampled step (or one node-level "
                               f"step), got {round_event}")
        # the worst case, every round: a silo that misses rounds is charged less at settling
        return dpa.SelfComposedDpEvent(round_event, rounds)

    def init(self, params0: np.ndarray, num_silos: int,
             rounds: int | None = None) -> tuple[SiloState, ErosionServer]:
        self.check_plan(num_silos, rounds, None)
        self.alpha_history = []
        self.round_log = []
        self._present, self._K = [], num_silos
        self._taken = [np.zeros(num_silos, np.int64)]  # [r]: rounds 1..r taken part, per silo
        alpha = np.ones(num_silos)
        alpha[[k for k, r in self._join.items() if r > 1]] = np.nan  # no weight before joining
        return SiloState(np.tile(params0, (num_silos, 1))), ErosionServer(params0.copy(), alpha)

    def present(self, round: int) -> np.ndarray:
        """(K,) bool: the silos taking part in `round` (public; see `participation`)."""
        while len(self._present) < round:
            r = len(self._present) + 1
            self._present.append(participation(r, self._K, self.user_silo,
                                               self.participation, self._join, self._leave,
                                               self.seed))
            self._taken.append(self._taken[-1] + self._present[-1])
        return self._present[round - 1]

    def taken_part(self, round: int) -> np.ndarray:
        """(K,) int: rounds 1..`round` each silo took part in."""
        self.present(max(round, 1))
        return self._taken[round]

    def silo_step(self, silos: SiloState, message: np.ndarray, trainer: LocalTrainer,
                  round: int) -> tuple[SiloState, ErosionUpdate]:
        K = silos.params.shape[0]
        start = np.tile(message, (K, 1))
        mask = self.present(round) if self.scheduled else None
        if self.update == "gradient":
            grads = trainer.gradients(start, round=round) if mask is None else \
                trainer.gradients(start, round=round, silos=mask)
        else:
            if not trainer.lr > 0:  # before anything is charged or read
                raise ConfigError("weight_erosion with we_update = 'local_sgd' divides by the "
                                  "step size: set lr > 0")
            end = trainer.run(start, round=round, silos=mask)
            grads = (start - end) / trainer.lr  # Σ of the pass's steps: a FedAvg-size move
            if mask is not None:
                grads[~mask] = np.nan
        r = self.taken_part(round) if self.count == "participated" else round
        epochs = np.floor((r - 1) * trainer.batch_size / trainer.data.n)
        return SiloState(start), ErosionUpdate(grads, epochs, float(trainer.lr), mask, round)

    def _arrivals(self, round: int) -> np.ndarray:
        """(K,) bool: late joiners (join round > 1) taking part for the first time."""
        out = np.zeros(self._K, bool)
        if round > 1:
            first = self.present(round) & (self.taken_part(round - 1) == 0)
            for k, r in self._join.items():
                out[k] = r > 1 and first[k]
        return out

    def _initial_alpha(self, alpha: np.ndarray, round: int) -> float:
        """A late joiner's first α: 1, or the mean/median α of every silo holding a weight at
        `round` (joined and not left, the user included), before this round's erosion."""
        if self.newcomer == "one":
            return 1.0
        gone = np.array([round >= self._leave.get(k, np.inf) for k in range(self._K)])
        pool = alpha[np.isfinite(alpha) & ~gone]  # the user's α = 1 is always in
        return float(np.mean(pool) if self.newcomer == "mean" else np.median(pool))

    def server_step(self, server: ErosionServer, update: ErosionUpdate,
                    weights: np.ndarray) -> ErosionServer:
        agg, last = self.aggregation, getattr(server, "last_step", None)
        K = server.alpha.shape[0]
        present = np.ones(K, bool) if update.present is None else np.asarray(update.present)
        keep, grads = screen(update.grads, server.params.shape[0])
        keep &= present  # an absent silo sent nothing (its NaN row is not a rejection)
        agg.rejected += int((present & ~keep).sum())
        released = np.full((keep.shape[0], server.params.shape[0]), np.nan)
        released[keep] = grads[keep]
        alpha = server.alpha.copy()
        if update.present is not None:
            new = self._arrivals(update.round)
            if new.any():  # one value for all of this round's newcomers
                alpha[new] = self._initial_alpha(alpha, update.round)
        if not keep[self.user_silo]:  # no reference gradient: skip the round
            self.alpha_history.append(alpha.copy())
            self._log(server.params, released, alpha, update.lr, present)
            return ErosionServer(server.params.copy(), alpha, last)
        idx = np.flatnonzero(keep)
        epochs = np.broadcast_to(np.asarray(update.epochs, float), keep.shape)[idx]
        user = int(np.searchsorted(idx, self.user_silo))
        kept_alpha, gbar = erode(alpha[idx], grads[idx], epochs, user, self.p_s, self.p_d)
        alpha[idx] = kept_alpha
        if agg.rule != "mean":  # α_0 = 1 always, so at least the user takes part
            gbar = agg.combine(grads[idx][kept_alpha > 0], center=last)
        self.alpha_history.append(alpha.copy())
        self._log(server.params, released, alpha, update.lr, present)
        return ErosionServer(server.params - update.lr * gbar, alpha, gbar)

    def _log(self, params: np.ndarray, released: np.ndarray, alpha: np.ndarray, lr: float,
             present: np.ndarray) -> None:
        self.round_log.append({"params": params.copy(), "grads": released,
                               "alpha": alpha.copy(), "lr": float(lr),
                               "present": present.copy()})

    def personal_models(self, silos: SiloState, server: ErosionServer) -> np.ndarray:
        return np.tile(server.params, (silos.params.shape[0], 1))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "user": self.user, "user_index": self.user_index,
                "p_s": self.p_s, "p_d": self.p_d, **self.options(),
                **self.aggregation.describe_if_used()}

    def options(self) -> dict:
        """The options set away from Algorithm 1's defaults (so default runs read as before)."""
        out = {}
        for key, value, default in (("update", self.update, "gradient"),
                                    ("participation", self.participation, 1.0),
                                    ("join_round", self.join_round, {}),
                                    ("leave_round", self.leave_round, {}),
                                    ("count", self.count, "rounds"),
                                    ("newcomer", self.newcomer, "one")):
            if value != default:
                out[key] = value
        if self.participation < 1:
            out["schedule_seed"] = self.seed
        return out
