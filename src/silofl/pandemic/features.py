"""Neighbourhood feature vectors for infection-risk prediction (thesis §2.3.2).

A training example describes a person *and* their (pruned, see `graph`) neighbourhood:

    [ own node features | own infection history |
      slot 1: empty flag | neighbour node features | contact (edge) features | neighbour history |
      ...
      slot K: ... ]

* **node features** (`build_node_table`, one float32 row per person, computed once):
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

**Normalization constants** (`FeatureConstants`: age centre/scale, the household-size
Box-Cox λ and centre/scale, longitude/latitude centre/scale, contact log-duration and
log-count centre/scale) come from one of three sources (``constants=``):

* ``"declared"`` (the default, `DECLARED_CONSTANTS`): fixed public numbers stated here,
  with where they come from (`DECLARED_SOURCES`); no statistic of the data is computed.
* a `FeatureConstants` computed elsewhere, e.g. privately (`pipeline` releases them as a
  node-level DP Gaussian sum, charged before it reads the data).
* ``"uncharged"``: fit on the region (means, standard deviations, maximum-likelihood
  λ) and *not* charged to any accountant; `FeatureConstants.source` says so, and the
  pipeline lists it by name.

Pruning itself is data-dependent and not charged (see `silofl.pandemic.graph`).

The ``N × D`` matrix is never materialized: `NeighbourhoodFeatures.gather` builds the rows
of one batch with vectorized fancy indexing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import numpy as np
from scipy import optimize, sparse, special, stats

from silofl.errors import ConfigError, DataError, PrivacyError
from silofl.pandemic.graph import (
    ContactPairs, NeighbourIndex, Priority, dedupe_contacts, prune_pairs, symmetric_csr,
)

T_PRED = 7
STATE_CODES = ("S", "I", "R")
N_STATES = 3
DEFAULT_LOCATION_FLAGS = ("work", "shopping", "school", "other", "college", "religion")
SECONDS_PER_DAY = 86400
_STATS_SAMPLE = 2_000_000


# --- normalization constants -----------------------------------------------------------

CONSTANT_SOURCES = ("declared", "private", "uncharged")


@dataclass(frozen=True)
class FeatureConstants:
    """Every normalization constant of the feature tables.  Household size is Box-Cox
    transformed with ``household_lambda`` (0 = log) and then standardized; contact
    durations and counts enter as log1p(seconds) and log1p(contacts of the pair)."""

    age_mean: float
    age_std: float
    household_lambda: float
    household_mean: float
    household_std: float
    lon_mean: float
    lon_std: float
    lat_mean: float
    lat_std: float
    dur_mean: float
    dur_std: float
    cnt_mean: float
    cnt_std: float
    source: str = "declared"  # `CONSTANT_SOURCES`: where the numbers came from

    def __post_init__(self):
        if self.source not in CONSTANT_SOURCES:
            raise ConfigError(f"constant source must be one of {', '.join(CONSTANT_SOURCES)}, "
                              f"got {self.source!r}")
        for k, v in asdict(self).items():
            if k != "source" and not math.isfinite(v):
                raise ConfigError(f"feature constant {k} must be a finite number, got {v}")
        for k in ("age_std", "household_std", "lon_std", "lat_std", "dur_std", "cnt_std"):
            if not getattr(self, k) > 0:
                raise ConfigError(f"feature constant {k} must be positive, got {getattr(self, k)}")

    def edge_stats(self) -> dict:
        return {"dur_mean": self.dur_mean, "dur_std": self.dur_std,
                "cnt_mean": self.cnt_mean, "cnt_std": self.cnt_std}

    def to_dict(self) -> dict:
        return asdict(self)

    def replace(self, **kw) -> "FeatureConstants":
        return FeatureConstants(**{**asdict(self), **kw})


#: The declared constants: public numbers, none computed from any silo's data.  A fixed
#: affine map of a column only reparametrizes a linear model (and the summary inputs
#: undo the duration scaling exactly), so rough values are enough.
DECLARED_CONSTANTS = FeatureConstants(
    age_mean=39.0, age_std=23.0,
    household_lambda=0.0, household_mean=1.04, household_std=0.53,
    lon_mean=-79.5, lon_std=2.1, lat_mean=38.0, lat_std=0.73,
    dur_mean=math.log1p(7200.0), dur_std=1.6,
    cnt_mean=math.log(2.0), cnt_std=0.25,
    source="declared")

DECLARED_SOURCES = {
    "age": "US population: mean age ≈ 39 years, standard deviation ≈ 23 (Census figures, "
           "rounded)",
    "household": "log household size (Box-Cox λ = 0, fixed): centre 1.04 and scale 0.53 "
                 "are the mean and standard deviation of log(size) over persons for the "
                 "approximate US household-size distribution (28% one-person, 35% two, "
                 "15% three, 13% four, 6% five, 3% six or more households)",
    "location": "the challenge's data cover Virginia (va_* files): the midpoint of "
                "Virginia's bounding box (−83.7…−75.2° lon, 36.5…39.5° lat) and a quarter "
                "of its width/height; override for another region",
    "contact duration": "log1p(seconds) centred on a 2-hour contact, one unit ≈ a factor "
                        "of 5 in duration (a public guess: contacts last minutes to a "
                        "working day)",
    "contact count": "log1p(contacts of the pair) centred on one contact (log 2), scale "
                     "0.25",
}

#: Clipping bounds (lo, hi) of the raw values a *private* release sums (`pipeline`):
#: age in years, log household size, log1p(contact seconds), log1p(contacts of a pair).
PRIVATE_BOUNDS = {"age": (0.0, 100.0), "household": (0.0, math.log(16.0)),
                  "dur": (0.0, math.log1p(86400.0)), "cnt": (math.log(2.0), math.log1p(64.0))}


def fitted_constants(*, age, household_size, longitude, latitude,
                     index: "NeighbourIndex") -> FeatureConstants:
    """The constants fit on the data itself (source "uncharged"): means and standard
    deviations, maximum-likelihood Box-Cox λ.  Not charged to any accountant."""
    age = np.asarray(age, dtype=np.float64)
    am, asd = _mean_std(age)
    hh = np.asarray(household_size, dtype=np.float64)
    if hh.size == 0 or np.all(hh == hh[0]):
        lam, hm, hs = 0.0, (float(np.log(hh[0])) if hh.size else 0.0), 1.0
    else:
        lam = boxcox_lambda(hh)
        hm, hs = _mean_std(stats.boxcox(hh, lmbda=lam))
    lo_m, lo_s = _mean_std(np.asarray(longitude, dtype=np.float64))
    la_m, la_s = _mean_std(np.asarray(latitude, dtype=np.float64))
    e = _edge_stats(index)
    return FeatureConstants(age_mean=am, age_std=asd, household_lambda=lam,
                            household_mean=hm, household_std=hs, lon_mean=lo_m,
                            lon_std=lo_s, lat_mean=la_m, lat_std=la_s, source="uncharged",
                            **e)


# --- helpers ---------------------------------------------------------------------------

def _zscore(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    mu = float(x.mean())
    sd = float(x.std())
    if not np.isfinite(sd) or sd <= 1e-12:
        return np.zeros_like(x)
    return (x - mu) / sd


def _mean_std(x: np.ndarray) -> tuple[float, float]:
    if x.size == 0:
        return 0.0, 1.0
    mu, sd = float(x.mean()), float(x.std())
    return mu, (sd if sd > 1e-12 else 1.0)


def _person_array(name: str, a, n: int, *, ndim: int = 1) -> np.ndarray:
    a = np.asarray(a)
    if ndim == 2 and a.ndim == 1:
        a = a[:, None]
    if a.ndim != ndim or a.shape[0] != n:
        want = f"({n},)" if ndim == 1 else f"({n}, k)"
        raise DataError(f"{name} must have shape {want} (one entry per person), "
                        f"got {a.shape}")
    if a.size and not np.all(np.isfinite(a.astype(np.float64, copy=False))):
        raise DataError(f"{name} contains NaN or infinite values; impute them before "
                        "building features")
    return a


def _sex01(sex: np.ndarray) -> np.ndarray:
    values = set(np.unique(sex).tolist())
    if values <= {0, 1} and 0 in values:
        return sex.astype(np.float64)
    if values <= {1, 2}:
        return sex.astype(np.float64) - 1.0
    raise DataError("sex must be coded 0/1 or 1/2 (the challenge's schema: 1 male, 2 "
                    "female); other codes were found")


def boxcox_lambda(x: np.ndarray) -> float:
    """Maximum-likelihood Box-Cox λ, as `scipy.stats.boxcox` fits it (Brent, bracket
    (−2, 2)), but evaluated on the distinct values with their counts when there are few
    (household sizes): the same likelihood at a fraction of the cost for millions of
    people."""
    vals, counts = np.unique(x, return_counts=True)
    if vals.size > 4096:
        return float(stats.boxcox(x)[1])
    w = counts / counts.sum()
    mean_log = float(w @ np.log(vals))

    def neg_llf(lmb: float) -> float:  # −boxcox_llf / N
        y = special.boxcox(vals, lmb)
        mu = w @ y
        return -((lmb - 1.0) * mean_log - 0.5 * np.log(w @ (y - mu) ** 2))

    return float(optimize.brent(neg_llf, brack=(-2.0, 2.0)))


def boxcox_household(household_size: np.ndarray,
                     constants: FeatureConstants | None = None) -> tuple[np.ndarray, float | None]:
    """Box-Cox transform, standardized: with ``constants`` their λ, centre and scale;
    without, λ fit by maximum likelihood on the region and z-scored (uncharged)."""
    x = np.asarray(household_size, dtype=np.float64)
    if x.size and x.min() <= 0:  # no value in the message: it is a record's
        raise DataError("household sizes must be positive for the Box-Cox transform; "
                        "every person lives in a household of size ≥ 1")
    if constants is not None:
        y = stats.boxcox(x, lmbda=constants.household_lambda) if x.size else x
        return (y - constants.household_mean) / constants.household_std, \
            constants.household_lambda
    if x.size == 0 or np.all(x == x[0]):
        return np.zeros_like(x), None
    lam = boxcox_lambda(x)
    return _zscore(stats.boxcox(x, lmbda=lam)), lam


def pagerank_scores(pairs: ContactPairs, damping: float = 0.85,
                    n_iter: int = 20) -> np.ndarray:
    """(N,) PageRank of the deduplicated undirected contact graph (scikit-network power
    iteration on a scipy CSR matrix); isolated persons get the restart mass."""
    try:
        from sknetwork.ranking import PageRank
    except ImportError as exc:
        raise ConfigError("PageRank features need scikit-network: install it with "
                          "`pip install -e '.[pandemic]'`") from exc

    n = pairs.num_nodes
    indptr, indices = symmetric_csr(pairs)
    if indptr[-1] < 2**31:
        indptr = indptr.astype(np.int32)
    data = np.ones(indices.shape[0], dtype=np.float32)
    adj = sparse.csr_matrix((data, indices, indptr), shape=(n, n))
    del indptr, indices, data
    return PageRank(damping_factor=damping, solver="piteration",
                    n_iter=n_iter).fit_predict(adj)


def build_node_table(*, age, sex, household_size, activities, frac_out_of_home,
                     original_degree=None, pruned_degree=None, max_degree: int = 1,
                     pagerank=None, activity_names=None,
                     constants: FeatureConstants | None = None
                     ) -> tuple[np.ndarray, tuple[str, ...], dict]:
    """(N, d_node) float32 node table, its column names and the statistics used.

    Age and household size are standardized with ``constants`` (None: fit on the data,
    uncharged).  The graph columns (pruned degree, original degree, PageRank; always
    z-scored on the data) are added only for the arguments given (see the module
    docstring on why they are off by default)."""
    n = int(np.asarray(age).shape[0])
    age = _person_array("age", age, n)
    sex = _person_array("sex", sex, n)
    hh = _person_array("household_size", household_size, n)
    act = _person_array("activities", activities, n, ndim=2)
    frac = _person_array("frac_out_of_home", frac_out_of_home, n)
    a = act.shape[1]
    names_act = tuple(activity_names) if activity_names is not None else tuple(
        f"{i}" for i in range(a))
    if len(names_act) != a:
        raise DataError(f"{len(names_act)} activity names for {a} activity columns")
    hh_t, lam = boxcox_household(hh, constants)
    age_z = _zscore(age) if constants is None else (
        (age.astype(np.float64) - constants.age_mean) / constants.age_std)
    cols: list[tuple[str, np.ndarray]] = [
        ("age", age_z), ("sex", _sex01(sex)), ("household_size_boxcox", hh_t),
        *[(f"act_{s}", act[:, i]) for i, s in enumerate(names_act)],
        ("frac_out_of_home", frac)]
    if pruned_degree is not None:
        deg1 = _person_array("pruned_degree", pruned_degree, n)
        cols.append(("degree_pruned", deg1 / max(max_degree, 1)))
    if original_degree is not None:
        deg0 = _person_array("original_degree", original_degree, n)
        cols.append(("log_degree_original", _zscore(np.log1p(deg0))))
    if pagerank is not None:
        pr = _person_array("pagerank", pagerank, n).astype(np.float64)
        cols.append(("log_pagerank", _zscore(np.log(np.maximum(pr * n, 1e-12)))))
    table = np.empty((n, len(cols)), dtype=np.float32)
    for j, (_, col) in enumerate(cols):
        table[:, j] = col
    if constants is None:
        fitted = {"boxcox_lambda": lam, "age_mean": float(np.mean(age)) if n else 0.0,
                  "age_std": float(np.std(age)) if n else 0.0, "source": "uncharged"}
    else:
        fitted = {"boxcox_lambda": lam, "age_mean": constants.age_mean,
                  "age_std": constants.age_std, "source": constants.source}
    return table, tuple(name for name, _ in cols), fitted


@dataclass(frozen=True, eq=False)
class LocationTable:
    """Location features indexed by location id; the last row is "unknown location"."""

    ids: np.ndarray        # (L,) int64, sorted
    table: np.ndarray      # (L + 1, d_loc) float32
    names: tuple[str, ...]

    def rows(self, lid: np.ndarray) -> np.ndarray:
        lid = np.asarray(lid, dtype=np.int64)
        if self.ids.size == 0:
            return np.zeros(lid.shape, np.int64)
        pos = np.searchsorted(self.ids, lid)
        pos_c = np.minimum(pos, self.ids.size - 1)
        found = self.ids[pos_c] == lid
        return np.where(found, pos_c, self.ids.size)


def build_location_table(flags, longitude, latitude, location_ids=None,
                         flag_names=None,
                         constants: FeatureConstants | None = None) -> LocationTable:
    """Location type flags (L, F), standardized longitude/latitude (with ``constants``;
    None: z-scored over the listed locations, uncharged), unknown flag."""
    flags = np.asarray(flags)
    if flags.ndim == 1:
        flags = flags[:, None]
    n_loc = flags.shape[0]
    lon = _person_array("longitude", longitude, n_loc).astype(np.float64)
    lat = _person_array("latitude", latitude, n_loc).astype(np.float64)
    ids = (np.arange(n_loc, dtype=np.int64) if location_ids is None
           else np.asarray(location_ids, dtype=np.int64))
    if ids.shape != (n_loc,):
        raise DataError(f"location_ids must have shape ({n_loc},), got {ids.shape}")
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    if n_loc > 1 and np.any(ids[1:] == ids[:-1]):
        dup = ids[1:][ids[1:] == ids[:-1]][0]
        raise DataError("a location id appears more than once in the location table; "
                        "merge duplicate locations first")
    f = flags.shape[1]
    fnames = tuple(flag_names) if flag_names is not None else (
        DEFAULT_LOCATION_FLAGS if f == len(DEFAULT_LOCATION_FLAGS) else
        tuple(f"flag{i}" for i in range(f)))
    if len(fnames) != f:
        raise DataError(f"{len(fnames)} location flag names for {f} flag columns")
    table = np.zeros((n_loc + 1, f + 3), dtype=np.float32)
    table[:n_loc, :f] = flags[order]
    if constants is None:
        lon_z, lat_z = _zscore(lon), _zscore(lat)
    else:
        lon_z = (lon - constants.lon_mean) / constants.lon_std
        lat_z = (lat - constants.lat_mean) / constants.lat_std
    table[:n_loc, f] = lon_z[order]
    table[:n_loc, f + 1] = lat_z[order]
    table[n_loc, f + 2] = 1.0
    names = (*[f"loc_{s}" for s in fnames], "loc_lon", "loc_lat", "loc_unknown")
    return LocationTable(ids=ids, table=table, names=names)


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
            self.edge_stats = _edge_stats(self.index)
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


def _edge_stats(index: NeighbourIndex) -> dict:
    m = index.nbr.shape[0]
    step = max(1, m // _STATS_SAMPLE)
    d = np.log1p(index.duration[::step].astype(np.float64))
    c = np.log1p(index.n_contacts[::step].astype(np.float64))
    dm, ds = _mean_std(d)
    cm, cs = _mean_std(c)
    return {"dur_mean": dm, "dur_std": ds, "cnt_mean": cm, "cnt_std": cs}


def build_neighbourhood_features(
        *, src, dst, num_nodes: int, start_time, duration, lid,
        age, sex, household_size, activities, frac_out_of_home, states,
        location_flags, longitude, latitude, location_ids=None,
        S: int = 20, t_window: int = 21, t_pred: int = T_PRED, seed: int = 0,
        priority: Priority = "random", hops: int = 1, hop2_neighbours: int | None = None,
        graph_features: bool = False, pagerank_iterations: int = 20, activity_names=None,
        location_flag_names=None,
        constants: "FeatureConstants | str | Callable[[NeighbourIndex], FeatureConstants]"
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
