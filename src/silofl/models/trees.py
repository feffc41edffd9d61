"""Tree ensembles (gradient-boosted regression trees) as plain NumPy arrays, and their
export to XGBoost's JSON model format.

A tree is five parallel arrays over its nodes in breadth-first order: `feature` (int32,
−1 at a leaf), `threshold` (float64; a row goes left when ``x[feature] < threshold``),
`left` / `right` (int32 child indices, −1 at a leaf) and `value` (float64, the leaf's
contribution to the margin; 0 at inner nodes). The ensemble's margin is
``base_score + Σ_trees value[leaf(x)]``; binary tasks map it through the sigmoid.

XGBoost compares in float32 (``float32(x) < float32(threshold)``): thresholds built by
`silofl.training.histograms.bin_edges` are float32-representable, so float32 inputs route
identically in both libraries, and margins agree to float32 rounding of the leaf values
(about 1e-6 relative).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from silofl.errors import DataError
from silofl.io import write_json_atomic

#: XGBoost's "no parent" marker for the root (its JSON schema: uint32 max >> 1)
_XGB_NO_PARENT = 2147483647
TASKS = ("binary", "regression")


@dataclass
class Tree:
    """One binary regression tree, nodes in breadth-first order (root = 0).

    Parameters
    ----------
    feature : numpy.ndarray
        (m,) int32 split feature per node; −1 at a leaf.
    threshold : numpy.ndarray
        (m,) float64; a row goes left when ``x[feature] < threshold`` (unused at leaves).
    left, right : numpy.ndarray
        (m,) int32 child indices; −1 at a leaf.
    value : numpy.ndarray
        (m,) float64 leaf values in margin units (shrinkage already applied); 0 inside.
    slot : numpy.ndarray, optional
        (m,) int32: at a leaf, its slot 0..2^D − 1 in the complete tree it was compacted
        from (`from_complete`; the index of the per-leaf sums a silo released), −1 inside.
    """

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray
    slot: np.ndarray | None = field(default=None, compare=False)

    @property
    def n_nodes(self) -> int:
        return int(self.feature.shape[0])

    @property
    def depth(self) -> int:
        """Longest root-to-leaf path, in edges."""
        depth = np.zeros(self.n_nodes, dtype=np.int64)
        for i in range(self.n_nodes):  # breadth-first: parents come before children
            if self.feature[i] >= 0:
                depth[self.left[i]] = depth[self.right[i]] = depth[i] + 1
        return int(depth.max())

    def apply(self, X: np.ndarray) -> np.ndarray:
        """(n,) int64: the leaf each row of X (n, d) lands in."""
        node = np.zeros(X.shape[0], dtype=np.int64)
        rows = np.arange(X.shape[0])
        for _ in range(self.depth):
            f = self.feature[node]
            inner = f >= 0
            go_left = X[rows, np.where(inner, f, 0)] < self.threshold[node]
            node = np.where(inner, np.where(go_left, self.left[node], self.right[node]), node)
        return node

    @classmethod
    def from_complete(cls, feature: np.ndarray, threshold: np.ndarray,
                      value: np.ndarray) -> Tree:
        """Compact a complete tree in heap layout (children of i at 2i+1, 2i+2; depth D,
        2^(D+1) − 1 nodes) whose pass-through nodes (threshold +inf: every row goes left)
        collapse into their left child. Returns the tree in breadth-first order, each leaf
        remembering its heap slot (`slot`)."""
        n_inner = (feature.shape[0] - 1) // 2
        out_f: list[int] = []
        out_t: list[float] = []
        out_l: list[int] = []
        out_r: list[int] = []
        out_v: list[float] = []
        out_s: list[int] = []

        def resolve(i: int) -> int:  # skip pass-through nodes (every row goes left)
            while i < n_inner and not np.isfinite(threshold[i]):
                i = 2 * i + 1
            return i

        queue = [resolve(0)]
        for i in queue:  # the queue grows as children are appended: breadth-first order
            if i < n_inner:
                kids = [resolve(2 * i + 1), resolve(2 * i + 2)]
                out_f.append(int(feature[i]))
                out_t.append(float(threshold[i]))
                out_l.append(len(queue))
                out_r.append(len(queue) + 1)
                out_v.append(0.0)
                out_s.append(-1)
                queue.extend(kids)
            else:
                out_f.append(-1)
                out_t.append(0.0)
                out_l.append(-1)
                out_r.append(-1)
                out_v.append(float(value[i]))
                out_s.append(i - n_inner)
        return cls(np.array(out_f, dtype=np.int32), np.array(out_t, dtype=np.float64),
                   np.array(out_l, dtype=np.int32), np.array(out_r, dtype=np.int32),
                   np.array(out_v, dtype=np.float64), np.array(out_s, dtype=np.int32))

    def _xgb_dict(self, tree_id: int, n_features: int) -> dict:
        m = self.n_nodes
        leaf = self.feature < 0
        parents = np.full(m, _XGB_NO_PARENT, dtype=np.int64)
        inner = np.flatnonzero(~leaf)
        parents[self.left[inner]] = inner
        parents[self.right[inner]] = inner
        cond = np.where(leaf, self.value, self.threshold)
        return {"base_weights": [float(v) for v in self.value],
                "categories": [], "categories_nodes": [], "categories_segments": [],
                "categories_sizes": [], "default_left": [0] * m, "id": tree_id,
                "left_children": [int(v) for v in self.left],
                "loss_changes": [0.0] * m, "parents": [int(v) for v in parents],
                "right_children": [int(v) for v in self.right],
                "split_conditions": [float(v) for v in cond],
                "split_indices": [int(v) for v in np.where(leaf, 0, self.feature)],
                "split_type": [0] * m, "sum_hessian": [0.0] * m,
                "tree_param": {"num_deleted": "0", "num_feature": str(n_features),
                               "num_nodes": str(m), "size_leaf_vector": "1"}}


@dataclass
class TreeEnsemble:
    """Gradient-boosted trees: margin = base_score + Σ_t tree_t(x).

    Parameters
    ----------
    n_features : int
        d, the number of input columns.
    task : {"binary", "regression"}
        Binary: `predict` gives P(y = 1) = sigmoid(margin); regression: the margin.
    base_score : float
        The starting margin (log-odds for binary), public.
    trees : list of Tree
    feature_names : list of str, optional
        Column names (exported to XGBoost when given).
    """

    n_features: int
    task: str = "binary"
    base_score: float = 0.0
    trees: list[Tree] = field(default_factory=list)
    feature_names: list[str] | None = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise DataError(f"TreeEnsemble task {self.task!r} is not supported; use one of "
                            f"{TASKS} (multiclass trees are not implemented)")

    def _check_X(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise DataError(f"X must have shape (n, {self.n_features}), got {X.shape}")
        return X

    def predict_margin(self, X: np.ndarray) -> np.ndarray:
        """(n,) float64 margins of the rows of X (n, d)."""
        X = self._check_X(X)
        out = np.full(X.shape[0], float(self.base_score))
        for tree in self.trees:
            out += tree.value[tree.apply(X)]
        return out

    def predict(self, X: np.ndarray) -> np.ndarray:
        """(n,) float64: P(y = 1) for binary tasks, the prediction for regression."""
        m = self.predict_margin(X)
        return 1.0 / (1.0 + np.exp(-m)) if self.task == "binary" else m

    def to_xgboost_json(self) -> dict:
        """The ensemble in XGBoost's JSON model format (schema ``doc/model.schema`` of
        XGBoost; checked against xgboost 3.2), loadable by ``xgboost.Booster``; its
        feature names made XGBoost-safe by `xgboost_feature_names`.

        Returns
        -------
        dict
            The model document; `save_xgboost` writes it to a file.
        """
        d = self.n_features
        if self.task == "binary":  # XGBoost stores base_score in probability units
            base = 1.0 / (1.0 + np.exp(-self.base_score))
            objective = {"name": "binary:logistic", "reg_loss_param": {"scale_pos_weight": "1"}}
        else:
            base = self.base_score
            objective = {"name": "reg:squarederror", "reg_loss_param": {"scale_pos_weight": "1"}}
        T = len(self.trees)
        model = {"gbtree_model_param": {"num_parallel_tree": "1", "num_trees": str(T)},
                 "iteration_indptr": list(range(T + 1)), "tree_info": [0] * T,
                 "trees": [t._xgb_dict(i, d) for i, t in enumerate(self.trees)]}
        names = xgboost_feature_names(self.feature_names) or []
        return {"learner": {
            "attributes": {}, "feature_names": names,
            "feature_types": ["float"] * len(names),
            "gradient_booster": {"model": model, "name": "gbtree"},
            "learner_model_param": {"base_score": f"[{base:.9E}]", "boost_from_average": "0",
                                    "num_class": "0", "num_feature": str(d),
                                    "num_target": "1"},
            "objective": objective}, "version": [3, 2, 0]}

    def save_xgboost(self, path: str | Path) -> Path:
        """Write `to_xgboost_json` to `path` (``.json``); returns the path."""
        path = Path(path)
        write_json_atomic(path, self.to_xgboost_json())
        return path


def xgboost_feature_names(names: list[str] | None) -> list[str] | None:
    """The feature names an XGBoost model file carries: the one place names XGBoost
    rejects are normalised (no ``[``, ``]`` or ``<``: a schema's one-hot name such as
    ``cp=<missing>`` becomes ``cp=(missing)``; ``>`` likewise). If that makes two names
    equal, positional names f0, f1, … instead. Manifests map the originals to these.

    Parameters
    ----------
    names : list of str or None
        The model's column names.

    Returns
    -------
    list of str or None
        As many names as given (None for none).
    """
    if not names:
        return None
    table = str.maketrans({"[": "(", "]": ")", "<": "(", ">": ")"})
    out = [str(n).translate(table) for n in names]
    return out if len(set(out)) == len(out) else [f"f{j}" for j in range(len(out))]


def xgboost_name_map(names: list[str] | None) -> dict[str, str]:
    """{original name: its name in the XGBoost file} (`xgboost_feature_names`), for a
    manifest; empty when the model has no names."""
    safe = xgboost_feature_names(names)
    return {} if not names or safe is None else dict(zip(names, safe, strict=True))
