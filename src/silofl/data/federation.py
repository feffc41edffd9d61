"""The data model: a `Silo` holds one institution's examples and privacy target;
a `Federation` is a list of silos sharing one feature schema and one task."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from silofl.data.schema import Task
from silofl.errors import DataError
from silofl.privacy.targets import PrivacyTarget


@dataclass
class Silo:
    """One data holder: its training and test examples and its privacy target.

    Parameters
    ----------
    name : str
        The silo's name (unique in its federation).
    X_train, X_test : numpy.ndarray
        Examples: shape (n, d) float64 for tabular data, or (n, C, H, W) float32 for
        images (any rank >= 3: one array per example).
    y_train, y_test : numpy.ndarray
        Labels, shape (n,): float for regression, int class ids 0..C-1 for
        classification.
    target : PrivacyTarget, optional
        The silo's own (ε, δ); None until `Federation.with_targets` sets it.
    person_train, person_test : numpy.ndarray, optional
        Shape (n_train,) and (n_test,): the person each row belongs to (`[data]
        person_column`; ints or strings as read, never a feature). Person-level DP
        (`[privacy] unit = "person"`) samples and bounds persons, not rows. None: one
        person per row is not assumed anywhere; example-level DP only.
    """

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    target: PrivacyTarget | None = None
    person_train: np.ndarray | None = None
    person_test: np.ndarray | None = None

    @property
    def n_persons(self) -> int:
        """Distinct persons among the training rows (0 without a person column)."""
        return 0 if self.person_train is None else int(len(np.unique(self.person_train)))

    @property
    def n_train(self) -> int:
        return int(self.X_train.shape[0])

    @property
    def n_test(self) -> int:
        return int(self.X_test.shape[0])


class SiloCollection:
    """What federations (finished or raw) share: their silos by name."""

    silos: list[Silo]

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.silos]

    @property
    def num_silos(self) -> int:
        return len(self.silos)

    @property
    def has_persons(self) -> bool:
        """True when every silo names the person of each row (person-level DP possible)."""
        return bool(self.silos) and all(s.person_train is not None for s in self.silos)

    @property
    def is_image(self) -> bool:
        """True when examples are arrays of rank >= 2 (X of rank >= 3), e.g. images."""
        return bool(self.silos) and self.silos[0].X_train.ndim > 2

    def silo(self, name: str) -> Silo:
        for s in self.silos:
            if s.name == name:
                return s
        raise DataError(f"unknown silo {name!r}; silos are: {', '.join(self.names)}")


@dataclass
class Federation(SiloCollection):
    """Silos with one feature schema and one task; validated on construction.

    Tabular federations have rank-2 X and one name per column in `feature_names`. Image
    federations have rank >= 3 X (every silo the same per-example shape, e.g. (1, 28, 28))
    and usually empty `feature_names`; `input_shape` gives the per-example shape either way.

    Parameters
    ----------
    silos : list of Silo
        The silos, in order (their order is the order of every per-silo result).
    feature_names : list of str
        One name per input column (tabular data), length d.
    task : {"binary", "multiclass", "regression"}
        What the labels are.
    num_classes : int, default 0
        Number of classes C (classification); 0 when not declared.
    name : str, default "federation"
        A name for messages and reports.
    meta : dict
        Provenance and preprocessing notes carried into run outputs.

    Raises
    ------
    DataError
        Shapes disagree, values are not finite, labels are not 0..C-1, a silo has fewer
        than 2 training examples or a single class.
    """

    silos: list[Silo]
    feature_names: list[str]
    task: Task
    num_classes: int = 0
    name: str = "federation"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-example shape: (d,) for tabular data, e.g. (1, 28, 28) for MNIST images."""
        if self.is_image:
            return tuple(int(v) for v in self.silos[0].X_train.shape[1:])
        return (len(self.feature_names),)

    @property
    def dim(self) -> int:
        """Input features per example: len(feature_names) for tabular data, the product of
        `input_shape` for images (what a model that flattens its input sees)."""
        return int(np.prod(self.input_shape))

    def validate(self) -> None:
        """Check shapes, finiteness, schema agreement and label sanity for every silo.

        Raises
        ------
        DataError
            The first problem found, naming the silo, the part and the fix.
        """
        if not self.silos:
            raise DataError(f"federation {self.name!r} has no silos")
        names = self.names
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise DataError(f"duplicate silo names {sorted(dup)}; give every silo a unique name")
        d = self.dim
        shape = self.input_shape
        if self.is_image and self.feature_names and len(self.feature_names) != d:
            raise DataError(f"federation {self.name!r} holds examples of shape {shape} but names "
                            f"{len(self.feature_names)} features; leave feature_names empty for "
                            "images or name all of their values")
        for s in self.silos:
            for part in ("train", "test"):
                X, y = getattr(s, f"X_{part}"), getattr(s, f"y_{part}")
                if X.ndim < 2 or X.shape[0] != y.shape[0]:
                    raise DataError(f"silo {s.name!r} {part}: X has shape {X.shape} but y has "
                                    f"{y.shape[0]} labels; they must have the same number of rows")
                if (X.ndim > 2) != self.is_image or X.ndim > 2 and X.shape[1:] != shape:
                    raise DataError(
                        f"silo {s.name!r} {part} holds examples of shape {X.shape[1:]} but the "
                        f"first silo's are {shape}; all silos must share one input shape "
                        "(tabular X is (n, d), images are (n, C, H, W))")
                if X.ndim == 2 and X.shape[1] != d:
                    raise DataError(
                        f"silo {s.name!r} has {X.shape[1]} features in its {part} part but the "
                        f"federation schema has {d}; all silos must share one feature schema "
                        "(encode every silo's table with the same columns)")
                # a lazy table (data.lazy) is checked batch by batch as it is read
                if isinstance(X, np.ndarray) and not np.all(np.isfinite(X)):
                    bad = np.argwhere(~np.isfinite(X))[0]
                    col = self.feature_names[bad[1]] if X.ndim == 2 else str(tuple(bad[1:]))
                    raise DataError(f"silo {s.name!r} {part} row {bad[0]}, feature {col!r} is "
                                    "NaN or infinite after preprocessing; fix or impute it")
                if not np.all(np.isfinite(y)):
                    k = int(np.sum(~np.isfinite(y)))
                    raise DataError(f"silo {s.name!r} {part}: {k} label(s) are NaN or "
                                    "infinite; fix or drop those rows")
            for part in ("train", "test"):
                ids = getattr(s, f"person_{part}")
                if ids is not None and len(ids) != getattr(s, f"n_{part}"):
                    raise DataError(f"silo {s.name!r} {part}: {len(ids)} person ids for "
                                    f"{getattr(s, f'n_{part}')} rows; give one person per row")
            if s.n_train < 2:
                why = "" if s.person_test is None or not s.n_test else (
                    f" (the person split put {len(np.unique(s.person_test))} of its persons, "
                    "with all their rows, on the test side)")
                raise DataError(f"silo {s.name!r} has {s.n_train} training example(s){why}; "
                                "DP-SGD needs at least 2. Merge it with another silo or drop "
                                "it ([data] min_silo_rows with small_silos = \"drop\")")
            if self.task != "regression":
                if np.any(s.y_train != np.round(s.y_train)) or np.any(s.y_train < 0):
                    raise DataError(f"silo {s.name!r} has non-integer or negative class labels; "
                                    "classification labels must be 0..C-1")
                if len(np.unique(s.y_train)) < 2:
                    raise DataError(
                        f"silo {s.name!r} has a single class in its training data; a "
                        "classifier cannot learn from it. Drop the silo or regroup silos")
                top = max(int(s.y_train.max()), int(s.y_test.max()) if s.n_test else 0)
                if self.num_classes and top >= self.num_classes:
                    over = int((s.y_train >= self.num_classes).sum()
                               + (s.y_test >= self.num_classes).sum())
                    raise DataError(f"silo {s.name!r} has {over} label(s) with a class id "
                                    f"outside 0..{self.num_classes - 1} (num_classes is "
                                    f"{self.num_classes})")
        check_person_ids(self.silos)

    def with_targets(self, default: PrivacyTarget | None,
                     overrides: dict[str, PrivacyTarget] | None = None) -> Federation:
        """A copy where every silo carries `default` unless overridden by name.

        Parameters
        ----------
        default : PrivacyTarget or None
            The target of every silo not named in `overrides`.
        overrides : dict of str to PrivacyTarget, optional
            Per-silo targets by silo name.

        Returns
        -------
        Federation
            The same data with the targets set (the original is unchanged).

        Raises
        ------
        DataError
            An override names a silo the federation does not have.
        """
        overrides = overrides or {}
        for name in overrides:
            self.silo(name)  # raises a clear error for unknown silos
        silos = [dataclasses.replace(s, target=overrides.get(s.name, default)) for s in self.silos]
        return dataclasses.replace(self, silos=silos)


def check_person_ids(silos: list[Silo]) -> None:
    """Refuse person ids that are missing (None, NaN, empty text) or that mix text with
    numbers, within a silo or across silos: ``1`` and ``"1"`` would be one person to one
    routine (a keyed hash of the text) and two to another (sorting, counting), so a
    person's rows could be split or merged silently, and the person-level bound with them.

    Parameters
    ----------
    silos : list of Silo
        The silos; those without person ids are skipped.

    Raises
    ------
    DataError
        Naming the silo and part (never an id) and the fix.
    """
    kinds: dict[str, str] = {}
    for s in silos:
        for part in ("train", "test"):
            ids = getattr(s, f"person_{part}")
            if ids is None:
                continue
            a = np.asarray(ids)
            where = f"silo {s.name!r} {part}"
            if a.ndim != 1:
                raise DataError(f"{where}: person ids must be one value per row, shape (n,), "
                                f"got shape {a.shape}")
            if a.size == 0:  # an empty part has no type of its own
                continue
            if a.dtype.kind in "biuf":
                if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
                    raise DataError(f"{where}: {int(np.sum(~np.isfinite(a)))} person id(s) are "
                                    "NaN or infinite; every row needs its person's id")
                kind = "number"
            elif a.dtype.kind in "US":
                kind = "text"
            else:
                bad = [v for v in a.tolist() if (isinstance(v, str) and not v.strip()) or
                       v is None or (isinstance(v, float) and not np.isfinite(v))]
                if bad:
                    raise DataError(f"{where}: {len(bad)} person id(s) are missing (None, NaN "
                                    "or empty text); every row needs its person's id")
                text = [isinstance(v, str) for v in a.tolist()]
                if not all(text) and any(text):
                    raise DataError(f"{where}: person ids mix text and numbers; give every id "
                                    "as text, or every id as an integer")
                kind = "text" if all(text) else "number"
            kinds[where] = kind
    if len(set(kinds.values())) > 1:
        txt = [w for w, k in kinds.items() if k == "text"][:3]
        num = [w for w, k in kinds.items() if k == "number"][:3]
        raise DataError(f"person ids are text in {', '.join(txt)} but numbers in "
                        f"{', '.join(num)}; the same person must carry the same id in every "
                        "silo: give every silo's ids as text, or every silo's as integers")


def split_indices(n: int, test_fraction: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random (train rows, test rows) of 0..n-1; round(test_fraction * n) test rows."""
    if not 0 <= test_fraction < 1:
        raise DataError(f"test_fraction must be in [0, 1), got {test_fraction}")
    perm = rng.permutation(n)
    n_test = int(round(test_fraction * n))
    return perm[n_test:], perm[:n_test]


def split_silo(name: str, X: np.ndarray, y: np.ndarray, test_fraction: float,
               rng: np.random.Generator) -> Silo:
    """Seeded random train/test split of one silo's rows (see `split_indices`)."""
    tr, te = split_indices(X.shape[0], test_fraction, rng)
    return Silo(name, X[tr], y[tr], X[te], y[te])


def standardize(fed: Federation) -> Federation:
    """Per-silo z-scoring fitted on each silo's training part only (test rows never leak
    into the statistics). Constant columns are left centred with unit scale.

    UNCHARGED: the means and standard deviations are read from each silo's private rows
    without any privacy charge; the returned federation lists that in ``meta["uncharged"]``.
    Prefer `silofl.data.preprocess` (declared or private statistics).
    Image federations are returned unchanged: their pixels already share one [0, 1] scale
    and per-pixel z-scoring would turn constant (e.g. masked) pixels into noise artefacts."""
    if fed.is_image:
        return fed
    meta = {**fed.meta, "uncharged": [*fed.meta.get("uncharged", []),
                                      "per-silo training mean and standard deviation of every "
                                      "feature (standardize())"]}
    silos = []
    for s in fed.silos:
        mu = s.X_train.mean(axis=0)
        sd = s.X_train.std(axis=0)
        sd = np.where(sd > 1e-12, sd, 1.0)
        silos.append(dataclasses.replace(s, X_train=(s.X_train - mu) / sd,
                                         X_test=(s.X_test - mu) / sd))
    return dataclasses.replace(fed, silos=silos, meta=meta)
