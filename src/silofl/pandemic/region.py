"""A region (one silo of the pandemic track): its persons and, once planned and built,
its features, noise and ledger."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from silofl.pandemic.features import NeighbourhoodFeatures
from silofl.pandemic.tables import FeatureConstants
from silofl.privacy.ledger import Ledger


@dataclass
class Region:
    """One silo: its persons and, once planned and built, its features, noise and ledger."""

    name: str
    persons: np.ndarray          # indices into the dataset's persons
    features: NeighbourhoodFeatures | None = None  # None until built (after the reservation)
    S: int = 0
    steps_per_round: int = 0
    sigma: float | None = None
    ledger: Ledger | None = None
    shift: np.ndarray | None = None  # model-input standardization (None: raw inputs)
    scale: np.ndarray | None = None
    delta: float | None = None
    pre_sigma: float | None = None   # private preprocessing: noise multiplier, batch
    pre_batch: int = 0
    constants: FeatureConstants | None = None

    @property
    def n(self) -> int:
        return int(self.persons.size)
