"""How much of the model's skill is already in its inputs: untrained scores built from
the recent-infection summaries (`pipeline.summary_inputs`).

* `equal_weight_scores`: every summary column standardized per region (the constants
  the model uses, `pipeline.fit_input_scaling`) and summed with weight +1 — no labels,
  no training.  Every column is oriented so that larger means more risk (susceptible,
  more/longer contacts with infectious people), so +1 is the natural untrained guess.
* `summary_columns`: the raw summary columns at prediction time, to score each column
  on its own (the *best single column* is chosen with the labels, an optimistic
  reference, not a usable predictor).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from silofl.pandemic.pipeline import (
    PandemicConfig, build_regions, fit_input_scaling, summary_inputs,
)
from silofl.pandemic.readers import PandemicData


def summary_columns(data: PandemicData, cfg: PandemicConfig,
                    batch_size: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """((P, 12) summary inputs at prediction time, raw; (P, 12) the same standardized
    with each person's region constants)."""
    cfg = replace(cfg, pooling="summary")
    raw = np.zeros((data.num_persons, 12), np.float64)
    std = np.zeros_like(raw)
    for r in build_regions(data, cfg):
        shift, scale = fit_input_scaling(r.features, "summary", cfg.seed)
        for persons, X in r.features.iter_prediction_batches(batch_size):
            Z = summary_inputs(r.features, X).astype(np.float64)
            raw[r.persons[persons]] = Z
            std[r.persons[persons]] = (Z - shift) / scale
    return raw, std


def equal_weight_scores(data: PandemicData, cfg: PandemicConfig) -> np.ndarray:
    """(P,) the untrained score: the sum of the standardized summary columns."""
    return summary_columns(data, cfg)[1].sum(axis=1)
