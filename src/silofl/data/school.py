"""The School dataset (ILEA exam scores) as a 139-silo regression federation.

File format (see shared/data/README.md): a MATLAB v5 file with 1x139 cell arrays ``X`` and
``Y``; ``X{k}`` is n_k x 28 (student/school features), ``Y{k}`` is n_k x 1 (exam score,
integer 1..70). 15,362 students in all, silo sizes 22..251.

Preprocessing follows the cross-silo FL literature: per-silo seeded train/test split,
features z-scored per silo on the training part, target min-max scaled with the score
bounds 1 and 70, i.e. y = (score - 1) / 69 in [0, 1] (a model's MSE is in those units).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from silofl.data.federation import Federation, split_silo
from silofl.data.federation import standardize as standardize_federation
from silofl.errors import DataError

SCORE_MIN, SCORE_MAX = 1.0, 70.0
NUM_FEATURES = 28


def load_school(path: str | Path, *, test_fraction: float = 0.2, seed: int = 0,
                standardize: bool = True) -> Federation:
    """Load ``school.mat``: silos ``school-000``..``school-138``, X (n_k, 28) float64,
    y (n_k,) float64 = (score - 1) / 69. Features are named ``x00``..``x27`` (the file
    carries no names)."""
    import scipy.io  # local: scipy import is slow and only this loader needs it

    p = Path(path)
    if not p.is_file():
        raise DataError(f"School data file not found: {str(p)!r}; pass the path to school.mat "
                        "(a MATLAB file with cell arrays X and Y)")
    try:
        mat = scipy.io.loadmat(p)
    except Exception as e:  # scipy raises several types for non-MAT or truncated files
        raise DataError(f"could not read {str(p)!r} as a MATLAB .mat file: {e}") from None
    if "X" not in mat or "Y" not in mat:
        keys = sorted(k for k in mat if not k.startswith("__"))
        raise DataError(f"{str(p)!r} has variables {keys}, expected cell arrays 'X' and 'Y' "
                        "(one cell per school)")
    xs, ys = mat["X"].ravel(), mat["Y"].ravel()
    if len(xs) != len(ys) or len(xs) == 0:
        raise DataError(f"{str(p)!r}: X has {len(xs)} cells but Y has {len(ys)}; "
                        "expected one (X, Y) pair per school")
    rng = np.random.default_rng(seed)
    silos = []
    for k, (X, y) in enumerate(zip(xs, ys)):
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64).ravel()
        if X.ndim != 2 or X.shape[1] != NUM_FEATURES:
            raise DataError(f"{str(p)!r}: school {k} has X of shape {X.shape}, expected "
                            f"(n, {NUM_FEATURES})")
        y = (y - SCORE_MIN) / (SCORE_MAX - SCORE_MIN)
        silos.append(split_silo(f"school-{k:03d}", X, y, test_fraction, rng))
    names = [f"x{j:02d}" for j in range(NUM_FEATURES)]
    fed = Federation(silos, names, "regression", name="school",
                     meta={"source": str(p), "target_scaling": "(score - 1) / 69",
                           "standardized": bool(standardize), "seed": seed,
                           "test_fraction": test_fraction})
    return standardize_federation(fed) if standardize else fed
