"""The small three-hospital table the bad-input corpora and the newcomer review share."""

from __future__ import annotations

import numpy as np
import pandas as pd

SILOS = ("north", "south", "east")


def three_silo_frame(n: int = 30, seed: int = 0,
                     colours: tuple[str, str, str] = ("red", "green", "blue")) -> pd.DataFrame:
    """`n` rows per hospital: a numeric x, a categorical colour and an outcome (x > 0) with
    both classes present in every silo."""
    rng = np.random.default_rng(seed)
    parts = []
    for h in SILOS:
        x = rng.normal(size=n).round(3)
        y = (x > 0).astype(int)
        y[:2] = [0, 1]
        parts.append(pd.DataFrame({"hospital": h, "x": x, "colour": rng.choice(colours, n),
                                   "outcome": y}))
    return pd.concat(parts, ignore_index=True)
