"""Per-person and per-location feature tables, and the constants that normalize them.

The node table (one float32 row per person: standardized age, sex, Box-Cox household size,
activities, time out of home, optionally graph features) and the location table (activity
flags, standardized coordinates) are computed once per region.  Their normalization
constants (`FeatureConstants`) are declared (public), released privately
(`constants.private_release`) or fit on the region uncharged (`fitted_constants`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np
from scipy import optimize, sparse, special, stats

from silofl.errors import ConfigError, DataError
from silofl.pandemic.graph import ContactPairs, NeighbourIndex, symmetric_csr

DEFAULT_LOCATION_FLAGS = ("work", "shopping", "school", "other", "college", "religion")


_STATS_SAMPLE = 2_000_000


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

    def replace(self, **kw) -> FeatureConstants:
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
                     index: NeighbourIndex) -> FeatureConstants:
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
    e = contact_stats(index)
    return FeatureConstants(age_mean=am, age_std=asd, household_lambda=lam,
                            household_mean=hm, household_std=hs, lon_mean=lo_m,
                            lon_std=lo_s, lat_mean=la_m, lat_std=la_s, source="uncharged",
                            **e)


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


def contact_stats(index: NeighbourIndex) -> dict:
    """Mean and std of log1p(duration) and log1p(contacts) over kept edges (a sample above 2M)."""
    m = index.nbr.shape[0]
    step = max(1, m // _STATS_SAMPLE)
    d = np.log1p(index.duration[::step].astype(np.float64))
    c = np.log1p(index.n_contacts[::step].astype(np.float64))
    dm, ds = _mean_std(d)
    cm, cs = _mean_std(c)
    return {"dur_mean": dm, "dur_std": ds, "cnt_mean": cm, "cnt_std": cs}


class DeclaresConstants(Protocol):
    """What `declared_constants` reads of a configuration (`PandemicConfig`)."""

    declared: dict | None


def declared_constants(cfg: DeclaresConstants) -> FeatureConstants:
    """`tables.DECLARED_CONSTANTS` with ``cfg.declared``'s overrides."""
    extra = dict(cfg.declared or {})
    known = set(DECLARED_CONSTANTS.to_dict()) - {"source"}
    bad = sorted(set(extra) - known)
    if bad:
        raise ConfigError(f"unknown declared constant(s) {', '.join(bad)}; known: "
                          f"{', '.join(sorted(known))}")
    return DECLARED_CONSTANTS.replace(**{k: float(v) for k, v in extra.items()})
