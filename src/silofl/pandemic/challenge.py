"""The PETs challenge's centralized entry points (`fit`, `predict`) over `pipeline.train`/`predict`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from silofl.errors import ConfigError
from silofl.pandemic.partition import input_directory
from silofl.pandemic.pipeline import PandemicConfig, PandemicModel, predict, train
from silofl.pandemic.readers import read_dataset
from silofl.privacy.budget import BudgetStore


def fit(person_data_path, household_data_path, residence_location_data_path,
        activity_location_data_path, activity_location_assignment_data_path,
        population_network_data_path, disease_outcome_data_path, model_dir,
        config: PandemicConfig | None = None, store: BudgetStore | None = None) -> None:
    """Mirror of the challenge's centralized `fit`: trains on the seven input files (any
    names and folders; see `partition.input_directory`) and saves the model to
    ``model_dir``.  ``config`` defaults to the centralized recipe; a private run charges
    ``store`` (default: the user's default lifetime store,
    ``silofl.privacy.store_paths.default_store_path()``, so fitting again — into any
    folder — composes with, and is limited by, what was spent before)."""
    paths = (person_data_path, household_data_path, residence_location_data_path,
             activity_location_data_path, activity_location_assignment_data_path,
             population_network_data_path, disease_outcome_data_path)
    model_dir = Path(model_dir)
    data = read_dataset(input_directory(paths, model_dir / "inputs"))
    cfg = config or PandemicConfig(federated=False)
    if store is None and cfg.private:
        from silofl.privacy.store_paths import default_store_path
        with BudgetStore(default_store_path()) as st:
            pm = train(data, cfg, store=st, command="silofl.pandemic.fit")
    else:
        pm = train(data, cfg, store=store, command="silofl.pandemic.fit")
    pm.save(model_dir)


def predict_to_csv(person_data_path, household_data_path, residence_location_data_path,
                   activity_location_data_path, activity_location_assignment_data_path,
                   population_network_data_path, disease_outcome_data_path, model_dir,
                   preds_format_path, preds_dest_path) -> None:
    """Mirror of the challenge's centralized `predict`: writes `pid,score` in the order
    of the format file."""
    paths = (person_data_path, household_data_path, residence_location_data_path,
             activity_location_data_path, activity_location_assignment_data_path,
             population_network_data_path, disease_outcome_data_path)
    model_dir = Path(model_dir)
    data = read_dataset(input_directory(paths, model_dir / "inputs"))
    scores = predict(data, PandemicModel.load(model_dir))
    write_predictions(data.pid_index, scores, preds_format_path, preds_dest_path)


def write_predictions(pid_index, scores: np.ndarray, preds_format_path,
                      preds_dest_path) -> None:
    """Fill the ``score`` column of the challenge's format file (``pid,score``, dummy
    scores) from ``scores`` (P,), indexed like ``pid_index``, keeping the file's row
    order, and write it to ``preds_dest_path``."""
    import pandas as pd
    fmt = pd.read_csv(preds_format_path)
    if "pid" not in fmt.columns:
        raise ConfigError(f"{preds_format_path} has no 'pid' column; the predictions "
                          "format file must have the columns pid,score")
    idx = pid_index.lookup(fmt["pid"].to_numpy())
    if np.any(idx < 0):  # no pid in the message: ids are record values
        raise ConfigError(f"{preds_format_path} lists {int((idx < 0).sum())} pids that are "
                          "not in the data; pass the format file of this dataset")
    fmt["score"] = scores[idx]
    fmt.to_csv(preds_dest_path, index=False)
