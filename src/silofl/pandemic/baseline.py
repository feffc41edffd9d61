"""The challenge's simple SIR-rate baseline.

Fit one transmission rate β by least squares on the daily new infections,

    new_I[t] ≈ β · I[t−1] · S[t−1] / N,   t = 1 .. window_end − 1,

closed form ``β̂ = Σ x_t new_I[t] / Σ x_t²`` with ``x_t = I[t−1] S[t−1] / N``, where
``new_I[t]`` counts persons with state S on day t−1 and I on day t.  Every person still
susceptible on the last observed day gets the risk of at least one infection in the next
``horizon`` (7) days at a constant daily hazard ``p = β̂ · I / N`` (I on the last observed
day): ``1 − (1 − p)^7``; everyone else gets 0.  All susceptibles share one score, so the
baseline only separates susceptibles from the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from silofl.errors import ConfigError, DataError


@dataclass(frozen=True)
class SirFit:
    beta: float
    susceptible: np.ndarray   # (W,) counts per day
    infected: np.ndarray      # (W,)
    recovered: np.ndarray     # (W,)
    new_infections: np.ndarray  # (W,), entry 0 is 0 (no previous day)


def _states(states, window_end) -> tuple[np.ndarray, int]:
    st = np.asarray(states)
    if st.ndim != 2 or st.shape[0] == 0:
        raise DataError(f"states must be a non-empty (N, T) array, got shape {st.shape}")
    if not np.issubdtype(st.dtype, np.integer) or int(st.min()) < 0 or int(st.max()) > 2:
        raise DataError("states must be integer codes 0=S, 1=I, 2=R")
    t = st.shape[1]
    we = t if window_end is None else window_end
    if isinstance(we, bool) or not isinstance(we, (int, np.integer)) or not 2 <= we <= t:
        raise ConfigError(f"window_end must be an integer day in 2..{t} (at least two "
                          f"observed days to fit β), got {window_end!r}")
    return st, int(we)


def sir_fit(states, window_end: int | None = None) -> SirFit:
    """Least-squares β on days 0..window_end−1 (default: all T days)."""
    st, we = _states(states, window_end)
    obs = st[:, :we]
    n = obs.shape[0]
    s = (obs == 0).sum(axis=0).astype(np.float64)
    i = (obs == 1).sum(axis=0).astype(np.float64)
    r = (obs == 2).sum(axis=0).astype(np.float64)
    new = np.zeros(we, dtype=np.float64)
    new[1:] = ((obs[:, :-1] == 0) & (obs[:, 1:] == 1)).sum(axis=0)
    x = i[:-1] * s[:-1] / n
    denom = float(x @ x)
    beta = float(x @ new[1:] / denom) if denom > 0 else 0.0
    return SirFit(beta=max(beta, 0.0), susceptible=s, infected=i, recovered=r,
                  new_infections=new)


def sir_baseline_scores(states, window_end: int | None = None,
                        horizon: int = 7) -> np.ndarray:
    """(N,) float64 risk of infection within ``horizon`` days after ``window_end``
    (default T: the days after the observed history), 0 for non-susceptibles."""
    st, we = _states(states, window_end)
    if horizon <= 0:
        raise ConfigError(f"horizon must be a positive number of days, got {horizon}")
    fit = sir_fit(st, we)
    n = st.shape[0]
    p = float(np.clip(fit.beta * fit.infected[-1] / n, 0.0, 1.0))
    risk = 1.0 - (1.0 - p) ** horizon
    return np.where(st[:, we - 1] == 0, risk, 0.0)
