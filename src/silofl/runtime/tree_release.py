"""A released tree ensemble on disk: its files, its model card and its manifest, in the
run-directory format `silofl.experiments.artifacts` loads (``models/<label>/``; the
layout: `silofl.experiments.tree_saving`). One builder for both writers: `silofl run`
(`experiments.tree_saving`) and the networked silo and server
(`runtime.network.gbdt_release`), so a card states the same fields wherever the trees
were grown.

Writing is post-processing of released trees: it reads no rows and charges nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from silofl._version import FORMAT, FORMAT_VERSION, silofl_version
from silofl.errors import DataError
from silofl.io import dumps_strict, file_hashes, write_bytes_atomic
from silofl.models.trees import Tree, TreeEnsemble, xgboost_feature_names, xgboost_name_map
from silofl.privacy.targets import ADJACENCY, ASSUMPTIONS

#: the model spec of a tree run's manifest (`artifacts.SavedRun.predictor` reads "name")
TREES = "trees"
#: the pseudo-silo name of a shared model (`predict --silo shared`; `network.release`)
SHARED = "shared"
#: what a silo's personal leaves cost (gbdt_personal: its own released leaf sums, reused)
PERSONAL_FREE = ("free: personal leaves are post-processing of this silo's own noisy leaf "
                 "sums, already released and charged for the shared trees; no extra charge")
LOCAL_TREES = ("charged: each local tree's releases were reserved in this silo's store "
               "before it grew them (included in the epsilon above)")


def ensemble_to_dict(ens: TreeEnsemble) -> dict:
    """The ensemble as plain JSON data (exact: floats round-trip through JSON)."""
    return {"kind": "silofl.TreeEnsemble", "n_features": ens.n_features, "task": ens.task,
            "base_score": float(ens.base_score), "feature_names": ens.feature_names,
            "trees": [{k: getattr(t, k).tolist() for k in
                       ("feature", "threshold", "left", "right", "value")} for t in ens.trees]}


def ensemble_from_dict(d: dict) -> TreeEnsemble:
    """The inverse of `ensemble_to_dict`; DataError for anything else."""
    if not isinstance(d, dict) or d.get("kind") != "silofl.TreeEnsemble":
        raise DataError("not a silofl tree ensemble file (kind 'silofl.TreeEnsemble')")
    trees = [Tree(np.array(t["feature"], np.int32), np.array(t["threshold"], np.float64),
                  np.array(t["left"], np.int32), np.array(t["right"], np.int32),
                  np.array(t["value"], np.float64)) for t in d["trees"]]
    return TreeEnsemble(int(d["n_features"]), d["task"], float(d["base_score"]), trees,
                        d.get("feature_names"))


def write_ensemble(d: Path, stem: str, ens: TreeEnsemble) -> dict[str, str]:
    """Write ``<stem>.trees.json`` (exact) and ``<stem>.xgb.json`` (XGBoost's format).

    Parameters
    ----------
    d : Path
        The method's folder (``models/<label>``).
    stem : str
        File name stem, e.g. ``model-<silo id>`` or ``shared``.
    ens : TreeEnsemble
        The ensemble.

    Returns
    -------
    dict
        {"params": file name, "xgboost": file name}.
    """
    files = {"params": f"{stem}.trees.json", "xgboost": f"{stem}.xgb.json"}
    write_bytes_atomic(d / files["params"], dumps_strict(ensemble_to_dict(ens)).encode())
    write_bytes_atomic(d / files["xgboost"], dumps_strict(ens.to_xgboost_json()).encode())
    return files


def bins_source(bins: str | None) -> str:
    """Where the bins' edges came from, in words ([trees] bins)."""
    if bins == "private":
        return ("private quantiles: each silo's noisy fine histogram over the declared "
                "bounds, charged (training.private_bins)")
    return "declared schema bounds after preprocessing (public; never from the data)"


def personal_note(method: dict) -> str:
    """What a silo's saved model is: shared, + personal leaves, + local trees."""
    shrink = method.get("shrink") not in (None, "off")
    if not shrink and not method.get("local_trees"):
        return "the shared ensemble"
    base = (f"the shared trees with this silo's personal leaves (shrink = "
            f"{method['shrink']}, from its own released leaf sums)" if shrink
            else "the shared trees")
    return base + (" plus this silo's own local trees" if method.get("local_trees") else "")


def tree_card(*, silo: str, file_id: str, label: str, method: dict, task: str,
              classes: list | None, n_train: int | None, bounds, preprocessing: dict,
              privacy: dict, sigma: float | None, files: dict, personal: bool = True,
              extra: dict | None = None) -> dict:
    """The model card of one saved tree ensemble (the one builder of every tree card).

    Parameters
    ----------
    silo, file_id : str
        The silo's name ("shared" for the shared ensemble) and its file id.
    label : str
        The method label (folder name).
    method : dict
        ``{"name": "dp_gbdt", <[trees] settings>}``.
    task : str
        "binary" or "regression".
    classes : list or None
        The label's classes (None: regression).
    n_train : int or None
        The silo's training rows (public: see the assumptions); None for "shared".
    bounds : array_like
        (d, 2) the declared per-feature bounds the bins span.
    preprocessing : dict
        feature_names, schema, steps, clip, fill, standardize, order.
    privacy : dict
        The statement of the writer (statement, noise, epsilon, delta, accountant, ...);
        ``privacy_unit`` and ``adjacency`` default to example level.
    sigma : float or None
        σ_k, the noise multiplier of the silo's releases (None: not private, or "shared":
        then ``privacy["silos"]`` states every σ_k).
    files : dict
        The files of this model ({role: name}).
    personal : bool
        Whether the model is the silo's own (False: the shared ensemble).
    extra : dict, optional
        Further top-level fields (e.g. networked, job_hash).

    Returns
    -------
    dict
        The card; its ``privacy`` always states privacy_unit, adjacency, epsilon, sigma,
        bins (source, charged), personal_leaves and the assumptions.
    """
    bins = method.get("bins", "schema")
    shrink = method.get("shrink") not in (None, "off")
    stated = {
        "privacy_unit": privacy.get("privacy_unit", "example"),
        "adjacency": privacy.get("adjacency", ADJACENCY), "epsilon": privacy.get("epsilon"),
        "sigma": sigma,
        "bins": {"mode": bins, "source": bins_source(bins), "charged": bins == "private"},
        "personal_leaves": (PERSONAL_FREE if shrink and personal else
                            "not used" if not shrink else
                            "not in this model (the shared ensemble)"),
        "local_trees": (LOCAL_TREES if personal and method.get("local_trees") else
                        "none in this model")}
    return {"format": FORMAT, "format_version": FORMAT_VERSION,
            "silofl_version": silofl_version(), "kind": "model card", "silo": silo,
            "file_id": file_id, "method": {"label": label, **method},
            "hyperparameters": dict(method), "model": {"name": TREES},
            "task": task, "classes": classes, "n_train": n_train,
            "bins": {"bounds": np.asarray(bounds).tolist(), "source": bins_source(bins)},
            "personal": personal_note(method) if personal else "the shared ensemble",
            "preprocessing": preprocessing,
            "privacy": {**privacy, **stated, "assumptions": list(ASSUMPTIONS)},
            "files": files, **(extra or {})}


def write_card(d: Path, files: dict, card: dict) -> dict[str, str]:
    """Write `card` as ``files["card"]``; returns the SHA-256 of every file in `files`."""
    write_bytes_atomic(d / files["card"],
                       dumps_strict(card, indent=1, ensure_ascii=False).encode())
    return file_hashes(d, files)


def write_manifest(d: Path, *, label: str, method: dict, shared: TreeEnsemble, task: str,
                   classes: list | None, feature_names: list[str], schema: dict | None,
                   silos: list[dict], extra: dict) -> None:
    """Write ``manifest.json`` of a tree folder, the shared ensemble's files with it.

    Parameters
    ----------
    d : Path
        The method's folder.
    label, method, task, classes, feature_names, schema
        As in the cards (schema: `Schema.to_dict()` or None).
    shared : TreeEnsemble
        The shared ensemble (written as ``shared.trees.json`` / ``shared.xgb.json``).
    silos : list of dict
        One entry per saved model: name, file_id, params, xgboost, card, sha256.
    extra : dict
        Further fields (private, noise, notes, run_id, networked, job_hash, ...).
    """
    files = write_ensemble(d, "shared", shared)
    names = shared.feature_names or list(feature_names)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
                "silofl_version": silofl_version(), "method": label, "method_params": method,
                "model": {"name": TREES, "dim": int(shared.n_features),
                          "num_classes": 2 if task == "binary" else 0},
                "task": task, "classes": classes, "feature_names": list(feature_names),
                "input_shape": [int(shared.n_features)],
                "xgboost_feature_names": xgboost_feature_names(names),
                "xgboost_name_map": xgboost_name_map(names), "schema": schema,
                "silos": silos, "shared": files["params"], "shared_xgboost": files["xgboost"],
                "shared_kind": "tree ensemble", "shared_sha256": file_hashes(d, files),
                **extra}
    write_bytes_atomic(d / "manifest.json",
                       dumps_strict(manifest, indent=1, ensure_ascii=False).encode())
