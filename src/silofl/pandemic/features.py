"""Neighbourhood feature vectors for infection-risk prediction (thesis §2.3.2).

A training example describes a person *and* their (pruned, see `graph`) neighbourhood:

    [ own node features | own infection history |
      slot 1: empty flag | neighbour node features | contact (edge) features | neighbour history |
      ...
      slot K: ... ]

* **node features** (`tables.build_node_table`, one float32 row per person, computed once):
  standardized age, sex (0/1), Box-Cox transformed household size (then standardized),
  activity indicators, fraction of the day out of home.  With
  ``graph_features=True`` also the degree in the pruned graph / max_degree, the
  standardized log degree in the deduplicated contact graph and standardized
  log(N · PageRank) of that graph (scikit-network) — the seed's graph features, **off by
  default because they break the node-level accounting**: a neighbour's degree or
  PageRank depends on people *outside* the example (its other contacts, or the whole
  graph), so replacing one person would change far more than the ``S`` examples that
  contain them.  `NeighbourhoodFeatures.node_dp_S` refuses to give an ``S`` for them.
* **edge features** (computed per batch from the compact per-edge arrays of the
  neighbour index): time of day of the longest contact, standardized log duration,
  standardized log number of contacts of the pair, the location's type flags,
  standardized longitude/latitude, and an "unknown location" flag.
* **infection history**: one-hot S/I/R for each of the ``t_window`` days
  ``window_end − t_window .. window_end − 1`` (day-major: ``d0:S, d0:I, d0:R, d1:S, …``);
  the centre person and all of its neighbours use the same window.
* **slots**: ``k1 = S − 1`` one-hop slots, ordered like the neighbour index rows (longest
  contact first).  With ℓ = 2, ``k1 · k2`` more slots follow: slot ``(i, j)`` holds the
  ``j``-th 2-hop neighbour reached through 1-hop slot ``i`` and the features of that
  second contact.  An empty slot is all zeros except its leading "empty" flag.

**Label** (random-window strategy, §2.3.2 "Labels"): with prediction window
``window_end .. window_end + t_pred − 1`` (t_pred = 7), ``y = 1`` iff the person
*transitions into I* on a day ``d`` of that window, i.e. ``state[d − 1] = S`` and
``state[d] = I``.  Training draws a fresh ``window_end`` uniformly from
``[t_window, T − t_pred]`` every time a person is sampled (so the prediction window is
fully observed); prediction uses ``window_end = T`` (features from the last ``t_window``
observed days, labels unknown).

**Normalization constants** (`tables.FeatureConstants`: age centre/scale, the household-size
Box-Cox λ and centre/scale, longitude/latitude centre/scale, contact log-duration and
log-count centre/scale) come from one of three sources (``constants=``):

* ``"declared"`` (the default, `DECLARED_CONSTANTS`): fixed public numbers stated here,
  with where they come from (`DECLARED_SOURCES`); no statistic of the data is computed.
* a `FeatureConstants` computed elsewhere, e.g. privately (`constants.private_release` releases them as a
  node-level DP Gaussian sum, charged before it reads the data).
* ``"uncharged"``: fit on the region (means, standard deviations, maximum-likelihood
  λ) and *not* charged to any accountant; `FeatureConstants.source` says so, and the
  pipeline lists it by name.

Pruning itself is data-dependent and not charged (see `silofl.pandemic.graph`).

The ``N × D`` matrix is never materialized: `NeighbourhoodFeatures.gather` builds the rows
of one batch with vectorized fancy indexing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from silofl.errors import ConfigError, DataError, PrivacyError
from silofl.pandemic.graph import (
    NeighbourIndex,
    Priority,
    dedupe_contacts,
    prune_pairs,
)
from silofl.pandemic.tables import (
    DECLARED_CONSTANTS,
    FeatureConstants,
    LocationTable,
    build_location_table,
    build_node_table,
    contact_stats,
    fitted_constants,
    pagerank_scores,
)

T_PRED = 7
STATE_CODES = ("S", "I", "R")
N_STATES = 3
SECONDS_PER_DAY = 86400


def check_states(states, num_nodes: int) -> np.ndarray:
    states = np.asarray(states)
    if states.ndim != 2 or states.shape[0] != num_nodes:
        raise DataError(f"states must have shape (N, T) = ({num_nodes}, T), got "
                        f"{states.shape}")
    if states.size and not np.issubdtype(states.dtype, np.integer):
        raise DataError(f"states must be integer codes 0=S, 1=I, 2=R, got dtype {states.dtype}")
    if states.size and (int(states.min()) < 0 or int(states.max()) > 2):
        raise DataError("states must be coded 0=S, 1=I, 2=R; other codes were found")
    return states.astype(np.int8, copy=False)


def check_t_window(t_window: int, T: int, t_pred: int = T_PRED) -> int:
    if isinstance(t_window, bool) or not isinstance(t_window, (int, np.integer)):
        raise ConfigError(f"t_window must be an integer number of days, got {t_window!r}")
    hi = T - t_pred
    if hi < 1:
        raise ConfigError(f"the infection history has only T = {T} days; training needs "
                          f"more than the {t_pred}-day prediction window")
    if not 1 <= t_window <= hi:
        raise ConfigError(f"t_window = {t_window} does not fit the history: with T = {T} "
                          f"observed days and a {t_pred}-day prediction window, t_window "
                          f"must be between 1 and {hi} (T − {t_pred})")
    return int(t_window)


def check_S(S: int) -> int:
    if isinstance(S, bool) or not isinstance(S, (int, np.integer)) or S <= 0:
        raise ConfigError(f"neighbourhood size S must be a positive integer (the person "
                          f"plus up to S − 1 neighbours), got {S!r}; e.g. S = 20")
    return int(S)


# --- the feature object ---------------------------------------------------------------

@dataclass(eq=False)
class NeighbourhoodFeatures:
    """Compact per-region tables from which batches of examples are gathered.

    ``node_table`` (N, d_node) float32; ``index`` the pruned neighbour CSR with aligned
    edge arrays; ``locations`` the location feature table; ``states`` (N, T) int8."""

    index: NeighbourIndex
    node_table: np.ndarray
    node_names: tuple[str, ...]
    locations: LocationTable
    states: np.ndarray
    t_window: int = 21
    t_pred: int = T_PRED
    edge_stats: dict = field(default_factory=dict)
    fitted: dict = field(default_factory=dict)
    graph_features: bool = False

    def __post_init__(self):
        n = self.index.num_nodes
        if self.node_table.shape[0] != n:
            raise DataError(f"node table has {self.node_table.shape[0]} rows for {n} persons")
        self.states = check_states(self.states, n)
        self.t_window = check_t_window(self.t_window, self.states.shape[1], self.t_pred)
        if not self.edge_stats:
            self.edge_stats = contact_stats(self.index)
        self._offsets = np.arange(-self.t_window, 0, dtype=np.int64)
        self._pred_offsets = np.arange(self.t_pred, dtype=np.int64)

    # shapes -------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return self.index.num_nodes

    @property
    def T(self) -> int:
        return int(self.states.shape[1])

    @property
    def k1(self) -> int:
        return self.index.max_degree

    @property
    def k2(self) -> int:
        return self.index.max_degree_hop2

    @property
    def num_slots(self) -> int:
        return self.k1 + self.k1 * self.k2

    @property
    def d_node(self) -> int:
        return int(self.node_table.shape[1])

    @property
    def d_edge(self) -> int:
        return 3 + int(self.locations.table.shape[1])

    @property
    def d_history(self) -> int:
        return N_STATES * self.t_window

    @property
    def block_dim(self) -> int:
        return 1 + self.d_node + self.d_edge + self.d_history

    @property
    def own_dim(self) -> int:
        return self.d_node + self.d_history

    @property
    def dim(self) -> int:
        """D, the length of one example."""
        return self.own_dim + self.num_slots * self.block_dim

    @property
    def appearance_bound(self) -> int:
        """S for the node-level accountant (1 + k1, or 1 + k1 + k2 (k1 − 1) for ℓ = 2)."""
        return self.index.appearance_bound

    @property
    def node_dp_S(self) -> int:
        """The ``S`` to give `silofl.privacy.node_level`; PrivacyError when the examples
        carry graph features that depend on people outside them."""
        if self.graph_features:
            raise PrivacyError(
                "these features include degree/PageRank columns, which depend on people "
                "outside each example, so no S bounds the examples one person changes; "
                "rebuild with graph_features=False for node-level DP accounting")
        return self.appearance_bound

    @property
    def train_window_range(self) -> tuple[int, int]:
        """Inclusive range of training ``window_end``: [t_window, T − t_pred]."""
        return self.t_window, self.T - self.t_pred

    def nbytes(self) -> int:
        return (self.index.nbytes() + self.node_table.nbytes + self.states.nbytes
                + self.locations.table.nbytes + self.locations.ids.nbytes)

    def edge_names(self) -> tuple[str, ...]:
        return ("contact_time_of_day", "contact_log_duration", "contact_log_count",
                *self.locations.names)

    def feature_names(self) -> list[str]:
        hist = [f"d{o}:{s}" for o in range(-self.t_window, 0) for s in STATE_CODES]
        names = [*self.node_names, *[f"hist.{h}" for h in hist]]
        block = ["empty", *self.node_names, *self.edge_names(), *[f"hist.{h}" for h in hist]]
        for i in range(self.k1):
            names += [f"n{i}.{b}" for b in block]
        for i in range(self.k1):
            for j in range(self.k2):
                names += [f"n{i}.{j}.{b}" for b in block]
        return names

    # validation ---------------------------------------------------------------------
    def _check_persons(self, persons) -> np.ndarray:
        p = np.asarray(persons)
        if p.ndim != 1 or (p.size and not np.issubdtype(p.dtype, np.integer)):
            raise ConfigError(f"persons must be a 1-D integer array, got shape {p.shape} "
                              f"dtype {p.dtype}")
        if p.shape[0] > self.num_nodes:
            raise ConfigError(f"batch of {p.shape[0]} persons is larger than the region "
                              f"({self.num_nodes} persons); use a batch size ≤ "
                              f"{self.num_nodes}")
        if p.size and (int(p.min()) < 0 or int(p.max()) >= self.num_nodes):
            raise ConfigError(f"person indices must lie in 0..{self.num_nodes - 1}, got "
                              f"[{int(p.min())}, {int(p.max())}]")
        return p.astype(np.int64, copy=False)

    def _check_window_end(self, window_end, b: int, labels: bool) -> np.ndarray:
        we = np.asarray(window_end)
        if we.size and not np.issubdtype(we.dtype, np.integer):
            raise ConfigError(f"window_end must be integer days, got dtype {we.dtype}")
        we = np.broadcast_to(we.astype(np.int64), (b,)) if we.ndim == 0 else we.astype(np.int64)
        if we.shape != (b,):
            raise ConfigError(f"window_end must be a scalar or have shape ({b},), got {we.shape}")
        hi = self.T - self.t_pred if labels else self.T
        if we.size and (int(we.min()) < self.t_window or int(we.max()) > hi):
            extra = ("; labels need the whole prediction window observed (pass "
                     "labels=False or use gather_prediction for window_end up to T)"
                     if labels else "")
            raise ConfigError(f"window_end must lie in [{self.t_window}, {hi}], got "
                              f"[{int(we.min())}, {int(we.max())}]{extra}")
        return we

    # windows & batches -------------------------------------------------------------
    def sample_windows(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Uniform training ``window_end`` in [t_window, T − t_pred]."""
        lo, hi = self.train_window_range
        return rng.integers(lo, hi, size=size, endpoint=True)

    def epoch_windows(self, seed: int, epoch: int) -> np.ndarray:
        """(N,) window_end of every person for one epoch, reproducible from (seed, epoch)."""
        rng = np.random.default_rng([int(seed), int(epoch), 0x57A7E])
        return self.sample_windows(rng, self.num_nodes).astype(np.int16)

    def sample_batch(self, rng: np.random.Generator,
                     batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """``batch_size`` persons uniformly *without replacement* (the sampling the
        node-level accountant assumes) and a fresh random window for each."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size <= 0:
            raise ConfigError(f"batch size must be a positive integer, got {batch_size!r}")
        if batch_size > self.num_nodes:
            raise ConfigError(f"batch size {batch_size} is larger than the region "
                              f"({self.num_nodes} persons); use a batch size ≤ "
                              f"{self.num_nodes}")
        persons = rng.choice(self.num_nodes, size=int(batch_size), replace=False)
        return persons.astype(np.int64), self.sample_windows(rng, int(batch_size))

    # gathering -----------------------------------------------------------------------
    def labels(self, persons, window_end) -> np.ndarray:
        """(B,) uint8: 1 iff S→I on a day of [window_end, window_end + t_pred)."""
        p = self._check_persons(persons)
        we = self._check_window_end(window_end, p.shape[0], True)
        return self._labels(p, we)

    def _labels(self, p: np.ndarray, we: np.ndarray) -> np.ndarray:
        days = we[:, None] + self._pred_offsets
        prev = self.states[p[:, None], days - 1]
        cur = self.states[p[:, None], days]
        return ((prev == 0) & (cur == 1)).any(axis=1).astype(np.uint8)

    def _history(self, persons: np.ndarray, days: np.ndarray) -> np.ndarray:
        h = self.states[persons[:, None], days]
        onehot = h[:, :, None] == np.arange(N_STATES, dtype=np.int8)
        return onehot.reshape(h.shape[0], self.d_history)

    def _edge_features(self, index: NeighbourIndex, e: np.ndarray) -> np.ndarray:
        st = self.edge_stats
        out = np.empty((e.shape[0], self.d_edge), dtype=np.float32)
        out[:, 0] = (index.start_time[e] % SECONDS_PER_DAY) / SECONDS_PER_DAY
        out[:, 1] = (np.log1p(index.duration[e].astype(np.float64)) - st["dur_mean"]) / st["dur_std"]
        out[:, 2] = (np.log1p(index.n_contacts[e].astype(np.float64)) - st["cnt_mean"]) / st["cnt_std"]
        out[:, 3:] = self.locations.table[self.locations.rows(index.lid[e])]
        return out

    def _fill(self, blocks, bi, si, w, index, e, days) -> None:
        dn, de = self.d_node, self.d_edge
        blocks[bi, si, 0] = 0.0
        blocks[bi, si, 1:1 + dn] = self.node_table[w]
        blocks[bi, si, 1 + dn:1 + dn + de] = self._edge_features(index, e)
        blocks[bi, si, 1 + dn + de:] = self._history(w, days)

    def gather(self, persons, window_end, *, labels: bool = True):
        """Examples for ``persons`` (B,) with windows ending at ``window_end`` (scalar or
        (B,)): returns ``X`` (B, D) float32 and ``y`` (B,) uint8 (None if not labels)."""
        p = self._check_persons(persons)
        we = self._check_window_end(window_end, p.shape[0], labels)
        X = self._gather(p, we)
        return X, (self._labels(p, we) if labels else None)

    def gather_prediction(self, persons) -> np.ndarray:
        """Test-time examples: the window is the last ``t_window`` observed days."""
        p = self._check_persons(persons)
        return self._gather(p, np.full(p.shape[0], self.T, dtype=np.int64))

    def iter_prediction_batches(self, batch_size: int = 4096) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yields (persons, X) over the whole region in order."""
        if batch_size <= 0:
            raise ConfigError(f"batch size must be positive, got {batch_size}")
        for lo in range(0, self.num_nodes, batch_size):
            p = np.arange(lo, min(lo + batch_size, self.num_nodes), dtype=np.int64)
            yield p, self.gather_prediction(p)

    def _gather(self, p: np.ndarray, we: np.ndarray) -> np.ndarray:
        b = p.shape[0]
        days = we[:, None] + self._offsets  # (B, t_window)
        own = np.empty((b, self.own_dim), dtype=np.float32)
        own[:, :self.d_node] = self.node_table[p]
        own[:, self.d_node:] = self._history(p, days)
        idx = self.index
        k1 = self.k1
        blocks = np.zeros((b, self.num_slots, self.block_dim), dtype=np.float32)
        start = idx.indptr[p]
        cnt = idx.indptr[p + 1] - start
        valid = np.arange(k1)[None, :] < cnt[:, None]
        blocks[:, :, 0] = 1.0  # every slot starts empty; _fill clears the flag
        bi, si = np.nonzero(valid)
        e = start[bi] + si
        w = idx.nbr[e]
        self._fill(blocks, bi, si, w, idx, e, days[bi])
        if idx.hop2 is not None and self.k2 > 0 and idx.hop2.nbr.size:
            h2 = idx.hop2
            k2 = self.k2
            s2 = h2.indptr[w]
            c2 = h2.indptr[w + 1] - s2
            j = np.arange(k2)[None, :]
            ok = j < c2[:, None]
            e2 = np.where(ok, s2[:, None] + j, 0)
            w2 = h2.nbr[e2]
            ok &= w2 != p[bi][:, None]
            rank = np.cumsum(ok, axis=1) - 1
            mi, ji = np.nonzero(ok)
            slot = k1 + si[mi] * k2 + rank[mi, ji]
            self._fill(blocks, bi[mi], slot, w2[mi, ji], h2, e2[mi, ji], days[bi[mi]])
        return np.concatenate([own, blocks.reshape(b, -1)], axis=1)


def build_neighbourhood_features(
        *, src, dst, num_nodes: int, start_time, duration, lid,
        age, sex, household_size, activities, frac_out_of_home, states,
        location_flags, longitude, latitude, location_ids=None,
        S: int = 20, t_window: int = 21, t_pred: int = T_PRED, seed: int = 0,
        priority: Priority = "random", hops: int = 1, hop2_neighbours: int | None = None,
        graph_features: bool = False, pagerank_iterations: int = 20, activity_names=None,
        location_flag_names=None,
        constants: FeatureConstants | str | Callable[[NeighbourIndex], FeatureConstants]
        = "declared") -> NeighbourhoodFeatures:
    """Dedupe → prune (degree ≤ S − 1) → node/location tables.

    ``constants``: "declared" (`DECLARED_CONSTANTS`), "uncharged" (fit on these data,
    not charged: `fitted_constants`), a `FeatureConstants`, or a callable given the
    pruned index that returns them (called after pruning, before the tables are built).

    Contact arrays are (R,) per contact row; person arrays (N,) (``activities`` (N, A));
    location arrays (L,) (``location_flags`` (L, F)); ``states`` (N, T) with 0=S, 1=I,
    2=R.  With ``hops=2`` each 1-hop neighbour contributes up to ``hop2_neighbours``
    2-hop neighbours; the accountant's S is then ``features.node_dp_S``.
    ``graph_features=True`` adds degree and PageRank columns (not node-level DP safe)."""
    S = check_S(S)
    states = check_states(states, int(num_nodes))
    t_window = check_t_window(t_window, states.shape[1], t_pred)
    pairs = dedupe_contacts(src, dst, num_nodes, start_time=start_time, duration=duration,
                            lid=lid)
    pr = pagerank_scores(pairs, n_iter=pagerank_iterations) if graph_features else None
    index = prune_pairs(pairs, S - 1, seed, priority=priority, hops=hops,
                        max_degree_hop2=hop2_neighbours)
    del pairs
    if isinstance(constants, str):
        if constants == "declared":
            constants = DECLARED_CONSTANTS
        elif constants == "uncharged":
            constants = fitted_constants(age=age, household_size=household_size,
                                         longitude=longitude, latitude=latitude, index=index)
        else:
            raise ConfigError(f"constants must be 'declared', 'uncharged', FeatureConstants "
                              f"or a callable, got {constants!r}")
    elif callable(constants) and not isinstance(constants, FeatureConstants):
        constants = constants(index)
    if not isinstance(constants, FeatureConstants):
        raise ConfigError("the constants callable must return FeatureConstants")
    extra = dict(original_degree=index.original_degree, pruned_degree=index.degree,
                 max_degree=S - 1, pagerank=pr) if graph_features else {}
    table, names, fitted = build_node_table(
        age=age, sex=sex, household_size=household_size, activities=activities,
        frac_out_of_home=frac_out_of_home, activity_names=activity_names,
        constants=constants, **extra)
    locations = build_location_table(location_flags, longitude, latitude, location_ids,
                                     location_flag_names, constants)
    fitted["constants"] = constants.to_dict()
    return NeighbourhoodFeatures(index=index, node_table=table, node_names=names,
                                 locations=locations, states=states, t_window=t_window,
                                 t_pred=t_pred, edge_stats=constants.edge_stats(),
                                 fitted=fitted, graph_features=graph_features)
