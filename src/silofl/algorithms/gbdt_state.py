"""A DP-GBDT silo program's state between messages, as arrays and JSON data: what a silo
process that starts per message (Flower's SuperNode) keeps on disk, and trees as flat
arrays (the server's checkpoint). Nothing here is released: it stays with its owner.
"""

from __future__ import annotations

import numpy as np

from silofl.algorithms.gbdt_personal import personal_trees
from silofl.algorithms.gbdt_programs import GbdtSilo
from silofl.models.trees import Tree, TreeEnsemble

_TREE_FIELDS = ("feature", "threshold", "left", "right", "value", "slot")
_TREE_TYPES = (np.int32, np.float64, np.int32, np.int32, np.float64, np.int32)


def trees_to_arrays(trees: list[Tree]) -> dict[str, np.ndarray]:
    """Trees as flat arrays (``tree_sizes`` and one concatenated array per field)."""
    out: dict[str, np.ndarray] = {"tree_sizes": np.array([t.n_nodes for t in trees], np.int64)}
    for f in _TREE_FIELDS:  # a tree without leaf slots stores −1 (Tree.slot None)
        out[f"tree_{f}"] = np.concatenate([
            getattr(t, f) if getattr(t, f) is not None else np.full(t.n_nodes, -1, np.int32)
            for t in trees]) if trees else np.zeros(0)
    return out


def trees_from_arrays(arrays: dict[str, np.ndarray]) -> list[Tree]:
    """Inverse of `trees_to_arrays`."""
    sizes = arrays["tree_sizes"]
    if not len(sizes):
        return []
    parts = {f: np.split(arrays[f"tree_{f}"], np.cumsum(sizes)[:-1]) for f in _TREE_FIELDS}
    return [Tree(*(np.asarray(parts[f][i], t) for f, t in
                   zip(_TREE_FIELDS, _TREE_TYPES, strict=True))) for i in range(len(sizes))]


def silo_state(silo: GbdtSilo) -> tuple[dict[str, np.ndarray], dict]:
    """Everything a silo program holds between messages (what a silo process that starts
    per message keeps on disk); `restore_silo` reads it back.

    Parameters
    ----------
    silo : GbdtSilo

    Returns
    -------
    (dict of str to numpy.ndarray, dict)
        Arrays (margins, clipped g/h, node slots, trees, sums, …; for an .npz) and JSON
        data (what it expects next, its seeded stream's position).
    """
    h, trees = silo.hist, silo.ensemble.trees
    arrays = {"margins": silo.margins, **trees_to_arrays(trees),
              "own_sums": np.stack(silo.own_sums) if silo.own_sums else np.zeros((0, 2, 1))}
    if silo.edges is not None and h is not None:  # the bins it took (private or public)
        arrays.update(edges=silo.edges, g=h.g, h=h.h, pos=h.pos,
                      features=np.asarray(h.features, np.int64))
    if silo.open_tree:
        arrays["heap_feature"], arrays["heap_threshold"] = silo.feature, silo.threshold
    exact = getattr(h, "_exact", None) if h is not None else None
    if exact is not None:  # the previous level's exact sums (sibling subtraction)
        arrays["exact_g"], arrays["exact_h"] = exact
    if silo.shared_sums is not None:
        arrays["shared_sums"] = silo.shared_sums
    bit = getattr(silo.rng, "bit_generator", None)  # seeded streams continue; secure: fresh
    meta = {"expect": list(silo.expect), "end": silo.end, "open_tree": silo.open_tree,
            "n_shared": None if silo.shared_ensemble is None
            else len(silo.shared_ensemble.trees),
            "rng": None if bit is None else bit.state, "mu": None if silo.mu is None else str(silo.mu)}
    return arrays, meta


def restore_silo(silo: GbdtSilo, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Put `silo_state`'s arrays and data back into a freshly built silo program.

    Parameters
    ----------
    silo : GbdtSilo
        Built from the same job, data and settings as the one saved.
    arrays, meta
        `silo_state`'s output (read back from disk).
    """
    silo.margins = np.array(arrays["margins"], dtype=np.float64)
    if "edges" in arrays:
        silo.set_edges(np.array(arrays["edges"], np.float64))
        h = silo.hist
        assert h is not None
        h.start_tree(arrays["g"], arrays["h"], np.ones(len(arrays["g"]), bool),
                     arrays["features"])  # g, h are stored clipped: clipping again: no-op
        h.pos = np.array(arrays["pos"], dtype=np.int64)
        if "exact_g" in arrays:
            h._exact = (np.array(arrays["exact_g"]), np.array(arrays["exact_h"]))
    s = silo.s
    silo.ensemble.trees = trees_from_arrays(arrays)
    silo.own_sums = list(np.array(arrays["own_sums"])) if len(arrays["own_sums"]) else []
    if "heap_feature" in arrays:
        silo.feature = np.array(arrays["heap_feature"], np.int32)
        silo.threshold = np.array(arrays["heap_threshold"], np.float64)
    silo.expect = (int(meta["expect"][0]), int(meta["expect"][1]), int(meta["expect"][2]))
    silo.end, silo.open_tree = int(meta["end"]), bool(meta["open_tree"])
    if meta["n_shared"] is not None:
        silo.shared_sums = np.array(arrays["shared_sums"])
        shared = silo.ensemble.trees[:meta["n_shared"]]
        silo.shared_ensemble = TreeEnsemble(s.d, s.task, s.base_score, shared)
        if meta.get("mu") is not None:  # its personal leaves, recomputed (post-processing)
            silo.mu = float(meta["mu"])
            silo.personal_base = TreeEnsemble(s.d, s.task, s.base_score, personal_trees(
                shared, np.stack(silo.own_sums), silo.mu, lr=s.lr, lam=s.lam,
                max_leaf=s.max_leaf, shared_sums=silo.shared_sums))
    if meta["rng"] is not None and hasattr(silo.rng, "bit_generator"):
        silo.rng.bit_generator.state = meta["rng"]
