"""The seed's splits: silos by declared age bins, by a categorical feature, or by label.

Each builds blocks of rows from declared (public) bins or categories; which rows fall in
a block is listed as read from the pooled table (``uncharged``) by `splitters`.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from silofl.data.schema import INDICATOR_SUFFIX, ColumnSpec
from silofl.errors import ConfigError, DataError

SEED_SPLITS = ("age_strict", "age_some", "by_category", "by_label")


def check_seed_params(split: str, bins: Sequence[float] | None, label_purity: float,
                      group_size: int, feature: str | int | None, task: str) -> list[float]:
    """Validate the keys of SEED_SPLITS; returns the bin edges as floats ([] if unused)."""
    binned = split in ("age_strict", "age_some")
    if bins is not None and len(bins) and not binned:
        raise ConfigError(f"split_bins applies only to the age_strict and age_some splits, not "
                          f"to {split!r}; remove it")
    if split == "by_label":
        if task == "regression":
            raise ConfigError("the by_label split needs a classification label (one silo per "
                              "class); for a regression label use age_strict on a feature")
        if feature not in (None, ""):
            raise ConfigError("the by_label split forms silos from the label; remove "
                              "split_feature")
        if isinstance(label_purity, bool) or not isinstance(label_purity, (int, float)) or \
                not 0 < label_purity < 1:
            raise ConfigError(f"label_purity must be a number in (0, 1) (the share of each "
                              f"class kept by its own silo; 1 would leave every silo a single "
                              f"class, which a classifier cannot learn from), got "
                              f"{label_purity!r}")
    if split == "age_some" and group_size < 2:
        raise ConfigError(f"the age_some split needs group_size >= 2 (the silos sharing one "
                          f"range), got {group_size}")
    if not binned:
        return []
    if bins is None or isinstance(bins, (str, bytes)) or len(bins) == 0:
        raise ConfigError(f"the {split} split needs bin edges (split_bins / bins=), e.g. "
                          "[0, 40, 60, 120]: public, declared limits, not read from the data")
    if any(isinstance(b, bool) or not isinstance(b, (int, float, np.integer, np.floating))
           for b in bins):
        raise ConfigError(f"split_bins must be a list of numbers, got {list(bins)!r}")
    edges = [float(b) for b in bins]
    if not all(np.isfinite(edges)):
        raise ConfigError(f"split_bins must be finite numbers, got {edges}")
    if len(edges) < 3:
        raise ConfigError(f"split_bins needs at least 3 edges (2 ranges) for the {split} "
                          f"split, got {edges}")
    if any(b >= a for a, b in zip(edges[1:], edges[:-1])):
        raise ConfigError(f"split_bins must be strictly increasing, got {edges}")
    return edges


def seed_blocks(split: str, X: np.ndarray, y: np.ndarray, names: list[str],
                specs: Mapping[int, ColumnSpec], feature: str | int | None, edges: list[float],
                group_size: int, rng: np.random.Generator, min_size: int, classify: bool
                ) -> tuple[list[np.ndarray], list[int], dict[str, Any], list[str]]:
    """(blocks of row indices, silos per block, meta extras, uncharged items) of a
    SEED_SPLITS split. Blocks that are too small or hold one class are refused here, naming
    the block (sizes only, never values)."""
    extra: dict = {}
    if split in ("age_strict", "age_some"):
        j = _numeric_feature(feature, names, specs, split)
        v = X[:, j]
        miss = np.isnan(v)
        out = ~miss & ((v < edges[0]) | (v > edges[-1]))
        if out.any():
            raise DataError(f"{int(out.sum())} row(s) have {names[j]!r} outside split_bins "
                            f"[{edges[0]:g}, {edges[-1]:g}]; widen the outer bin edges (or "
                            "drop those rows)")
        k = np.clip(np.searchsorted(edges, v, side="right") - 1, 0, len(edges) - 2)
        blocks = [np.flatnonzero(~miss & (k == i)) for i in range(len(edges) - 1)]
        values = [f"{names[j]} in [{a:g}, {b:g}{']' if i == len(edges) - 2 else ')'}"
                  for i, (a, b) in enumerate(itertools.pairwise(edges))]
        ranges: list = list(itertools.pairwise(edges))
        sizes = [1] * len(blocks)
        if split == "age_some":
            shared = int(rng.integers(len(blocks)))
            sizes[shared] = group_size
            extra["shared_range"] = shared
        if miss.any():
            blocks.append(np.flatnonzero(miss))
            values.append(f"{names[j]} missing")
            ranges.append(None)
            sizes.append(1)
        extra.update(feature=names[j], bins=list(edges), ranges=ranges)
        what = [f"silo membership by split_bins of {names[j]!r} in the pooled table ({split} "
                "split)" + (", rows missing it gathered in one silo" if miss.any() else "")
                + (", shared range and the dealing of its rows drawn at random"
                   if split == "age_some" else "")]
        hint = "merge or widen the bins (split_bins)"
    elif split == "by_category":
        blocks, values, col = _category_blocks(feature, X, names, specs)
        sizes = [1] * len(blocks)
        extra["feature"] = col
        what = [f"silo membership by the levels of {col!r} in the pooled table (by_category split)"]
        hint = "split on another feature or drop the rare level's rows"
    else:  # by_label
        present = np.unique(y)
        if len(present) < 2:
            raise DataError("the by_label split needs at least two classes in the table")
        blocks = [np.flatnonzero(y == c) for c in present]
        values = [f"label {int(c)}" for c in present]
        sizes = [1] * len(blocks)
        extra["label_classes"] = [int(c) for c in present]
        what = ["silo membership drawn from the pooled labels (by_label split)"]
        hint = "lower min_size"
    extra["values"] = values
    if len(blocks) < 2:
        raise DataError(f"the {split} split gives a single silo here ({values[0]}); nothing "
                        f"to federate: {hint}")
    for b, s, val in zip(blocks, sizes, values):
        if len(b) < s * min_size:
            raise DataError(f"the {split} split gives {s} silo(s) for {val} with only "
                            f"{len(b)} row(s), fewer than min_size={min_size} each; {hint}")
        if classify and split != "by_label" and len(np.unique(y[b])) < 2:
            raise DataError(f"the {split} split gives the silo(s) for {val} a single class; a "
                            f"classifier cannot learn from it: {hint}")
    return blocks, sizes, extra, what


def _numeric_feature(feature: str | int | None, names: list[str],
                     specs: Mapping[int, ColumnSpec], split: str) -> int:
    """Index of a numeric value column for binning, refusing one-hot levels, binary columns
    and missing indicators with the fix."""
    if feature not in (None, "") and str(feature) not in names and \
            any(n.startswith(f"{feature}=") for n in names):
        raise DataError(f"split feature {feature!r} is categorical (one-hot columns "
                        f"{feature}=...); the {split} split bins a numeric feature: use "
                        "by_category for it, or name a numeric feature")
    j = feature_index(feature, names, split)
    spec = specs.get(j)
    if spec is None or spec.kind != "numeric" or names[j].endswith(INDICATOR_SUFFIX):
        kind = spec.kind if spec is not None else "a one-hot level or missing indicator"
        raise DataError(f"split feature {names[j]!r} is not numeric ({kind}); the {split} "
                        "split cuts a numeric feature into split_bins ranges. Use by_category "
                        "for a categorical or binary feature")
    return j


def _category_blocks(feature: str | int | None, X: np.ndarray, names: list[str],
                     specs: Mapping[int, ColumnSpec]) -> tuple[list[np.ndarray], list[str], str]:
    """Rows of each level of a categorical (one-hot ``feature=level`` columns) or binary
    feature; levels with no rows make no silo."""
    if feature in (None, ""):
        raise ConfigError("the by_category split needs the categorical feature to split on "
                          "(feature= / data.split_feature), e.g. 'sex'")
    feature = str(feature)
    group = [j for j, n in enumerate(names) if n.startswith(f"{feature}=")]
    if feature in names:
        j = names.index(feature)
        spec = specs.get(j)
        if spec is None or spec.kind != "binary":
            raise DataError(f"split feature {feature!r} is "
                            f"{'numeric' if spec is not None else 'one level of a one-hot column'}"
                            "; by_category needs a categorical or binary feature (for a "
                            "one-hot column give the column name, e.g. 'sex', not 'sex=Male'; "
                            "for ranges of a numeric feature use age_strict)")
        v = X[:, j]
        masks = [v == 0, v == 1, np.isnan(v)]
        labels = [f"{feature} = 0", f"{feature} = 1", f"{feature} missing"]
    elif group:
        onehot = X[:, group]
        if not np.all(np.nansum(onehot, axis=1) == 1):
            raise DataError(f"the one-hot columns of {feature!r} do not mark exactly one level "
                            "per row; check the encoding")
        level = np.argmax(onehot, axis=1)
        masks = [level == i for i in range(len(group))]
        labels = [names[j] for j in group]
    else:
        feature_index(feature, names, "by_category")  # raises with the nearest name
        raise AssertionError("unreachable")
    keep = [(np.flatnonzero(m), lab) for m, lab in zip(masks, labels) if m.any()]
    return [b for b, _ in keep], [lab for _, lab in keep], feature


def label_parts(y: np.ndarray, blocks: list[np.ndarray], purity: float,
                rng: np.random.Generator) -> list[np.ndarray]:
    """by_label: silo c keeps round(purity * n_c) random rows of class c; each other row of
    class c goes to one of the other silos, uniformly at random."""
    k = len(blocks)
    parts: list[list[np.ndarray]] = [[] for _ in range(k)]
    for c, rows in enumerate(blocks):
        rows = rng.permutation(rows)
        keep = round(purity * len(rows))
        parts[c].append(rows[:keep])
        rest = rows[keep:]
        dest = rng.integers(k - 1, size=len(rest))
        dest = dest + (dest >= c)  # skip the own silo
        for o in range(k):
            parts[o].append(rest[dest == o])
    return [np.sort(np.concatenate(p)) for p in parts]


def feature_index(feature: str | int | None, names: list[str], split: str) -> int:
    """Column index of the split ``feature`` (a name from ``names`` or an index)."""
    if feature is None or feature == "":
        raise ConfigError(f"the {split} split needs the feature to split on (feature= / "
                          f"data.split_feature); features are: {', '.join(names[:40])}")
    if isinstance(feature, (int, np.integer)) and not isinstance(feature, bool):
        if not 0 <= feature < len(names):
            raise DataError(f"feature index {feature} is out of range for {len(names)} features")
        return int(feature)
    if str(feature) in names:
        return names.index(str(feature))
    near = difflib.get_close_matches(str(feature), names, n=1, cutoff=0.5)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise DataError(f"unknown split feature {feature!r}; features (after encoding) are: "
                    f"{', '.join(names[:40])}{', ...' if len(names) > 40 else ''}.{hint}")
