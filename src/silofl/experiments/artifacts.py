"""The models a run releases, saved in its run directory, and loaded back to predict.

On-disk format (``FORMAT_VERSION`` 1), one folder per method under ``models/``::

    models/<method label>/
        manifest.json         format, method, model spec, schema, feature names, classes,
                              the silos with their file ids and files, privacy notes
        model-<silo id>.npz   params: the silo's personal model as a flat float64 vector
                              (P,); spec: the model spec as a JSON string
        card-<silo id>.json   the silo's model card: method and hyperparameters, the
                              preprocessing it needs (feature names, clip bounds, fills,
                              center/scale), the run id under which the silo's store
                              keeps the data fingerprint, the privacy statement,
                              silofl and format versions
        shared.npz            (methods with a server model) params: (P,) the shared/mean
                              model, or (G, P) IFCA's cluster models

``<silo id>`` is `silofl.privacy.ledger.silo_file_id` of the silo's name. A model is rebuilt
with ``silofl.models.make_model(spec["name"], spec["dim"], spec["num_classes"],
**spec["options"])`` and applied as ``model.predict(params, X)`` to rows preprocessed with the
card's constants (in order: clip, fill gaps, (x - center) / scale).
A dp_gbdt run's folder holds tree ensembles instead (`tree_saving`; model name "trees"):
`TreePredictor` applies the same preprocessing, then the silo's ensemble.

Saving is post-processing: the models and the private constants are DP outputs already;
uncharged constants (if any) are listed as uncharged in every card. Predicting reads no
training data and spends no budget.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from silofl._version import FORMAT, FORMAT_VERSION
from silofl.data.encoding import encode_table
from silofl.data.schema import schema_from_dict
from silofl.errors import ConfigError, DataError
from silofl.experiments.integrity import load_params, verify_entry, verify_file
from silofl.experiments.tree_format import load_ensemble
from silofl.models import make_model
from silofl.models.trees import TreeEnsemble

POST_PROCESSING = ("Predicting is post-processing of released models: it reads no training "
                   "data and spends no privacy budget.")
NON_PRIVATE = "NON-PRIVATE: trained without differential privacy; no guarantee for anyone"




# --- what a run hands over ----------------------------------------------------------------------

def _choose(what: str, name: str, valid: list[str]) -> str:
    near = difflib.get_close_matches(name, valid, n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise ConfigError(f"unknown {what} {name!r}; valid: {', '.join(repr(v) for v in valid)}."
                      f"{hint}")


@dataclass
class Predictor:
    """One silo's saved model with the preprocessing it was trained with.

    Get one from `SavedRun.predictor`; it scores new records exactly as the model saw
    its training data (the saved schema's encoding, clip bounds, fills, scaling).

    Attributes
    ----------
    silo : str
        The silo whose model this is ("shared" for a server's model).
    method : str
        The method label.
    card : dict
        The model card: method, hyperparameters, preprocessing, privacy statement.
    manifest : dict
        The run's manifest for this method (model spec, schema, feature names, task).
    params : numpy.ndarray
        The model's parameters, shape (P,).
    """

    silo: str
    method: str
    card: dict
    manifest: dict
    params: np.ndarray

    def __post_init__(self):
        spec = self.manifest["model"]
        self.model = make_model(spec["name"], spec["dim"], spec["num_classes"],
                                **spec["options"])
        if self.params.shape != (self.model.num_params,):
            raise DataError(f"saved parameters of silo {self.silo!r} have shape "
                            f"{self.params.shape}, the model needs ({self.model.num_params},)")

    @property
    def feature_names(self) -> list[str]:
        return list(self.manifest["feature_names"])

    @property
    def classes(self) -> list | None:
        c = self.manifest.get("classes")
        if c is None and self.manifest["task"] != "regression":
            return list(range(self.manifest["model"]["num_classes"]))
        return c

    def model_card(self) -> dict:
        """The model card (method, hyperparameters, preprocessing, privacy statement).

        Returns
        -------
        dict
            The card as saved beside the model.
        """
        return self.card

    def _encode(self, df: pd.DataFrame) -> np.ndarray:
        if self.manifest.get("schema") is None:
            raise DataError("this run has no declared schema saved, so a table cannot be "
                            "encoded; pass an array of encoded features in the order of "
                            "feature_names instead")
        schema = schema_from_dict(self.manifest["schema"], where="saved schema")
        lab = schema.label
        # the encoder needs a label column; predictions never read it
        dummy = lab.classes[0] if lab.kind != "regression" else (lab.lower or 0.0)
        df = df.drop(columns=[lab.name], errors="ignore").assign(**{lab.name: dummy})
        enc = encode_table(df, lab.name, schema=schema, missing="impute", name="input")
        if len(enc.rows) != len(df):
            raise DataError(f"the input has {len(df)} rows but {len(enc.rows)} could be encoded")
        return enc.X

    def transform(self, data) -> np.ndarray:
        """Features as the model saw them.

        Parameters
        ----------
        data : pandas.DataFrame or array_like
            A DataFrame is encoded by the saved schema (a label column, if present, is
            ignored); an array is taken as encoded, unpreprocessed features (n, d) in
            `feature_names` order (NaN = missing).

        Returns
        -------
        numpy.ndarray
            Shape (n, d) float64 after the saved clip bounds, fills and center/scale.

        Raises
        ------
        DataError
            The input does not match the saved schema or shape.
        """
        shape = tuple(self.manifest["input_shape"])
        if isinstance(data, pd.DataFrame):
            X = self._encode(data)
        else:
            X = np.asarray(data)
            if X.ndim < 2 or X.shape[1:] != shape:
                raise DataError(f"expected an array of shape (n, {', '.join(map(str, shape))}),"
                                f" got {X.shape}")
        if len(shape) > 1:  # images: no preprocessing
            return X
        X = np.array(X, dtype=np.float64)
        names = self.feature_names
        index = {n: j for j, n in enumerate(names)}
        pre = self.card["preprocessing"]
        for col, (lo, hi) in pre["clip"].items():
            X[:, index[col]] = np.clip(X[:, index[col]], lo, hi)
        for col, fill in pre["fill"].items():
            j = index[col]
            X[np.isnan(X[:, j]), j] = fill
        for col, (center, scale) in pre["standardize"].items():
            j = index[col]
            X[:, j] = (X[:, j] - center) / scale
        bad = np.isnan(X).any(axis=0)
        if bad.any():
            cols = [names[j] for j in np.flatnonzero(bad)][:8]
            raise DataError(f"missing values in column(s) {cols} that this model has no "
                            "fill for")
        return X

    def predict(self, data) -> np.ndarray:
        """The model's scores, as silofl reports them.

        Parameters
        ----------
        data : pandas.DataFrame or array_like
            New records (see `transform`).

        Returns
        -------
        numpy.ndarray
            (n,) P(class 1), the SVM margin or the value; or (n, C) class probabilities.
        """
        return np.asarray(self.model.predict(self.params, self.transform(data)))

    def predict_frame(self, data) -> pd.DataFrame:
        """Predictions as a table, one row per input row.

        Parameters
        ----------
        data : pandas.DataFrame or array_like
            New records (see `transform`).

        Returns
        -------
        pandas.DataFrame
            ``score`` and ``class`` (binary; score = P(class 1), or the margin for svm),
            ``probability[<class>]`` and ``class`` (several classes), or ``prediction``
            (regression).
        """
        s = self.predict(data)
        if self.manifest["task"] == "regression":
            return pd.DataFrame({"prediction": s})
        classes = self.classes
        if s.ndim == 2:
            out = {f"probability[{c}]": s[:, i] for i, c in enumerate(classes)}
            out["class"] = [classes[i] for i in np.argmax(s, axis=1)]
            return pd.DataFrame(out)
        pos = s > 0 if self.model.name == "svm" else s >= 0.5  # as the metrics decide
        return pd.DataFrame({"score": s, "class": [classes[int(p)] for p in pos]})

    def to_sklearn(self):
        """The matching scikit-learn estimator with this model's coefficients (GLMs only).

        Returns
        -------
        sklearn estimator
            Ridge/LinearRegression, LogisticRegression or LinearSVC, for features from
            `transform`.

        Raises
        ------
        ConfigError
            Not a GLM, or scikit-learn is not installed.
        """
        try:
            from sklearn import linear_model, svm
        except ModuleNotFoundError:
            raise ConfigError('exporting to scikit-learn needs scikit-learn, which is not '
                              'installed: pip install scikit-learn (or "silofl[sklearn]")'
                              ) from None
        name = self.model.name
        d = self.manifest["model"]["dim"]
        if name not in ("linear", "logistic", "focal", "svm", "softmax"):
            raise ConfigError(f"model {name!r} has no scikit-learn counterpart; only GLMs "
                              "(linear, logistic, focal, svm, softmax) export")
        W = self.params.reshape(-1, d + 1)
        coef, icpt = W[:, :d], W[:, d]
        if name == "linear":
            l2 = self.card["hyperparameters"].get("l2") or 0.0
            est = linear_model.Ridge(alpha=l2) if l2 else linear_model.LinearRegression()
            est.coef_, est.intercept_ = coef[0].copy(), float(icpt[0])
            est.n_features_in_ = d
            return est
        classes = np.array(self.classes)
        if name == "softmax" and len(classes) == 2:  # softmax of 2 = sigmoid of the difference
            coef, icpt = coef[1:] - coef[:1], icpt[1:] - icpt[:1]
        est = svm.LinearSVC() if name == "svm" else linear_model.LogisticRegression()
        est.coef_, est.intercept_, est.classes_ = coef.copy(), icpt.copy(), classes
        est.n_features_in_ = d
        if name != "svm":
            est.n_iter_ = np.zeros(1, dtype=np.int32)
        return est


class _TreesModel:
    name = "trees"


class TreePredictor(Predictor):
    """A silo's saved tree ensemble with the preprocessing it was trained with
    (`Predictor`'s encoding, clip, fill and scaling; then ``TreeEnsemble.predict``)."""

    def __post_init__(self):
        self.model = _TreesModel()  # type: ignore[assignment]
        if not isinstance(self.params, TreeEnsemble):
            raise DataError(f"saved model of silo {self.silo!r} is not a tree ensemble")

    def predict(self, data) -> np.ndarray:
        """(n,) P(class 1) (binary) or the prediction (regression) of new records."""
        return self.params.predict(self.transform(data))  # type: ignore[attr-defined]

    def to_sklearn(self):
        raise DataError("a tree model has no scikit-learn counterpart; load its XGBoost "
                        "export (model-<silo>.xgb.json) with xgboost.Booster")


def tree_predictor(run_dir: Path, label: str, man: dict, entry: dict, card: dict,
                   silo: str) -> TreePredictor:
    """Silo `silo`'s TreePredictor from a tree run's manifest `entry` (hashes checked)."""
    d = run_dir / "models" / label
    hashes = entry.get("sha256") or {}
    ens = load_ensemble(d / entry["params"], hashes.get("params"),
                        f"tree model of silo {silo!r}")
    return TreePredictor(silo, man["method"], card, man, ens)  # type: ignore[arg-type]


class SavedRun:
    """The saved models of one run directory; get one with `load_run`.

    Attributes
    ----------
    path : Path
        The run directory.
    methods : list of str
        The method labels with saved models.
    """

    def __init__(self, path: Path, manifests: dict[str, dict]):
        self.path, self._manifests = path, manifests

    @property
    def methods(self) -> list[str]:
        return list(self._manifests)

    def method(self, method: str | None = None) -> str:
        """The method label `method` names.

        Parameters
        ----------
        method : str, optional
            A label, or a method name if only one label has it; None: the run's only
            method.

        Returns
        -------
        str
            The label.

        Raises
        ------
        ConfigError
            No such method, or several and none chosen.
        """
        labels = self.methods
        if method is None:
            if len(labels) == 1:
                return labels[0]
            raise ConfigError(f"this run saved {len(labels)} methods; choose one with "
                              f"--method (method= in Python): {', '.join(repr(m) for m in labels)}")
        if method in labels:
            return method
        same = [m for m in labels if self._manifests[m]["method_params"]["name"] == method]
        if len(same) == 1:
            return same[0]
        _choose("method", method, labels)

    def manifest(self, method: str | None = None) -> dict:
        """A method's manifest (model spec, schema, silos and their file hashes).

        Parameters
        ----------
        method : str, optional
            As for `method`.

        Returns
        -------
        dict
            The parsed ``models/<label>/manifest.json``.
        """
        return self._manifests[self.method(method)]

    def silos(self, method: str | None = None) -> list[str]:
        """The silos with a saved model.

        Parameters
        ----------
        method : str, optional
            As for `method`.

        Returns
        -------
        list of str
            Silo names.
        """
        return [s["name"] for s in self.manifest(method)["silos"]]

    def _entry(self, silo: str, method: str | None) -> tuple[dict, dict, Path]:
        label = self.method(method)
        man = self._manifests[label]
        for s in man["silos"]:
            if s["name"] == silo:
                verify_entry(self.path / "models" / label, s, silo, label)
                return man, s, self.path / "models" / label
        if silo == "shared" and man.get("shared"):  # a run directory: no card for it
            raise ConfigError(
                f"'shared' is not a silo of method {label!r} in {self.path}: a `silofl run` "
                f"directory keeps the server's model as models/{label}/{man['shared']}"
                + (f" and {man['shared_xgboost']}" if man.get("shared_xgboost") else "") + " "
                f"(SavedRun.shared({label!r}) in Python), without a card or preprocessing "
                "of its own; score with a silo's model (--silo one of "
                f"{', '.join(repr(s['name']) for s in man['silos'])}). --silo shared is "
                "for a deployed silo's or server's folder")
        _choose("silo", silo, [s["name"] for s in man["silos"]])

    def model_card(self, silo: str, method: str | None = None) -> dict:
        """A silo's model card (its file's SHA-256 is checked against the manifest).

        Parameters
        ----------
        silo : str
            The silo's name.
        method : str, optional
            As for `method`.

        Returns
        -------
        dict
            Method, hyperparameters, preprocessing, privacy statement.
        """
        _, s, d = self._entry(silo, method)
        return json.loads((d / s["card"]).read_text(encoding="utf-8"))

    def predictor(self, silo: str, method: str | None = None) -> Predictor:
        """A silo's released model, ready to score new records.

        Parameters
        ----------
        silo : str
            The silo's name.
        method : str, optional
            As for `method`.

        Returns
        -------
        Predictor
            The model with its preprocessing (files checked against their SHA-256).
        """
        man, s, d = self._entry(silo, method)
        if man["model"].get("name") == "trees":  # dp_gbdt: a tree ensemble, not a GLM vector
            return tree_predictor(self.path, man["method"], man, s,
                                  self.model_card(silo, method), silo)
        params = load_params(d / s["params"], f"model file of silo {silo!r}")
        return Predictor(silo, man["method"], self.model_card(silo, method), man, params)

    def shared(self, method: str | None = None) -> np.ndarray | TreeEnsemble | None:
        """The server's model(s) of a method, where it keeps one.

        Parameters
        ----------
        method : str, optional
            As for `method`.

        Returns
        -------
        numpy.ndarray or TreeEnsemble or None
            (P,) the shared model, or (G, P) IFCA's cluster models; dp_gbdt's shared
            ensemble; None where the method keeps none.
        """
        man = self.manifest(method)
        if not man.get("shared"):
            return None
        path = self.path / "models" / man["method"] / man["shared"]
        if man["model"].get("name") == "trees":  # its hashes: {"params", "xgboost"}
            return load_ensemble(path, (man.get("shared_sha256") or {}).get("params"),
                                 "shared tree ensemble")
        verify_file(path, man.get("shared_sha256"), "shared model file")
        return load_params(path, "shared model file")


def load_run(path) -> SavedRun:
    """The saved models of a run directory.

    ``load_run(d).predictor(silo, method).predict(df)`` scores new records with a silo's
    released model. Reading saved models releases nothing new: no budget is charged.

    Parameters
    ----------
    path : str or Path
        A run directory written by `run` or ``silofl run`` (or a deployed silo's or
        server's folder).

    Returns
    -------
    SavedRun
        Its models by method and silo.

    Raises
    ------
    ConfigError
        `path` is missing, holds no saved models (a folder of runs is named as such), or
        a newer format.
    """
    p = Path(path)
    root = p / "models"
    if not p.is_dir():
        raise ConfigError(f"run directory not found: {str(p)!r}")
    found = sorted(root.glob("*/manifest.json")) if root.is_dir() else []
    if not found:
        # a newcomer passes the folder of runs (`runs`), not one run (`runs/<time>`)
        inner = sorted({str(q.parents[2]) for q in p.glob("*/models/*/manifest.json")})
        if inner:
            raise ConfigError(f"{str(p)!r} is a folder of runs, not one run: pass one of its "
                              f"run directories, e.g. --run {inner[-1]!r}")
        raise ConfigError(f"{str(p)!r} holds no saved models (no models/<method>/manifest.json)"
                          "; runs of silofl before model saving kept none: run again")
    manifests = {}
    for f in found:
        try:
            man = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise ConfigError(f"unreadable model manifest {str(f)!r}") from None
        if man.get("format") != FORMAT or not isinstance(man.get("format_version"), int):
            raise ConfigError(f"{str(f)!r} is not a silofl model manifest")
        if man["format_version"] > FORMAT_VERSION:
            raise ConfigError(f"{str(f)!r} has model format {man['format_version']}; this "
                              f"silofl reads up to {FORMAT_VERSION}: upgrade silofl")
        if man.get("method") != f.parent.name:  # a manifest copied from another method
            raise ConfigError(f"{str(f)!r} describes method {man.get('method')!r}, not the "
                              f"folder {f.parent.name!r} it is in: restore the run directory")
        manifests[man["method"]] = man
    return SavedRun(p, manifests)
