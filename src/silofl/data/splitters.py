"""Turn one labelled table into silos: simulated federations with controlled heterogeneity.

Splits (every one deterministic in `seed`; each silo gets at least `min_size` rows):
  * ``iid`` -- a random partition into near-equal silos (sizes differ by at most one);
  * ``dirichlet`` -- label skew: every class is divided among the silos in proportions
    drawn from Dirichlet(alpha * 1_K) (Hsu et al., 2019). Small alpha puts each class in
    few silos (skewed label histograms), large alpha approaches iid. Classification only;
  * ``quantity`` -- size skew with iid contents: silo sizes are `min_size` plus a
    multinomial share of the rest, with proportions from Dirichlet(alpha * 1_K)
    (``size_law="dirichlet"``) or a power law p_k ∝ (k + 1)^-power assigned to silos in
    random order (``size_law="power"``);
  * ``feature_range`` -- covariate shift: rows sorted by one feature and cut into K
    contiguous blocks of near-equal size (quantiles), cuts moved to the nearest change of
    value so that silo ranges are strictly disjoint: max of silo k < min of silo k + 1;
  * ``shared_range`` -- "some silos share a range": silos form groups of `group_size`
    (the last group smaller if K is not a multiple), every group gets one disjoint value
    range as in ``feature_range`` (sized by its number of silos), and the group's rows are
    dealt at random to its silos, which therefore share the range.

Splits of the Weight Erosion report (seed 003, section 5.2 and its "more to do" list); the
number of silos follows from the definition (``num_silos`` may be left out, or must match):
  * ``age_strict`` -- strict groups by declared bins of a numeric feature: ``bins`` (e.g.
    ``[0, 40, 60, 120]``, public) cut it into ranges [b_i, b_i+1) (the last one closed), one
    silo per range, plus one extra silo holding the rows where the feature is missing (when
    there are any). Rows outside the bins are refused;
  * ``age_some`` -- the same ranges, but one range, drawn at random with the seed, is shared:
    its rows are dealt at random to ``group_size`` silos, every other range (and the
    missing-value rows) goes to one silo alone;
  * ``by_category`` -- one silo per level of a categorical feature (``sex`` for the one-hot
    columns ``sex=...``, or a binary column), the missing level included;
  * ``by_label`` -- label skew: one silo per class; silo c keeps a share ``label_purity`` of
    the class-c rows, the rest are dealt at random to the other silos (so every silo holds
    two classes, which a classifier needs). Classification only.

Every silo's rows are then split into train/test (`test_fraction`) and preprocessed
(`standardize`, `impute`: see `silofl.data.preprocess`). A random split whose silos are too
small or, for classification, hold fewer than two classes in their training part is
redrawn (up to `max_tries` times, deterministically) before giving up with a DataError.

Splitters simulate silos from one pooled table; what they read from it is listed in
``meta["uncharged"]``: the encoding when no schema is given (kinds, levels, classes), the
labels or feature ranges that decide silo membership, the two-class redraws. With a
declared schema (``schema=``) and bounds, preprocessing is declared; where the schema
declares nothing, "auto" uses uncharged per-silo statistics (listed) -- a simulation
convenience, not how real silos should do it.

``meta`` of the returned Federation: "split", "parts" (per silo: (train rows, test rows)
as indices into the input table), "groups" (per silo group id: the range for range
splits, else 0), "ranges" (per silo (lo, hi) of the split feature for range splits: the
silo's own range for feature_range, its group's for shared_range), "feature", "tries".
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from silofl.data.encoding import encode_table
from silofl.data.federation import Federation, Silo, split_indices
from silofl.data.persons import group_split, keep_persons_whole
from silofl.data.preprocess import PreprocessSpec, preprocess_without_budget
from silofl.data.raw import RawFederation
from silofl.data.schema import ColumnSpec, SchemaLike, Task
from silofl.data.seed_splits import (
    SEED_SPLITS,
    check_seed_params,
    feature_index,
    label_parts,
    seed_blocks,
)
from silofl.data.tabular import read_table
from silofl.errors import ConfigError, DataError

SPLITS = ("iid", "dirichlet", "quantity", "feature_range", "shared_range", *SEED_SPLITS)
SIZE_LAWS = ("dirichlet", "power")


# --- partitions: pure functions from (labels or a feature, rng) to row-index arrays ---------

def iid_parts(n: int, num_silos: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Random partition of range(n) into `num_silos` parts of near-equal size."""
    return np.array_split(rng.permutation(n), num_silos)


def dirichlet_parts(y: np.ndarray, num_silos: int, alpha: float,
                    rng: np.random.Generator) -> list[np.ndarray]:
    """Label-skewed partition of range(len(y)): the rows of each class are shuffled and cut
    among the silos in proportions p ~ Dirichlet(alpha * 1_K), independently per class."""
    parts: list[list[np.ndarray]] = [[] for _ in range(num_silos)]
    for c in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == c))
        p = rng.dirichlet(np.full(num_silos, alpha))
        cuts = np.round(np.cumsum(p)[:-1] * len(rows)).astype(int)
        for k, block in enumerate(np.split(rows, cuts)):
            parts[k].append(block)
    return [np.sort(np.concatenate(b)) for b in parts]


def quantity_parts(n: int, num_silos: int, rng: np.random.Generator, *, min_size: int,
                   size_law: str = "dirichlet", alpha: float = 1.0,
                   power: float = 1.0) -> list[np.ndarray]:
    """Random partition of range(n) with skewed sizes: min_size + Multinomial(n - K*min_size, p),
    p ~ Dirichlet(alpha * 1_K) or p_k ∝ (k + 1)^-power in random silo order."""
    if size_law == "dirichlet":
        p = rng.dirichlet(np.full(num_silos, alpha))
    else:
        p = rng.permutation((np.arange(num_silos) + 1.0) ** -power)
        p = p / p.sum()
    sizes = min_size + rng.multinomial(n - num_silos * min_size, p)
    return np.split(rng.permutation(n), np.cumsum(sizes)[:-1])


def range_parts(values: np.ndarray, weights: Sequence[int], *, feature: str = "feature",
                min_sizes: Sequence[int] | None = None) -> list[np.ndarray]:
    """Partition range(len(values)) into len(weights) blocks of increasing, strictly disjoint
    value ranges; block j gets about n * weights[j] / sum(weights) rows (quantile cuts moved
    to the nearest change of value so equal values never straddle two blocks)."""
    n = len(values)
    order = np.argsort(values, kind="stable")
    sv = values[order]
    change = np.flatnonzero(sv[1:] > sv[:-1]) + 1  # positions c with sv[c-1] < sv[c]
    targets = np.round(np.cumsum(weights)[:-1] / np.sum(weights) * n).astype(int)
    if len(change) < len(targets):
        raise DataError(f"feature {feature!r} has only {len(change) + 1} distinct value(s), too "
                        f"few for {len(weights)} disjoint ranges; use fewer silos (or a larger "
                        "group_size) or split on another feature")
    cuts: list[int] = []
    for t in targets:  # nearest unused value change at or after the previous cut
        avail = change[change > (cuts[-1] if cuts else 0)]
        if len(avail) == 0:
            break
        i = int(np.searchsorted(avail, t))
        near = [avail[j] for j in (i - 1, i) if 0 <= j < len(avail)]
        cuts.append(min(near, key=lambda c: (abs(c - t), c)))
    blocks = np.split(order, cuts)
    sizes = [len(b) for b in blocks]
    need = list(min_sizes) if min_sizes is not None else [1] * len(weights)
    if len(blocks) < len(weights) or any(s < m for s, m in zip(sizes, need)):
        raise DataError(f"feature {feature!r} cannot be cut into {len(weights)} disjoint value "
                        f"ranges with enough rows each (got block sizes {sizes}, need at least "
                        f"{need}): many rows share a few values. Use fewer silos, a smaller "
                        "min_size, or another feature")
    return blocks


# --- from arrays / tables to a federation ----------------------------------------------------

def split_arrays_raw(X: np.ndarray, y: np.ndarray, split: str, *, num_silos: int | None,
                     task: Task,
                     num_classes: int = 0, feature_names: Sequence[str] | None = None,
                     specs: Mapping[int, ColumnSpec] | None = None,
                     alpha: float = 0.5, size_law: str = "dirichlet", power: float = 1.0,
                     feature: str | int | None = None, group_size: int = 2,
                     bins: Sequence[float] | None = None, label_purity: float = 0.8,
                     min_size: int = 10, test_fraction: float = 0.2, seed: int = 0,
                     max_tries: int = 100, name: str = "split",
                     uncharged: Sequence[str] = (),
                     persons: np.ndarray | None = None) -> RawFederation:
    """Split X (n, d) float, y (n,) into a RawFederation of `num_silos` silos named
    ``silo-00``.. (see the module docstring for the splits and ``meta``), before
    preprocessing. `task` is "binary", "multiclass" or "regression"; for classification y
    holds ids 0..C-1. `feature` (range splits) is a feature name from `feature_names` or a
    column index. `specs` {column index: ColumnSpec} declares the value columns (what
    preprocessing may act on; NaN only in nullable ones); without it every column is a
    numeric value column without bounds, nullable where the pooled arrays hold NaN (listed
    as uncharged). `uncharged` are items read earlier (e.g. by `table_arrays`). `bins`
    (age_strict, age_some) are the declared bin edges; `label_purity` (by_label) the share
    of each class kept by its own silo; `num_silos` may be None for the splits whose silo
    count follows from the data (SEED_SPLITS). `persons` (n,): the person of each row; each
    person's rows then go to one silo (the one the split gave most of them,
    `silofl.data.persons.keep_persons_whole`) and to one side of its train/test split
    (`group_split`), and the silos carry ``person_train``/``person_test``."""
    X = np.asarray(X, dtype=np.float64)
    names = [str(f) for f in feature_names] if feature_names is not None else \
        [f"x{j}" for j in range(X.shape[1] if X.ndim == 2 else 0)]
    _check_params(split, num_silos, task, alpha, size_law, power, group_size, min_size, max_tries)
    edges = check_seed_params(split, bins, label_purity, group_size, feature, task)
    items = list(uncharged)
    y, specs, gaps = _checked_arrays(X, np.asarray(y), names, specs, items, split, num_silos,
                                     min_size, task)
    classify = task != "regression"
    num_classes = max(num_classes, int(y.max()) + 1) if classify else 0
    rng = np.random.default_rng(seed)
    meta: dict = {"split": split, "num_silos": num_silos, "seed": seed, "min_size": min_size,
                  "test_fraction": test_fraction}
    # None only for SEED_SPLITS (checked above), whose layout gives the count
    count = num_silos or 0
    blocks: list[np.ndarray] = []
    sizes: list[int] = []
    groups = np.zeros(count, dtype=np.int64)
    if split in SEED_SPLITS:
        blocks, sizes, groups = _seed_layout(split, X, y, names, specs, feature, edges,
                                             group_size, rng, min_size, classify, num_silos,
                                             meta, items)
        count = len(groups)
    elif split in ("feature_range", "shared_range"):
        blocks, sizes, groups = _range_layout(split, X, names, feature, gaps, count,
                                              group_size, min_size, meta, items)
    elif split == "dirichlet":
        items.append("silo membership drawn from the pooled labels (dirichlet split)")
    if classify:
        items.append("split redrawn until every silo's training rows hold two classes "
                     "(reads the pooled labels)")

    def draw() -> list[np.ndarray]:
        if split == "iid":
            return iid_parts(X.shape[0], count, rng)
        if split == "dirichlet":
            return dirichlet_parts(y, count, alpha, rng)
        if split == "quantity":
            return quantity_parts(X.shape[0], count, rng, min_size=min_size,
                                  size_law=size_law, alpha=alpha, power=power)
        if split == "feature_range":
            return blocks
        if split == "by_label":
            return label_parts(y, blocks, label_purity, rng)
        return [b[part] for b, s in zip(blocks, sizes)
                for part in iid_parts(len(b), s, rng)]

    if persons is not None:
        persons = _checked_persons(persons, X.shape[0])
        meta["split_by"] = "person (each person's rows in one silo and on one side)"
        items.append("silo membership of each person follows where the split put most of "
                     "their rows (reads the pooled person ids)")
    rows, tries = _draw_valid(draw, y, split, count, classify, min_size, test_fraction,
                              max_tries, rng, persons, seed)
    silos = [Silo(f"silo-{k:02d}", X[tr], y[tr], X[te], y[te],
                  person_train=None if persons is None else persons[tr],
                  person_test=None if persons is None else persons[te])
             for k, (tr, te) in enumerate(rows)]
    meta.update(parts=rows, groups=groups, tries=tries)
    return RawFederation(silos, names, task, num_classes=num_classes, specs=specs, name=name,
                         meta=meta, uncharged=items, simulated=True)


def _checked_persons(persons: np.ndarray, n: int) -> np.ndarray:
    """(n,) person ids, or a DataError naming the mismatch."""
    persons = np.asarray(persons)
    if persons.shape != (n,):
        raise DataError(f"persons has shape {persons.shape} but X has {n} rows; give one "
                        "person id per row")
    return persons


def _checked_arrays(X: np.ndarray, y_in: np.ndarray, names: list[str],
                    specs: Mapping[int, ColumnSpec] | None, items: list[str],
                    split: str, num_silos: int | None, min_size: int,
                    task: str) -> tuple[np.ndarray, dict, np.ndarray]:
    """Refuse malformed arrays; returns y (int64 class ids or float64), the column specs
    (declared, or numeric and nullable where the pooled arrays hold NaN, then listed in
    ``items`` as uncharged) and the (d,) mask of columns with missing values."""
    y = y_in
    if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0]:
        raise DataError(f"split_arrays needs X of shape (n, d) and y of shape (n,), got X "
                        f"{X.shape} and y {y.shape}")
    if len(names) != X.shape[1]:
        raise DataError(f"feature_names has {len(names)} names but X has {X.shape[1]} columns")
    gaps = np.isnan(X).any(axis=0)
    if specs is None:
        specs = {j: ColumnSpec(n, "numeric", nullable=bool(gaps[j])) for j, n in enumerate(names)}
        if gaps.any():
            items.append("missing-value columns (" + ", ".join(repr(names[j]) for j in
                                                              np.flatnonzero(gaps))
                         + ") found in the pooled arrays")
    specs = dict(specs)
    nullable = np.array([j in specs and specs[j].nullable for j in range(len(names))], bool)
    if np.isinf(X).any() or (gaps & ~nullable).any() or \
            not np.all(np.isfinite(y.astype(np.float64))):
        raise DataError("X or y holds NaN/inf values outside nullable value columns; impute "
                        "or drop them before splitting")
    n = X.shape[0]
    if num_silos is not None and split not in SEED_SPLITS and num_silos * min_size > n:
        raise DataError(f"too many silos for the data: {num_silos} silos x min_size {min_size} "
                        f"rows = {num_silos * min_size} > {n} rows; lower num_silos (at most "
                        f"{n // min_size}) or min_size")
    classify = task != "regression"
    y = y.astype(np.int64) if classify else y.astype(np.float64)
    if classify and (y.min() < 0 or not np.array_equal(y, np.asarray(y_in, np.float64))):
        raise DataError("classification labels must be integer class ids 0..C-1; map them first "
                        "(split_frame / table_arrays do this for a table)")
    return y, specs, gaps


#: blocks of row indices, silos per block, and each silo's block
_Layout = tuple[list[np.ndarray], list[int], np.ndarray]


def _seed_layout(split: str, X: np.ndarray, y: np.ndarray, names: list[str],
                 specs: Mapping[int, ColumnSpec], feature: str | int | None, edges: list[float],
                 group_size: int, rng: np.random.Generator, min_size: int, classify: bool,
                 num_silos: int | None, meta: dict, items: list[str]) -> _Layout:
    """Blocks, silos per block and each silo's block of a SEED_SPLITS split (meta, items
    updated)."""
    blocks, sizes, extra, what = seed_blocks(split, X, y, names, specs, feature, edges,
                                             group_size, rng, min_size, classify)
    groups = np.repeat(np.arange(len(sizes)), sizes)
    if num_silos is not None and num_silos != len(groups):
        raise ConfigError(f"the {split} split makes {len(groups)} silos here, but "
                          f"num_silos = {num_silos}; leave num_silos out (its silo count "
                          "follows from the definition)")
    meta["num_silos"] = len(groups)
    meta.update(extra)
    meta["values"] = [extra["values"][g] for g in groups]
    if "ranges" in extra:
        meta["ranges"] = [extra["ranges"][g] for g in groups]
    items.extend(what)
    return blocks, sizes, groups


def _range_layout(split: str, X: np.ndarray, names: list[str], feature: str | int | None,
                  gaps: np.ndarray, num_silos: int, group_size: int, min_size: int,
                  meta: dict, items: list[str]) -> _Layout:
    """Blocks of value ranges of one feature (feature_range: one silo each; shared_range:
    ``group_size`` silos share one), with silos per block and each silo's block."""
    j = feature_index(feature, names, split)
    meta["feature"] = names[j]
    if gaps[j]:
        raise DataError(f"split feature {names[j]!r} has missing values; split on a "
                        "complete feature or drop those rows (missing='drop')")
    if split == "feature_range":
        sizes = [1] * num_silos
    else:
        sizes = [len(g) for g in np.array_split(np.arange(num_silos),
                                                -(-num_silos // group_size))]
    groups = np.repeat(np.arange(len(sizes)), sizes)
    blocks = range_parts(X[:, j], sizes, feature=names[j],
                         min_sizes=[s * min_size for s in sizes])
    ranges = [(float(X[b, j].min()), float(X[b, j].max())) for b in blocks]
    meta["ranges"] = [ranges[g] for g in groups]
    items.append(f"silo membership by value ranges of {names[j]!r} in the pooled table "
                 f"({split} split)")
    return blocks, sizes, groups


#: what to change when a split keeps failing its checks
_RETRY_HINTS = {
    "dirichlet": "raise alpha, lower num_silos or min_size",
    "by_label": "lower label_purity (more rows of other classes per silo) or min_size",
    "age_some": "use fewer sharing silos (group_size) or wider bins",
    "feature_range": "use fewer silos or another feature (this one separates the classes)",
}


def _draw_valid(draw: Callable[[], list[np.ndarray]], y: np.ndarray, split: str,
                num_silos: int, classify: bool, min_size: int, test_fraction: float,
                max_tries: int, rng: np.random.Generator, persons: np.ndarray | None = None,
                seed: int = 0) -> tuple[list, int]:
    """Draw partitions until every silo has ``min_size`` rows and (classification) two
    classes in its training rows; returns the (train, test) row indices per silo and the
    number of draws. With `persons`, each person's rows are moved to one silo and split
    by person before the checks."""
    def check(parts: list[np.ndarray]) -> tuple[list, str]:
        if persons is not None:
            parts = keep_persons_whole(parts, persons)
        small = [k for k, p in enumerate(parts) if len(p) < min_size]
        if small:
            return [], (f"silo(s) {small[:5]} got fewer than min_size={min_size} rows "
                        f"(smallest sizes {sorted(len(p) for p in parts)[:5]})")
        rows = []
        for p in parts:
            tr, te = split_indices(len(p), test_fraction, rng) if persons is None else \
                group_split(persons[p], test_fraction, seed)
            rows.append((p[tr], p[te]))
        single = [k for k, (tr, _) in enumerate(rows) if classify and len(np.unique(y[tr])) < 2]
        if single:
            return [], f"silo(s) {single[:5]} hold a single class in their training rows"
        return rows, ""

    for tries in range(1, max_tries + 1):
        rows, problem = check(draw())
        if not problem:
            return rows, tries
    hint = _RETRY_HINTS.get(split, "use fewer, larger silos (lower num_silos)")
    raise DataError(f"the {split} split into {num_silos} silos failed in {max_tries} "
                    f"random draw(s): {problem}; {hint}")


def split_arrays(X: np.ndarray, y: np.ndarray, split: str, *, num_silos: int | None,
                 task: Task,
                 num_classes: int = 0, feature_names: Sequence[str] | None = None,
                 specs: Mapping[int, ColumnSpec] | None = None,
                 alpha: float = 0.5, size_law: str = "dirichlet", power: float = 1.0,
                 feature: str | int | None = None, group_size: int = 2,
                 bins: Sequence[float] | None = None, label_purity: float = 0.8,
                 min_size: int = 10,
                 test_fraction: float = 0.2, seed: int = 0, standardize: str | bool = "auto",
                 impute: str = "auto", max_tries: int = 100, name: str = "split",
                 uncharged: Sequence[str] = ()) -> Federation:
    """`split_arrays_raw`, then preprocessing without a budget (`standardize`, `impute`:
    modes of `silofl.data.preprocess`; simulated silos, so "auto" falls back to uncharged
    per-silo statistics where nothing is declared, listed in ``meta["uncharged"]``). Pass
    the ``info["uncharged"]`` of `table_arrays` as `uncharged` so reports list them too."""
    raw = split_arrays_raw(X, y, split, num_silos=num_silos, task=task,
                           num_classes=num_classes, feature_names=feature_names, specs=specs,
                           alpha=alpha, size_law=size_law, power=power, feature=feature,
                           group_size=group_size, bins=bins, label_purity=label_purity,
                           min_size=min_size,
                           test_fraction=test_fraction, seed=seed, max_tries=max_tries,
                           name=name, uncharged=uncharged)
    return preprocess_without_budget(raw, PreprocessSpec.of(standardize, impute), "split_arrays")


def table_arrays(df: pd.DataFrame, label_column: str, *, schema: SchemaLike | None = None,
                 task: str = "auto",
                 features: Sequence[str] | None = None, missing: str = "impute",
                 categorical_max_levels: int = 50,
                 person_column: str | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """Encode a whole table like `federation_from_frame` does (by `schema`, or read from
    the table itself), with no split and no statistic. Returns (X (n, d) float64 in the
    table's row order minus dropped rows, NaN where a nullable value is missing; y (n,);
    info) with info = {"feature_names", "task", "num_classes", "classes", "dropped",
    "rows" (n,) the table row of each row, "specs" {column index: ColumnSpec} of the value
    columns, "uncharged" (what was read from the pooled table), "schema", "persons" ((n,)
    person ids of `person_column`, or None)}."""
    enc = encode_table(df, label_column, schema=schema, task=task, features=features,
                       missing=missing, categorical_max_levels=categorical_max_levels,
                       person_column=person_column)
    label = enc.schema.label
    info = {"feature_names": enc.schema.feature_names, "task": label.kind,
            "num_classes": len(label.classes),
            "classes": list(label.classes) if label.kind != "regression" else None,
            "dropped": enc.dropped, "rows": enc.rows, "specs": enc.specs,
            "uncharged": list(enc.uncharged), "schema": enc.schema, "persons": enc.persons}
    return enc.X, enc.y, info


def split_frame_raw(df: pd.DataFrame, label_column: str, split: str, *,
                    schema: SchemaLike | None = None,
                    task: str = "auto", features: Sequence[str] | None = None,
                    missing: str = "impute", name: str = "table",
                    person_column: str | None = None, **split_kw: Any) -> RawFederation:
    """Encode a table (see `table_arrays`) and split it (see `split_arrays_raw`; `split_kw`
    are its keyword arguments: num_silos, alpha, feature, ...), before preprocessing.
    `person_column`: each person's rows stay in one silo and on one side."""
    X, y, info = table_arrays(df, label_column, schema=schema, task=task, features=features,
                              missing=missing, person_column=person_column)
    raw = split_arrays_raw(X, y, split, task=info["task"], num_classes=info["num_classes"],
                           feature_names=info["feature_names"], specs=info["specs"],
                           uncharged=info["uncharged"], name=name, persons=info["persons"],
                           **split_kw)
    if person_column:
        raw.meta["person_column"] = str(person_column)
    raw.meta.update(label_column=label_column, missing=missing, dropped=info["dropped"],
                    schema=info["schema"].source if not info["schema"].drafted
                    else "read from the data")
    if info["classes"] is not None:
        raw.meta["classes"] = info["classes"]
    return raw


def split_frame(df: pd.DataFrame, label_column: str, split: str, *,
                schema: SchemaLike | None = None,
                task: str = "auto", features: Sequence[str] | None = None,
                missing: str = "impute", name: str = "table", standardize: str | bool = "auto",
                impute: str = "auto", **split_kw: Any) -> Federation:
    """`split_frame_raw`, then preprocessing without a budget (see `split_arrays`)."""
    raw = split_frame_raw(df, label_column, split, schema=schema, task=task,
                          features=features, missing=missing, name=name, **split_kw)
    return preprocess_without_budget(raw, PreprocessSpec.of(standardize, impute), "split_frame")


def split_table_raw(path: str | Path, label_column: str, split: str,
                    read_options: dict | None = None, **kw: Any) -> RawFederation:
    """Read a CSV/Parquet file (see `silofl.data.tabular.read_table`; `read_options`: its
    sep, encoding and drop) and `split_frame_raw` it (person ids read as exact text)."""
    person = kw.get("person_column")
    raw = split_frame_raw(read_table(path, text_columns=[person] if person else (),
                                     **(read_options or {})), label_column, split,
                          name=Path(path).name.split(".")[0], **kw)
    raw.meta["source"] = str(path)
    return raw


def split_table(path: str | Path, label_column: str, split: str, *,
                standardize: str | bool = "auto", impute: str = "auto",
                **kw: Any) -> Federation:
    """Read one table without a silo column and cut it into simulated silos.

    Parameters
    ----------
    path : str or Path
        A CSV (``.csv``, ``.csv.gz``) or Parquet file.
    label_column : str
        The target column.
    split : str
        How to cut it: one of ``silofl.data.SPLITS`` ("iid", "dirichlet", "quantity",
        "feature_range", "shared_range", "age_strict", "age_some", "by_category",
        "by_label").
    standardize : str or bool, default "auto"
        Feature scaling mode (see `load_table`).
    impute : str, default "auto"
        Missing-value mode (see `load_table`).
    **kw
        `split_frame_raw`'s options (schema, task, features, missing, read_options) and
        the splitter's (num_silos, alpha, feature, seed, test_fraction, ...).

    Returns
    -------
    Federation
        The simulated silos, X (n_k, d) float64, y (n_k,).

    Raises
    ------
    DataError, ConfigError
        An unreadable table or an invalid split setting.
    """
    raw = split_table_raw(path, label_column, split, **kw)
    return preprocess_without_budget(raw, PreprocessSpec.of(standardize, impute), "split_table")


# --- validation ------------------------------------------------------------------------------

def _check_params(split: str, num_silos: int | None, task: str, alpha: float, size_law: str,
                  power: float, group_size: int, min_size: int, max_tries: int) -> None:
    if split not in SPLITS:
        near = difflib.get_close_matches(str(split), SPLITS, n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}.{hint}")
    if num_silos is None and split not in SEED_SPLITS:
        raise ConfigError(f"the {split} split needs num_silos")
    for key, v, lo in ((("num_silos", num_silos, 1),) if num_silos is not None else ()) + (
                       ("min_size", min_size, 2),
                       ("group_size", group_size, 1), ("max_tries", max_tries, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ConfigError(f"{key} must be an integer >= {lo}, got {v!r}")
    if not (isinstance(alpha, (int, float)) and np.isfinite(alpha) and alpha > 0):
        raise ConfigError(f"alpha must be a positive number (Dirichlet concentration: small = "
                          f"skewed, large = near-uniform), got {alpha!r}")
    if size_law not in SIZE_LAWS:
        raise ConfigError(f"size_law must be one of {', '.join(SIZE_LAWS)}, got {size_law!r}")
    if not (isinstance(power, (int, float)) and np.isfinite(power) and power >= 0):
        raise ConfigError(f"power must be a number >= 0 (0 = equal sizes), got {power!r}")
    if split == "dirichlet" and task == "regression":
        raise ConfigError("the dirichlet split skews class labels and needs a classification "
                          "task; for regression use iid, quantity, feature_range or shared_range")
    if task not in ("binary", "multiclass", "regression"):
        raise ConfigError(f"task must be binary, multiclass or regression, got {task!r}")


