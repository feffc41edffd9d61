"""The silo side of training: the only code that reads private examples.

A `LocalTrainer` hosts the training data of one or more silos (all of them in the
simulator, one in a networked client). `run` performs one round of local DP-SGD for every
hosted silo at once: it first charges each silo's ledger for the steps it is about to
take, then runs them as batched array operations across silos. `gradients` is one DP-SGD
gradient per silo at given parameters (Weight Erosion), and `select_cluster` a private
choice among candidate models (IFCA): the other private data accesses, charged first too.

The privacy unit is a choice: example level (default; Poisson sampling, batched across
silos); person level (a `training.persons.PersonSource`: persons Poisson-sampled, each
sampled person's rows weighted 1/r so a person adds ≤ C, the same events with n = persons);
or node level (`sampling.NodeUnit`: one person of a graph appears in ≤ S
examples; every step a batch of exactly b units drawn without replacement, silo by silo,
charged as `privacy.node_level.NodeLevelDpEvent`s; a `gradients` release is one such step,
and a cluster selection scores all n persons' examples at Δ = `selection.node_sensitivity`).
The data source is `SiloArrays` or any
object with ``n`` (K,) and ``gather(silos, idx)`` (graph data: `pandemic.engine.GraphSource`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import dp_accounting as dpa
import numpy as np

from silofl.errors import ConfigError, PrivacyError
from silofl.models.base import Model
from silofl.privacy import accounting
from silofl.privacy.adaptive_clip import adaptive_event
from silofl.privacy.ledger import Ledger, charge_all
from silofl.privacy.node_level import NodeLevelDpEvent
from silofl.privacy.randomness import Randomness
from silofl.training import fused, selection
from silofl.training.dpsgd import GradientRule, round_noise
from silofl.training.sampling import (
    BatchSampler,
    NodeUnit,
    node_streams,
    poisson_batches,
    secure_randomness,
    seeded_streams,
)
from silofl.training.silo_data import SiloArrays, SiloSource

#: the unpatched tabular reader: the fused pass runs only on it (`fused.applies`)
_PLAIN_GATHER = SiloArrays.gather

#: An algorithm's own local step (`LocalTrainer.run`'s `step`), in place of w ← w − lr·g:
#: (silos (k,) hosted indices stepping now, W (k, P), noised g (k, P), l2 and pull included)
#: → new W (k, P). It runs after the noise: post-processing, free.
StepRule = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


#: persons per gather when a node-level selection scores a whole region
SCORE_CHUNK = 4096
#: the seeded stream index of a node-level selection's noise (distinct from pass streams)
SELECT_STREAM = 999


@dataclass
class LocalTrainer:
    model: Model
    data: SiloSource
    rule: GradientRule
    batch_size: float            # expected batch size b; q_k = b / n_k
    steps_per_round: np.ndarray  # (K,) DP-SGD steps each silo takes per local pass
    lr: float
    l2: float
    rng: Randomness
    ledgers: list[Ledger] | None = None  # None only in the non-private mode
    #: the privacy unit: None = example-level (Poisson sampling, q_k = b/n_k); a `NodeUnit`
    #: = node-level (batches of exactly b without replacement, node-level events)
    node: NodeUnit | None = None
    #: the ledger label of a local pass's charge when the algorithm names none
    label: str = "dpsgd"
    steps_done: np.ndarray = field(init=False)       # (K,) DP-SGD steps run per silo
    selections_done: np.ndarray = field(init=False)  # (K,) private selections run per silo

    def __post_init__(self) -> None:
        self.q = np.minimum(1.0, self.batch_size / self.data.n)
        self.expected_batch = self.q * self.data.n
        self.steps_done = np.zeros(len(self.data.n), dtype=np.int64)
        self.selections_done = np.zeros(len(self.data.n), dtype=np.int64)
        self._events: dict[int | str, list] = {}
        if self.rule.private and self.ledgers is None:
            raise ValueError("private training needs one ledger per silo")
        if self.node is not None and self.rule.adaptive is not None:
            raise ConfigError("clip = \"auto\" is not available with privacy_unit = 'node' "
                              "(its accounting assumes a fixed clip); set [training] clip to "
                              "a number")
        if self.node is not None:
            b = int(self.batch_size)
            if b != self.batch_size or np.any(self.data.n < b):
                raise ValueError(f"node-level batches are exactly b = {self.batch_size} "
                                 f"persons without replacement: need an integer b ≤ every "
                                 f"silo's size, got sizes {self.data.n.tolist()}")
            if len(self.node.names) != len(self.data.n):
                raise ValueError("a node-level trainer needs one name per silo (NodeUnit.names)")
            self.expected_batch = np.full(len(self.data.n), float(b))
            self._passes: dict[tuple[int, int], int] = {}

    @property
    def unit(self) -> NodeUnit:
        """The node-level unit (only node-level code paths ask for it)."""
        if self.node is None:
            raise ValueError("this trainer trains at example level: it has no node unit")
        return self.node

    @property
    def private_ledgers(self) -> list[Ledger]:
        """The silos' ledgers (present whenever the rule is private, see __post_init__)."""
        if self.ledgers is None:
            raise PrivacyError("a private release needs the silos' ledgers, and this "
                               "trainer runs in the non-private mode")
        return self.ledgers

    def round_events(self, passes: int = 1) -> list:
        """What `passes` local passes cost each silo, as dp_accounting events (the same
        objects every round, so ledgers can recognise them cheaply)."""
        cached = self._events.get(passes)
        if cached is None:
            cached = self._events[passes] = [
                self._event(k, int(passes * self.steps_per_round[k]))
                for k in range(len(self.q))]
        return cached

    def _event(self, k: int, steps: int) -> dpa.DpEvent:
        """Silo k's charge for `steps` DP-SGD steps under the trainer's privacy unit."""
        if self.node is None:
            clip = self.rule.adaptive
            if clip is not None:  # clip = "auto": each step also releases a noisy count
                return adaptive_event(self.q[k], self.rule.sigmas[k], clip.count_noise[k], steps)
            return accounting.dpsgd_event(self.q[k], self.rule.sigmas[k], steps)
        return NodeLevelDpEvent(int(self.data.n[k]), self.unit.S, int(self.batch_size),
                                float(self.rule.sigmas[k]), steps,
                                self.unit.adjacency)

    def step_events(self) -> list:
        """What one DP-SGD step (one Poisson-sampled Gaussian release) costs each silo."""
        cached = self._events.get("step")
        if cached is None:
            cached = self._events["step"] = [self._event(k, 1) for k in range(len(self.q))]
        return cached

    def charge(self, round: int, label: str = "dpsgd", passes: int = 1) -> None:
        if self.rule.private:
            self._charge_all(self.round_events(passes), round, label)

    def _charge_all(self, evs: list, round: int, label: str,
                    ids: np.ndarray | None = None) -> None:
        """Charge every hosted silo (or only the silos `ids`) its event in `evs` (K,)."""
        ledgers = self.private_ledgers
        if ids is not None:
            ledgers, evs = [ledgers[k] for k in ids], [evs[k] for k in ids]
        charge_all(ledgers, evs, round=round, label=label)  # all silos can pay, or none

    def _subset(self, silos: np.ndarray | None) -> np.ndarray | None:
        """The indices of the silos taking part, from a (K,) boolean mask (None: all)."""
        if silos is None:
            return None
        m = np.asarray(silos)
        if m.dtype != bool or m.shape != self.data.n.shape:
            raise ValueError(f"silos must be a boolean mask of the {len(self.data.n)} hosted "
                             f"silos, got dtype {m.dtype}, shape {m.shape}")
        return np.flatnonzero(m)

    @property
    def target_epsilons(self) -> np.ndarray | None:
        """(K,) each hosted silo's target ε (None in the non-private mode)."""
        if not self.rule.private:
            return None
        return np.array([led.target.epsilon for led in self.private_ledgers], dtype=float)

    def select_cluster(self, candidates: np.ndarray, epsilon: np.ndarray | float | None,
                       round: int = 0, *, loss_bound: float = selection.DEFAULT_LOSS_BOUND,
                       label: str = "select") -> np.ndarray:
        """Each hosted silo privately picks the candidate model that fits its training data
        best (exponential mechanism, see `training.selection`). Returns (K,) int indices.

        candidates: (G, P) shared by all silos or (K, G, P); epsilon: (K,) or scalar, the ε of
        this one selection per silo (ignored in the non-private mode, which takes the exact
        argmin). Every silo's ledger is checked, then all are charged ε²/8-zCDP, before any
        training row is read.

        Node level: the score is the mean over all n persons' examples (at the round's
        windows, read in chunks), run at `selection.node_sensitivity` = A·B/n; the Gumbel
        noise comes from the silo's own stream (`_node_noise`), as its local passes do."""
        K = len(self.data.n)
        cands = np.asarray(candidates, dtype=float)
        if cands.ndim == 2:
            cands = np.broadcast_to(cands, (K,) + cands.shape)
        if cands.ndim != 3 or cands.shape[0] != K:
            raise ValueError(f"candidates must be (G, P) or ({K}, G, P), got {cands.shape}")
        eps = None
        if self.rule.private:
            eps = np.broadcast_to(np.asarray(epsilon, dtype=float), (K,))
            if not np.all(np.isfinite(eps) & (eps > 0)):
                raise PrivacyError(f"selection epsilon must be positive per silo, got {eps}")
            evs = [selection.selection_event(e) for e in eps]
            for ledger, event in zip(self.private_ledgers, evs, strict=True):  # all or none
                ledger.check(event, round=round, label=label)
            for ledger, event in zip(self.private_ledgers, evs, strict=True):
                ledger.charge(event, round=round, label=label)
        choice = np.empty(K, dtype=np.int64)
        if self.node is not None:
            return self._select_node(cands, eps, round, loss_bound, choice)
        everyone = getattr(self.data, "everyone", None)  # person level: all rows, weighted
        for k in range(K):  # one silo at a time: a whole training set per gather
            n_k = int(self.data.n[k])  # examples, or persons
            idx, w = (np.arange(n_k)[None, :], None) if everyone is None else everyone(k)
            X, y, _ = self.data.gather(np.array([k]), idx)
            score = selection.scores(self.model, cands[k], X[0], y[0], loss_bound,
                                     weights=None if w is None else w[0])
            if eps is None:
                choice[k] = int(np.argmin(score))
            else:
                choice[k] = selection.noisy_argmin(
                    score, eps[k], selection.sensitivity(self.model, n_k, loss_bound), self.rng)
        self.selections_done += 1
        return choice

    def _select_node(self, cands: np.ndarray, eps: np.ndarray | None, round: int,
                     loss_bound: float, choice: np.ndarray) -> np.ndarray:
        """`select_cluster` under the node-level unit (already charged): silo by silo, the
        mean score over all n_k examples (chunks of `SCORE_CHUNK` persons), then
        report-noisy-min at Δ = A·B/n_k with the silo's own noise stream."""
        for k in range(len(self.data.n)):
            n_k = int(self.data.n[k])
            score = self._node_scores(k, cands[k], round, loss_bound)
            if eps is None:
                choice[k] = int(np.argmin(score))
            else:
                delta_s = selection.node_sensitivity(self.model, n_k, self.unit.S,
                                                     self.unit.adjacency, loss_bound)
                choice[k] = selection.noisy_argmin(score, eps[k], delta_s,
                                                   self._node_noise(k, round, SELECT_STREAM))
        self.selections_done += 1
        return choice

    def _node_scores(self, k: int, candidates: np.ndarray, round: int,
                     loss_bound: float) -> np.ndarray:
        """(G,) silo k's selection score of each candidate (G, P): the mean over all its
        n_k persons' examples at `round`'s windows (`selection.scores` per chunk of
        `SCORE_CHUNK` persons). Reads silo k's data: callers charge first."""
        start = getattr(self.data, "start_round", None)
        if start is not None:  # the round's windows, as its local pass reads them
            start(round)
        n_k = int(self.data.n[k])
        total = np.zeros(candidates.shape[0])
        for lo in range(0, n_k, SCORE_CHUNK):
            persons = np.arange(lo, min(lo + SCORE_CHUNK, n_k))
            X, y, _ = self.data.gather(np.array([k]), persons[None, :])
            # the chunk's mean × its size: the chunk's sum (rates and losses alike)
            total += selection.scores(self.model, candidates, X[0], y[0],
                                      loss_bound) * persons.size
        return total / n_k

    def _node_noise(self, k: int, round: int, stream: int) -> Randomness:
        """Silo k's noise source for a node-level release other than a local pass: a fresh
        CSPRNG (secure), or its seeded stream keyed by (seed, name, round, stream), so a
        silo trained alone draws what it draws in the simulator."""
        if self.rng.secure:
            return secure_randomness()
        return seeded_streams(self.unit.seed, self.unit.names[k], round, stream)[1]

    def gradients(self, W: np.ndarray, round: int = 0, label: str | None = None,
                  silos: np.ndarray | None = None) -> np.ndarray:
        """One DP-SGD gradient estimate per hosted silo at W (K, P), with l2·W added (a
        public function of W): one Poisson batch (q_k = b/n_k), clipped, noised and scaled
        exactly like a step of `run`, and charged as one DP-SGD step before the data is read.
        Returns (K, P); the parameters are not changed. `label`: the ledger label (default
        the trainer's: "dpsgd", or "node-dpsgd" at node level).

        Node level: one step of the node-level mechanism (exactly b persons without
        replacement, clipped, N(0, σ²C²) added, divided by b), charged as a
        `NodeLevelDpEvent` with steps = 1.

        `silos` (K,) bool: only these silos take part — only they are charged and read; the
        rows of the others are NaN."""
        label = self.label if label is None else label
        ids = self._subset(silos)
        W = np.asarray(W, dtype=float)
        K = len(self.data.n)
        if W.shape[0] != K:
            raise ValueError(f"W must hold one model per silo ({K}, P), got {W.shape}")
        if self.node is not None:
            ids = np.arange(K) if ids is None else ids
            if self.rule.private:
                self._charge_all(self.step_events(), round, label, ids)
            return self._gradients_node(W, ids, round)
        if ids is not None:
            return self._gradients_of(W, ids, round, label)
        if self.rule.private:
            self._charge_all(self.step_events(), round, label)
        idx, mask = poisson_batches(self.data.n, self.q, self.rng)
        noise = None
        if self.rule.private:
            noise, _ = round_noise(self.rng, np.ones(K, dtype=np.int64),
                                   self.rule.draw_std(), W.shape[1])
        everyone = np.arange(K)
        if fused.applies(self, _PLAIN_GATHER, None):
            return fused.gradients(self, W, everyone, idx, mask, noise)
        X, y, sq, mask = self._read(everyone, idx, mask)
        g = self.rule(self.model, W, X, y, mask, self.expected_batch, everyone, self.rng,
                      noise=noise, x_sqnorm=sq)
        if self.l2:
            g = g + self.l2 * W
        self.steps_done += 1
        return g

    def _gradients_of(self, W: np.ndarray, ids: np.ndarray, round: int,
                      label: str) -> np.ndarray:
        """`gradients` for the silos `ids` only (the others' rows NaN, nothing read)."""
        if self.rule.private:
            self._charge_all(self.step_events(), round, label, ids)
        out = np.full(W.shape, np.nan)
        if not ids.size:
            return out
        idx, mask = poisson_batches(self.data.n[ids], self.q[ids], self.rng)
        noise = None
        if self.rule.private:
            noise, _ = round_noise(self.rng, np.ones(ids.size, dtype=np.int64),
                                   self.rule.draw_std()[ids], W.shape[1])
        if fused.applies(self, _PLAIN_GATHER, None):
            g = fused.gradients(self, W, ids, idx, mask, noise)
            out[ids] = g[ids]
            return out
        X, y, sq, mask = self._read(ids, idx, mask)
        g = self.rule(self.model, W[ids], X, y, mask, self.expected_batch[ids], ids,
                      self.rng, noise=noise, x_sqnorm=sq)
        out[ids] = g + self.l2 * W[ids] if self.l2 else g
        self.steps_done[ids] += 1
        return out

    def _gradients_node(self, W: np.ndarray, ids: np.ndarray, round: int) -> np.ndarray:
        """`gradients` under the node-level unit (already charged) for the silos `ids`:
        each one step of `_node_grad` from a pass stream of its own (`_next_pass`)."""
        start = getattr(self.data, "start_round", None)
        if start is not None:
            start(round)
        out = np.full(W.shape, np.nan)
        b = int(self.batch_size)
        for k in ids:
            k = int(k)
            sampler, noise = node_streams(self.unit, k, round, int(self.data.n[k]),
                                          self.rng.secure, self._next_pass(k, round))
            g = self._node_grad(k, W[k], sampler, noise, b)
            out[k] = g + self.l2 * W[k] if self.l2 else g
            self.steps_done[k] += 1
        return out

    def _next_pass(self, k: int, round: int) -> int:
        """The index of silo k's next pass stream in `round` (Ditto's second pass, a
        gradient after a pass, … each draw from a stream of their own)."""
        i = self._passes.get((k, round), 0)
        self._passes[(k, round)] = i + 1
        return i

    def _node_grad(self, k: int, w: np.ndarray, sampler: BatchSampler, noise: Randomness,
                   b: int) -> np.ndarray:
        """One node-level DP-SGD estimate at w (P,) for silo k: exactly b persons drawn
        without replacement, clipped sum plus N(0, σ_k²C²) (private rule), divided by b.
        An audit's probe (`rule.probe`) adds its canaries before the noise and sees the
        noisy sum, as at an example-level step (`GradientRule.__call__`)."""
        silo = np.array([k])
        X, y, sq = self.data.gather(silo, sampler.draw(b)[None, :])
        mask = np.ones((1, b))
        if self.rule.private:
            aux = {} if sq is None else {"x_sqnorm": sq}
            g = self.rule.clipped_sum(self.model, w[None], X, y, mask, **aux)  # (1, P)
            probe = self.rule.probe
            if probe is not None:
                probe.add(self.rule, silo, g)
            g = g + noise.normal(g.shape[1:]) * float(self.rule.noise_std()[k])
            if probe is not None:
                probe.observe(silo, g)
            return g[0] / b
        return self.model.grad_sum(w[None], X, y, mask)[0] / b

    def run(self, W0: np.ndarray, anchor: np.ndarray | None = None,
            lam: float | np.ndarray = 0.0, round: int = 0, label: str | None = None,
            silos: np.ndarray | None = None, step: StepRule | None = None,
            coords: np.ndarray | None = None) -> np.ndarray:
        """One local pass for every hosted silo. W0, anchor: (K, P); lam: scalar or (K,) per
        silo. Returns (K, P).

        Gradient step: w ← w − lr·(ĝ + l2·w + λ(w − anchor)), ĝ the DP-SGD estimate.
        `silos` (K,) bool: only these silos take their pass — only they are charged and
        read; the others' rows come back as in W0. `step` (`StepRule`) replaces the
        gradient step by the algorithm's own (SCAFFOLD's drift correction, APFL's mixed
        model): it sees only the noised g, so whatever it computes is post-processing.
        `coords` (P,) bool: only these coordinates move (FedRep's head and body passes);
        the per-example gradient is clipped on them alone (`GradientRule`), a pass charged
        like any other."""
        label = self.label if label is None else label
        if coords is not None:  # every coordinate: the ordinary pass
            coords = self._check_coords(coords, np.shape(W0)[-1])
            coords = None if coords.all() else coords
        ids = self._subset(silos)
        if ids is None:
            self.charge(round, label)
        elif self.rule.private:
            self._charge_all(self.round_events(), round, label, ids)
        W = np.array(W0, dtype=float, copy=True)
        K = len(self.data.n)
        everyone = np.arange(K)
        lam = np.asarray(lam, dtype=float)
        if lam.ndim and lam.shape != (K,):
            raise ValueError(f"lam must be a scalar or one value per silo ({K},), got {lam.shape}")
        if self.node is not None:
            return self._run_node(W, anchor, lam, round, everyone if ids is None else ids,
                                  step)
        if ids is None:
            ids, n, q, steps = everyone, self.data.n, self.q, self.steps_per_round
        elif not ids.size:
            return W
        else:
            n, q, steps = self.data.n[ids], self.q[ids], self.steps_per_round[ids]
        S, k = int(steps.max()), len(steps)
        pull = anchor is not None and bool(np.any(lam != 0))
        lam = lam[:, None] if lam.ndim else float(lam)  # scalar fast path stays a float
        # All of this round's batches in one draw (independent Poisson samples per step).
        idx, mask = poisson_batches(np.tile(n, S), np.tile(q, S), self.rng)
        idx, mask = idx.reshape(S, k, -1), mask.reshape(S, k, -1)
        # and all of its noise (only the private rule uses it), N(0, σ_k²C²) rows: step s
        # takes rows off[s]:off[s+1]; a secure stream draws the next round's meanwhile
        z = off = zc = None
        if self.rule.private:
            std = self.rule.draw_std()
            z, off = round_noise(self.rng, steps, std if ids is everyone else std[ids],
                                 W.shape[1])
            if self.rule.adaptive is not None:  # the count noise of every step (S, k)
                zc = self.rng.normal((S, k))
        if fused.applies(self, _PLAIN_GATHER, coords):
            return fused.run_pass(self, W, ids, steps, (idx, mask),
                                  None if z is None or off is None else (z, off),
                                  (anchor, lam) if pull and anchor is not None else None, step)
        for s in range(S):
            # while every silo is still stepping, plain slices avoid fancy-index copies;
            # pos: rows of this round's draws, active: the silos (indices into K)
            pos = slice(None) if steps.min() > s else np.nonzero(steps > s)[0]
            active = ids if isinstance(pos, slice) else ids[pos]
            sel = slice(None) if active is everyone else active
            X, y, sq, m = self._read(active, idx[s, pos], mask[s, pos])
            Ws = W[sel]
            noise = None if z is None or off is None else z[off[s]:off[s + 1]]
            part = {} if coords is None else {"coords": coords}
            g = self.rule(self.model, Ws, X, y, m, self.expected_batch[sel],
                          active, self.rng, noise=noise, x_sqnorm=sq,
                          count_noise=None if zc is None else zc[s, pos], **part)
            if self.l2:
                g += self.l2 * Ws
            if pull and anchor is not None:
                g += (lam if isinstance(lam, float) else lam[sel]) * (Ws - anchor[sel])
            if coords is not None:  # frozen coordinates stay put (l2 and pull too)
                g *= coords
            W[sel] = Ws - self.lr * g if step is None else step(active, Ws, g)
            self.steps_done[sel] += 1
        return W

    def _read(self, silos: np.ndarray, idx: np.ndarray,
              mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
        """Read a sampled batch: X, y, ‖x‖² and the mask (bool), or at person level the
        sampled persons' rows with their weights 1/r (`PersonSource.expand`)."""
        expand = getattr(self.data, "expand", None)
        if expand is not None:
            idx, mask = expand(silos, idx, mask)
        X, y, sq = self.data.gather(silos, idx)
        return X, y, sq, mask

    def _check_coords(self, coords: np.ndarray, P: int) -> np.ndarray:
        """`coords` as a non-empty boolean (P,) mask (example-level units only)."""
        c = np.asarray(coords)
        if c.dtype != bool or c.shape != (P,) or not c.any():
            raise ValueError(f"coords must be a non-empty boolean mask of the {P} parameters, "
                             f"got dtype {c.dtype}, shape {c.shape}")
        if self.node is not None:
            raise ValueError("partial updates (coords) run at example level only; the "
                             "node-level unit trains every coordinate")
        return c

    def _run_node(self, W: np.ndarray, anchor: np.ndarray | None, lam: np.ndarray,
                  round: int, ids: np.ndarray, step: StepRule | None = None) -> np.ndarray:
        """`run` under the node-level unit (already charged): silo by silo, each step a
        batch of exactly b units drawn without replacement (`node_streams`), the clipped
        sum plus N(0, σ_k²C²) noise divided by b. A data source with `start_round(round)`
        (graph data: each person's training window this round) is told the round first.
        W: (K, P), updated in place for the silos `ids`."""
        start = getattr(self.data, "start_round", None)
        if start is not None:
            start(round)
        b = int(self.batch_size)
        pull = anchor is not None and bool(np.any(lam != 0))
        for k in ids:
            k = int(k)
            sampler, noise = node_streams(self.unit, k, round, int(self.data.n[k]),
                                          self.rng.secure, self._next_pass(k, round))
            lam_k = float(lam if lam.ndim == 0 else lam[k])
            w = W[k]
            for _ in range(int(self.steps_per_round[k])):
                g = self._node_grad(k, w, sampler, noise, b)
                if self.l2:
                    g = g + self.l2 * w
                if pull and anchor is not None:
                    g = g + lam_k * (w - anchor[k])
                w = (w - self.lr * g if step is None
                     else step(np.array([k]), w[None], g[None])[0])
            W[k] = w
            self.steps_done[k] += int(self.steps_per_round[k])
        return W
