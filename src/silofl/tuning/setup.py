"""From a [tuning] config section to the tuning objects, and the validation rows a tuned
`silofl run` scores its trials on.

Validation rows are carved from each silo's *training* rows before planning (so q_k and σ_k
are computed for the rows DP-SGD reads), carried through preprocessing as extra test rows
(test rows are only transformed with the training rows' constants, never used for a
statistic), and split back out afterwards.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from silofl.config.base import did_you_mean
from silofl.data.persons import split_training
from silofl.errors import ConfigError
from silofl.tuning import distributions as D

MODES = ("none", "private", "proxy")
SELECTS = ("random", "em", "subsample")
TUNABLE = ("mrmtl", "ditto")
PROXY_NOISES = ("simulated", "none")
DEFAULT_MEAN_TRIALS = 10.0
#: the default λ grid (`tuning.lam = []`): 5 values a decade apart over MR-MTL's useful
#: range (near-FedAvg 10 … near-local 0.001). Every extra value costs nothing under random
#: h (E[h] fixes the cost) but dilutes each draw: with E[h] = 10 over 5 values each is
#: tried about twice, over the thesis's 10-value grid about once
DEFAULT_LAMS = (0.001, 0.01, 0.1, 1.0, 10.0)


#: the default counted tuning (`select = "subsample"` unless set): TNB η and the score's
#: noise ratio where the config leaves them unset — ≤ 1.4× one run's ε at E[h] = 10, γ = 0.1
#: (docs/guides/tuning.md); "random" keeps the config's own defaults (η 1, ratio 2)
SUBSAMPLE_ETA = 0.0
SUBSAMPLE_SCORE_RATIO = 4.0


def _unset(tc, key: str) -> bool:
    return key not in getattr(tc, "model_fields_set", {key})


def eta_of(tc) -> float:
    """TNB η as run: `SUBSAMPLE_ETA` for select = subsample when tuning.eta is unset."""
    return SUBSAMPLE_ETA if select_of(tc) == "subsample" and _unset(tc, "eta") else tc.eta


def score_ratio_of(tc) -> float:
    """The score's noise ratio as run (`SUBSAMPLE_SCORE_RATIO` for subsample, if unset)."""
    if select_of(tc) == "subsample" and _unset(tc, "score_ratio"):
        return SUBSAMPLE_SCORE_RATIO
    return tc.score_ratio


def distribution(tc) -> D.TrialDistribution:
    """The distribution of h from a TuningConfig (η: `eta_of`)."""
    if tc.distribution == "tnb":
        if tc.mu is not None:
            raise ConfigError("tuning.mu is the Poisson mean; with distribution = 'tnb' give "
                              "eta and gamma or mean_trials")
        mean = tc.mean_trials if tc.mean_trials is not None or tc.gamma is not None \
            else DEFAULT_MEAN_TRIALS
        return D.tnb(eta_of(tc), gamma=tc.gamma, mean=mean)
    if tc.distribution == "poisson":
        if tc.gamma is not None or tc.mean_trials is not None:
            raise ConfigError("with distribution = 'poisson' give tuning.mu (the mean "
                              "number of trials), not gamma or mean_trials")
        return D.poisson(DEFAULT_MEAN_TRIALS if tc.mu is None else tc.mu)
    raise ConfigError(f"tuning.distribution must be 'tnb' or 'poisson', got "
                      f"{tc.distribution!r}.{_near(tc.distribution, ('tnb', 'poisson'))}")


def _near(word: object, choices) -> str:
    """" Did you mean 'x'?" for a near miss (case ignored), else ""."""
    near = did_you_mean(str(word).strip().lower(), list(choices))
    return f" Did you mean {near!r}?" if near else ""


def _one_of(key: str, value: object, choices, what: str = "") -> None:
    """ConfigError "tuning.<key> must be one of …[what], got <value>. Did you mean …?"
    unless `value` is one of `choices`."""
    if value not in choices:
        raise ConfigError(f"tuning.{key} must be one of {', '.join(choices)}{what}, got "
                          f"{value!r}.{_near(value, choices)}")


def select_of(tc) -> str:
    """tuning.select as run: the default "subsample" trains the chosen setting with MR-MTL,
    so Ditto without an explicit `select` is tuned by "random"."""
    if tc.select == "subsample" and tc.method != "mrmtl" and _unset(tc, "select"):
        return "random"
    return tc.select


def validate(tc, *, sweep: bool = False) -> None:
    """Check a TuningConfig before any data is touched (raises ConfigError).

    Parameters
    ----------
    tc : TuningConfig
        The [tuning] section; checked whatever its mode, so a misspelt value is refused
        even where the mode ignores it.
    sweep : bool
        True for a sweep's tuning (its mode is sweep.tuning, not tuning.mode).
    """
    if not sweep:
        _one_of("mode", tc.mode, MODES)
    _one_of("method", tc.method, TUNABLE, " (the methods whose λ can be tuned privately)")
    for name in ("lam", "lr"):
        vals = getattr(tc, name)
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v)
               or v < 0 or (name == "lr" and v == 0) for v in vals):
            raise ConfigError(f"tuning.{name} must list {'positive' if name == 'lr' else 'non-negative'} "
                              f"numbers, got {vals!r}")
    if not tc.pivot_lam >= 0:
        raise ConfigError(f"tuning.pivot_lam (the public λ̄) must be ≥ 0, got {tc.pivot_lam}")
    if not 0 < tc.validation_fraction < 1:
        raise ConfigError(f"tuning.validation_fraction must be in (0, 1), got "
                          f"{tc.validation_fraction}")
    if not tc.score_ratio > 0:
        raise ConfigError(f"tuning.score_ratio must be positive, got {tc.score_ratio}")
    _one_of("select", tc.select, SELECTS)
    if tc.proxy_noise not in PROXY_NOISES:
        raise ConfigError(f"tuning.proxy_noise must be 'simulated' (the grid is trained on "
                          f"the proxy with the run's DP noise) or 'none', got "
                          f"{tc.proxy_noise!r}.{_near(tc.proxy_noise, PROXY_NOISES)}")
    select = select_of(tc)
    if select == "subsample":
        if tc.method != "mrmtl":
            raise ConfigError("tuning.select = 'subsample' trains the chosen setting once "
                              "with MR-MTL; set tuning.method = 'mrmtl' (or select = "
                              "'random' for ditto)")
        f = tc.subsample_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
            raise ConfigError(f"tuning.subsample_fraction (γ: the trials sample each row "
                              f"with probability γ·q per step) must be in (0, 1], got {f!r}")
    if select in ("random", "subsample"):
        from silofl.privacy.selection import check_accountable
        check_accountable(distribution(tc))


def check_with_training(tc, methods: list, lam, unit: str = "example") -> None:
    """Refuse a [tuning] mode that would silently override ``training.lam = "auto"``, and
    private tuning at the person level (its validation scores are per row).

    Parameters
    ----------
    tc : TuningConfig
    methods : training.methods.
    lam : training.lam (a number or "auto").
    unit : [privacy] unit.

    Raises
    ------
    ConfigError
        Both choose λ of the same method.
    """
    if unit == "person" and tc.mode not in ("none", "proxy"):
        raise ConfigError(
            f"tuning.mode = {tc.mode!r} scores trials on held-out rows, one row at a time, "
            "so it is not available with [privacy] unit = \"person\"; use training.lam = "
            "\"auto\" (free), tuning.mode = 'proxy' (declared-public data) or 'none'")
    if tc.mode != "none" and lam == "auto" and tc.method in methods:
        raise ConfigError(
            f"training.lam = \"auto\" and tuning.mode = {tc.mode!r} both choose λ of "
            f"{tc.method!r}: keep one. lam = \"auto\" costs nothing (drop [tuning] or set "
            "tuning.mode = 'none'); to tune instead, set training.lam to a number")


def tuned_algorithm(tc, lams, lrs, validation, weighted: bool = True):
    from silofl.tuning.private import TunedPersonalization
    if not lams:
        raise ConfigError("tuning.lam is empty; list the λ values to try, e.g. "
                          f"lam = {list(DEFAULT_LAMS)}")
    select = select_of(tc)
    if select == "subsample":
        from silofl.tuning.subsample import SubsampleTuned
        return SubsampleTuned(list(lams), distribution(tc), validation,
                              lrs=list(lrs) or None, pivot=tc.method,
                              pivot_lam=tc.pivot_lam, score_ratio=score_ratio_of(tc),
                              weighted=weighted, fraction=tc.subsample_fraction)
    return TunedPersonalization(list(lams), distribution(tc), validation,
                                lrs=list(lrs) or None, pivot=tc.method,
                                pivot_lam=tc.pivot_lam, score_ratio=tc.score_ratio,
                                weighted=weighted, select=select,
                                em_fraction=tc.em_fraction)


# --- `silofl run`: validation rows through preprocessing -------------------------------

def carve_into_test(raw, fraction: float, seed: int):
    """Move `fraction` of each silo's training rows to the end of its test rows. Returns
    (raw', counts (K,)): silo k's last counts[k] test rows are its validation rows."""
    rng = np.random.default_rng([seed, 0x7E57])
    silos, counts = [], []
    for s in raw.silos:
        part = split_training(s, fraction, rng, seed, "validation")  # persons kept whole
        counts.append(len(part.y_test))
        persons = {} if s.person_train is None else dict(
            person_train=part.person_train,
            person_test=np.concatenate([s.person_test, part.person_test]))
        silos.append(dataclasses.replace(
            s, X_train=part.X_train, y_train=part.y_train,
            X_test=np.concatenate([s.X_test, part.X_test]),
            y_test=np.concatenate([s.y_test, part.y_test]), **persons))
    return dataclasses.replace(raw, silos=silos), np.array(counts)


def split_from_test(fed, counts):
    """Undo `carve_into_test` after preprocessing: (fed with its own test rows,
    validation [(X, y)] per silo, transformed like the test rows)."""
    silos, val = [], []
    for s, m in zip(fed.silos, counts):
        cut = len(s.y_test) - int(m)
        val.append((s.X_test[cut:], s.y_test[cut:]))
        silos.append(dataclasses.replace(
            s, X_test=s.X_test[:cut], y_test=s.y_test[:cut],
            person_test=None if s.person_test is None else s.person_test[:cut]))
    return dataclasses.replace(fed, silos=silos), val
