"""Regions (silos): their persons, their neighbourhood features and the model's view of them.

A region's membership and size are public (they set its sampling rate and noise); its
features are built only after the run has reserved its budget (`pipeline.train`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from silofl.errors import ConfigError, PrivacyError
from silofl.pandemic.constants import declared_constants, private_release
from silofl.pandemic.dataset import PandemicData
from silofl.pandemic.engine import GraphSource
from silofl.pandemic.features import build_neighbourhood_features
from silofl.pandemic.inputs import (
    declared_input_scaling,
    fit_input_scaling,
    fold_scaling,
    model_inputs,
)
from silofl.pandemic.region import Region
from silofl.pandemic.tables import FeatureConstants

if TYPE_CHECKING:
    from silofl.pandemic.config import PandemicConfig


def region_groups(data: PandemicData, cfg: PandemicConfig) -> list[Region]:
    """The silos and their persons, nothing else: region membership and sizes (public)."""
    if cfg.federated:
        if np.any(data.region < 0):
            raise ConfigError(f"{int((data.region < 0).sum())} persons have no region (no "
                              "home residence with a county); fix the data or use the "
                              "centralized mode")
        groups = [(f"region-{int(c)}", data.region_members(r))
                  for r, c in enumerate(data.region_codes)]
    else:
        groups = [("all", np.arange(data.num_persons))]
    out = []
    for name, persons in groups:
        if persons.size == 0:
            raise ConfigError(f"{name} has no persons; drop it from the data")
        out.append(Region(name, persons, S=cfg.S))
    return out


def build_regions(data: PandemicData, cfg: PandemicConfig,
                  constants: dict | None = None) -> list[Region]:
    """Per-region neighbourhood features on each region's own subgraph.  ``constants``
    (region → `FeatureConstants` or its dict) overrides the config's source; a
    private source needs them (a release is made, and charged, only by `train`)."""
    regions = region_groups(data, cfg)
    for r in regions:
        c = (constants or {}).get(r.name)
        build_features(data, r, cfg, None if c is None else as_constants(c))
    return regions


def as_constants(c: FeatureConstants | dict) -> FeatureConstants:
    """``c`` as `FeatureConstants` (a saved model holds their dict)."""
    return c if isinstance(c, FeatureConstants) else FeatureConstants(**c)


def build_region(data: PandemicData, name: str, persons: np.ndarray,
                 cfg: PandemicConfig) -> Region:
    """One silo with its features built (declared or uncharged constants)."""
    if persons.size == 0:
        raise ConfigError(f"{name} has no persons; drop it from the data")
    r = Region(name, persons, S=cfg.S)
    build_features(data, r, cfg)
    return r


def build_features(data: PandemicData, r: Region, cfg: PandemicConfig,
                   constants: FeatureConstants | None = None) -> None:
    """Neighbourhood features of ``r.persons`` on the subgraph of contacts among them,
    normalized with ``constants`` or, when None, by ``cfg.preprocessing``: "declared",
    "uncharged" (fit on the region, not charged) or "private" (charges ``r.ledger``, then
    releases them with `private_release`; needs `plan_regions` and a ledger).  Reads
    features and states, never labels."""
    inputs = data.feature_inputs(r.persons)
    private = constants is None and cfg.preprocessing == "private"
    if constants is None:
        constants = "uncharged" if cfg.preprocessing == "uncharged" else declared_constants(cfg)
    r.features = build_neighbourhood_features(**inputs, S=cfg.S, t_window=cfg.t_window,
                                              seed=cfg.seed, priority=cfg.priority,
                                              constants=constants)
    if r.features.node_dp_S != r.S:  # the plan's S must be what the features give
        raise PrivacyError(f"{r.name}: the features bound appearances by S = "
                           f"{r.features.node_dp_S}, the plan by {r.S}")
    if private:
        private_release(r, cfg, inputs)
    r.constants = FeatureConstants(**r.features.fitted["constants"])


def fit_region_scaling(r: Region, cfg: PandemicConfig) -> None:
    """Set ``r.shift``/``r.scale`` (model-input standardization) when ``cfg.standardize``:
    declared constants, the region's own statistics (uncharged), or — private — what
    `private_release` already set."""
    if not cfg.standardize:
        r.shift = r.scale = None
    elif cfg.preprocessing == "uncharged":
        r.shift, r.scale = fit_input_scaling(r.features, cfg.pooling, cfg.seed)
    elif cfg.preprocessing == "private" and r.shift is not None:
        pass  # released privately with the feature constants
    else:  # declared (and private with mean/concat pooling: identity, declared)
        r.shift, r.scale = declared_input_scaling(r.features, cfg.pooling)


def region_inputs(r: Region, cfg: PandemicConfig, X: np.ndarray) -> np.ndarray:
    """Gathered examples (B, D) of ``r`` → the model's inputs (B, P − 1) float32:
    `model_inputs`, then the region's standardization (if any)."""
    X = model_inputs(r.features, X, cfg.pooling)
    if r.shift is not None:
        X = ((X - r.shift) / r.scale).astype(np.float32)
    return X


def region_source(regions: list[Region], cfg: PandemicConfig) -> GraphSource:
    """The core trainer's data source over the regions' features."""
    return GraphSource(regions, lambda k, X: region_inputs(regions[k], cfg, X), cfg.seed)


def raw_weights(w: np.ndarray, r: Region) -> np.ndarray:
    """(P,) weights acting on the raw model inputs (undoes the region's scaling)."""
    return w if r.shift is None else fold_scaling(w, r.shift, r.scale)
