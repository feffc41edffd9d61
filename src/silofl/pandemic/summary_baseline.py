"""How much of the model's skill is already in its inputs: untrained scores built from
the recent-infection summaries (`inputs.summary_inputs`).

* `equal_weight_scores`: every summary column standardized per region and summed with
  weight +1 — no labels, no training.  The standardization is the model's: the declared
  constants (`inputs.SUMMARY_DECLARED`) by default, the region's own statistics with
  ``preprocessing="uncharged"`` (read without any charge: an analysis aid, not a
  release).  Every column is oriented so that larger means more risk (susceptible,
  more/longer contacts with infectious people), so +1 is the natural untrained guess.
* `summary_columns`: the raw summary columns at prediction time, to score each column
  on its own (the *best single column* is chosen with the labels, an optimistic
  reference, not a usable predictor).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from silofl.errors import ConfigError
from silofl.pandemic.dataset import PandemicData
from silofl.pandemic.inputs import declared_input_scaling, fit_input_scaling, summary_inputs
from silofl.pandemic.pipeline import PandemicConfig
from silofl.pandemic.regions import build_regions


def summary_columns(data: PandemicData, cfg: PandemicConfig,
                    batch_size: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """((P, 12) summary inputs at prediction time, raw; (P, 12) the same standardized
    with each person's region constants: declared, or with ``preprocessing="uncharged"``
    the region's own (uncharged) statistics)."""
    if cfg.preprocessing == "private":
        raise ConfigError("the untrained score has no private standardization; use "
                          "preprocessing='declared' or 'uncharged'")
    cfg = replace(cfg, pooling="summary")
    raw = np.zeros((data.num_persons, 12), np.float64)
    std = np.zeros_like(raw)
    for r in build_regions(data, cfg):
        if cfg.preprocessing == "uncharged":
            shift, scale = fit_input_scaling(r.features, "summary", cfg.seed)
        else:
            shift, scale = declared_input_scaling(r.features, "summary")
        for persons, X in r.features.iter_prediction_batches(batch_size):
            Z = summary_inputs(r.features, X).astype(np.float64)
            raw[r.persons[persons]] = Z
            std[r.persons[persons]] = (Z - shift) / scale
    return raw, std


def equal_weight_scores(data: PandemicData, cfg: PandemicConfig) -> np.ndarray:
    """(P,) the untrained score: the sum of the standardized summary columns."""
    return summary_columns(data, cfg)[1].sum(axis=1)
