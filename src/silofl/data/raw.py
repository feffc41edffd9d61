"""The raw federation: encoded silos before preprocessing (phase 1 of
`silofl.data.preprocess`).

A loader's ``*_raw`` variant returns a `RawFederation`: features encoded by the schema
(values clipped to declared bounds, NaN where a value is missing), labels encoded and a
seeded train/test split -- no statistic of the data computed, so nothing here needs a
budget. `plan_preprocessing` and `apply_preprocessing` turn it into a `Federation`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from silofl.data.federation import Federation, Silo, SiloCollection, Task
from silofl.data.schema import ColumnSpec
from silofl.errors import DataError
from silofl.privacy.targets import PrivacyTarget


@dataclass
class RawFederation(SiloCollection):
    """Encoded silos before preprocessing: like a `Federation`, but X may hold NaN in the
    nullable value columns. `specs` maps an encoded column index to the schema column of each
    numeric/binary value column (one-hot and indicator columns have none and are left as
    they are). `uncharged` names what the encoding itself read from the data (e.g. category
    levels from a pooled table); `simulated` marks simulated silos (splitters, generators),
    where "auto" may fall back to uncharged statistics, listed."""

    silos: list[Silo]
    feature_names: list[str]
    task: Task
    num_classes: int = 0
    specs: dict[int, ColumnSpec] = field(default_factory=dict)
    name: str = "federation"
    meta: dict = field(default_factory=dict)
    uncharged: list[str] = field(default_factory=list)
    simulated: bool = False

    def __post_init__(self) -> None:
        self.validate()

    @property
    def dim(self) -> int:
        return int(np.prod(self.silos[0].X_train.shape[1:])) if self.silos else 0

    def with_targets(self, default: PrivacyTarget | None,
                     overrides: Mapping[str, PrivacyTarget] | None = None) -> RawFederation:
        """A copy where every silo carries `default` unless overridden by name (as
        `Federation.with_targets`); `plan_preprocessing` reads these targets.

        Parameters
        ----------
        default : PrivacyTarget or None
            Every silo's (ε_k, δ_k) unless overridden.
        overrides : mapping of str to PrivacyTarget, optional
            Silo name → its own target.

        Returns
        -------
        RawFederation
            The copy.

        Raises
        ------
        DataError
            An override names no silo of the federation.
        """
        overrides = dict(overrides or {})
        for name in overrides:
            self.silo(name)  # a clear error for unknown silos
        silos = [dataclasses.replace(s, target=overrides.get(s.name, default))
                 for s in self.silos]
        return dataclasses.replace(self, silos=silos, meta=dict(self.meta))

    def validate(self) -> None:
        """The checks of `Federation.validate` (shapes, sizes, labels, finiteness), except
        that NaN may stand in nullable value columns, and nowhere else."""
        nullable = np.zeros(len(self.feature_names), bool)
        for j, spec in self.specs.items():
            if not 0 <= j < len(self.feature_names) or self.feature_names[j] != spec.name:
                raise DataError(f"{self.name}: spec for column {spec.name!r} does not match "
                                f"feature {j}")
            nullable[j] = spec.nullable
        silos = []
        for s in self.silos:
            parts = {}
            for part in ("X_train", "X_test"):
                X = getattr(s, part)
                if isinstance(X, np.ndarray) and X.ndim == 2 and \
                        X.shape[1] == len(nullable) and np.isnan(X).any():
                    bad = np.isnan(X).any(axis=0) & ~nullable
                    if bad.any():
                        raise DataError(f"silo {s.name!r}: column "
                                        f"{self.feature_names[int(np.argmax(bad))]!r} has "
                                        "missing values but is not nullable")
                    X = np.where(np.isnan(X), 0.0, X)
                parts[part] = X
            silos.append(dataclasses.replace(s, **parts))
        Federation(silos, self.feature_names, self.task, self.num_classes, self.name)

    @staticmethod
    def from_federation(fed: Federation, specs: Mapping[int, ColumnSpec] | None = None, *,
                        simulated: bool = False, uncharged: Sequence[str] = ()) -> RawFederation:
        """Wrap a finished federation (e.g. generated or image data).

        Parameters
        ----------
        fed : Federation
            The silos.
        specs : mapping of int to ColumnSpec, optional
            Encoded column index → its schema column. Default: every tabular column a
            numeric value column with no declared bounds; images none (their pixels share
            the public [0, 1] scale).
        simulated : bool, default False
            Simulated silos ("auto" may fall back to uncharged statistics, listed).
        uncharged : sequence of str, default ()
            What building `fed` read from the data without a charge.

        Returns
        -------
        RawFederation
        """
        if specs is None:
            specs = {} if fed.is_image else {j: ColumnSpec(n, "numeric")
                                             for j, n in enumerate(fed.feature_names)}
        return RawFederation(list(fed.silos), list(fed.feature_names), fed.task,
                             fed.num_classes, dict(specs), fed.name, dict(fed.meta),
                             list(uncharged), simulated)
