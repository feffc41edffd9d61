"""`[tuning] mode = "proxy"` in `silofl run`: load the declared public proxy, evaluate the
λ grid on it (non-private, `tuning.proxy`), and put the chosen method in the job — all
before the silos' budget is reserved or their rows are read (the proxy is not theirs).

    [tuning]
    mode = "proxy"
    proxy_source = "table"          # or a built-in source that is not [data] source
    proxy_path = "public_proxy.csv" # a table with [data]'s label and feature columns
    lam = [0.001, 0.01, 0.1, 1, 10]
"""

from __future__ import annotations

import filecmp
import hashlib
import os
from pathlib import Path

import numpy as np

from silofl.config import Config
from silofl.config.base import did_you_mean
from silofl.data.preprocess import apply_preprocessing
from silofl.errors import ConfigError
from silofl.experiments import build
from silofl.models.metrics import default_metric
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.tuning import proxy as P
from silofl.tuning import setup as tuning_setup


def proxy_data_config(cfg: Config):
    """[data] with the proxy's source and path; refuses the silos' own data.

    Parameters
    ----------
    cfg : Config

    Returns
    -------
    DataConfig
        The proxy's data section (every other key as the run's [data]).

    Raises
    ------
    ConfigError
        No proxy declared, lr grid given, or the proxy is the silos' own source or table.
    """
    tc, dc = cfg.tuning, cfg.data
    if not tc.proxy_source:
        raise ConfigError("tuning.mode = 'proxy' needs tuning.proxy_source: a built-in source "
                          "or 'table' (with tuning.proxy_path) that you declare public")
    if tc.lr:
        raise ConfigError("tuning.mode = 'proxy' tunes λ only (the run's lr is shared by "
                          "every method); leave tuning.lr empty")
    if tc.proxy_source not in build.SOURCES:
        near = did_you_mean(tc.proxy_source, build.SOURCES)
        raise ConfigError(f"unknown tuning.proxy_source {tc.proxy_source!r}; choose one of "
                          f"{', '.join(build.SOURCES)} ('table' with tuning.proxy_path)."
                          + (f" Did you mean {near!r}?" if near else ""))
    tuning_setup.validate(tc)
    if tc.proxy_source == "table" and not tc.proxy_path:
        raise ConfigError("tuning.proxy_source = 'table' needs tuning.proxy_path (the public "
                          "table's file)")
    same_path = _same_file(tc.proxy_path, dc.path)
    if tc.proxy_source == dc.source and (same_path or dc.source not in ("table", "school")):
        raise ConfigError(f"tuning proxy (source {tc.proxy_source!r}"
                          f"{', path ' + repr(tc.proxy_path) if tc.proxy_path else ''}) is the "
                          "silos' own data ([data] source/path): a proxy must be public data "
                          "the silos do not hold, or tuning on it is not free. Point "
                          "tuning.proxy_path at a public table, or use tuning.mode = 'private'")
    return dc.model_copy(update={"source": tc.proxy_source, "path": tc.proxy_path})


def _resolved(path: str) -> str:
    return str(Path(path).expanduser().resolve()) if path else ""


def _same_file(a: str, b: str) -> bool:
    """The same file under another name: one resolved path (symlinks), one inode (hard
    links) or byte-identical content (a copy). Compared locally; nothing is output."""
    if not (a and b):
        return False
    if _resolved(a) == _resolved(b):
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    if not (pa.is_file() and pb.is_file()):
        return False
    return os.path.samefile(pa, pb) or filecmp.cmp(pa, pb, shallow=False)


#: a proxy with at least this share of its rows among the silos' rows is refused
OVERLAP_REFUSED = 0.5


def _row_keys(fed) -> list[bytes]:
    """A 16-byte digest of each row's encoded features and label (train and test rows of
    every silo); kept in memory for `check_disjoint`, never written or printed."""
    out = []
    for s in fed.silos:
        for X, y in ((s.X_train, s.y_train), (s.X_test, s.y_test)):
            X = np.ascontiguousarray(np.asarray(X, dtype=np.float64).reshape(len(y), -1))
            y = np.asarray(y, dtype=np.float64)
            out += [hashlib.blake2b(X[i].tobytes() + y[i].tobytes(), digest_size=16).digest()
                    for i in range(len(y))]
    return out


def check_disjoint(praw, raw) -> None:
    """Refuse a proxy that is mostly the silos' own rows (a copy, a re-export, another
    format or silo split of the same table): a local check whose only output is the
    refusal (no count, no hash leaves this function). A proxy with fewer of the silos'
    rows than `OVERLAP_REFUSED`, or with perturbed copies, is not caught: that it is
    public stays the configuration's declaration.

    Parameters
    ----------
    praw : RawFederation
        The proxy, encoded (before preprocessing).
    raw : RawFederation
        The silos' federation, encoded.

    Raises
    ------
    ConfigError
        At least `OVERLAP_REFUSED` of the proxy's rows are rows of the silos.
    """
    proxy = _row_keys(praw)
    if not proxy:
        return
    own = set(_row_keys(raw))
    if sum(k in own for k in proxy) >= OVERLAP_REFUSED * len(proxy):
        raise ConfigError("tuning proxy holds the silos' own rows (a copy of [data] under "
                          "another name, format or silo split): a proxy must be public data "
                          "the silos do not hold, or tuning on it is not free. Point "
                          "tuning.proxy_path at a public table, or use tuning.mode = 'private'")


def proxy_algorithms(cfg: Config, algorithms: list, raw) -> list:
    """Replace tuning.method's algorithm by the one with λ chosen on the proxy.

    Parameters
    ----------
    cfg : Config
    algorithms : list of Algorithm
        As built from training.methods.
    raw : RawFederation
        The silos' raw federation (only its public feature names are read).

    Returns
    -------
    list of Algorithm
    """
    tc = cfg.tuning
    if tc.method not in cfg.training.methods:
        raise ConfigError(f"[tuning] tunes {tc.method!r}, which is not in training.methods "
                          f"{cfg.training.methods}; add it or set tuning.method")
    epsilon = cfg.privacy.epsilon if cfg.privacy.enabled else None
    chosen = proxy_chosen(cfg, raw.feature_names, raw.task, build.training_config(cfg),
                          epsilon, own=raw)
    return [chosen if m == tc.method else a for m, a in zip(cfg.training.methods, algorithms)]


def proxy_chosen(cfg: Config, feature_names, task: str, tcfg, epsilon: float | None,
                 own=None):
    """tuning.method with λ chosen on the declared-public proxy (`silofl run` and sweeps).

    Parameters
    ----------
    cfg : Config
        The job ([data] of the silos, [tuning] naming the proxy).
    feature_names : sequence of str
        The silos' public feature names (the proxy must have the same).
    task : str
        The silos' task.
    tcfg : TrainingConfig
        How the grid trains on the proxy (the run's rounds, batch, lr, seed).
    epsilon : float or None
        The run's per-silo ε: with proxy_noise = "simulated" the proxy trains with that
        noise (None: non-private run, no noise).
    own : RawFederation, optional
        The silos' encoded rows, for `check_disjoint` (None: loaded from cfg.data).

    Returns
    -------
    Algorithm
        `tuning.proxy.chosen_algorithm`: the method at the chosen λ, its report saying the
        proxy is declared public and cost the silos 0.
    """
    tc = cfg.tuning
    pdc = proxy_data_config(cfg)
    try:
        praw = build.load_raw(pdc)
    except ConfigError as e:  # its messages name data.*: say it is the proxy's reading
        where = f", tuning.proxy_path {tc.proxy_path!r}" if tc.proxy_path else ""
        raise ConfigError(f"tuning proxy (tuning.proxy_source {tc.proxy_source!r}{where}, "
                          f"read with [data]'s other keys): {e}") from e
    if list(praw.feature_names) != list(feature_names) or praw.task != task:
        raise ConfigError(f"tuning proxy {tc.proxy_source!r} has features "
                          f"{list(praw.feature_names)[:6]}… (task {praw.task}), the silos "
                          f"{list(feature_names)[:6]}… (task {task}): the proxy needs "
                          "the silos' label and feature columns")
    check_disjoint(praw, build.load_raw(cfg.data) if own is None else own)
    prep = build.plan_data(pdc, praw, None)
    if prep.private:
        raise ConfigError("the proxy is public: set data.standardize/impute to 'auto' or "
                          "'declared' (private preprocessing would spend budget on it)")
    fed = apply_preprocessing(praw, prep, Randomness.for_mode("seeded", [cfg.data.seed, 0x7C0]))
    model = build.build_model(cfg, fed)
    metric = cfg.model.metric or default_metric(fed.task)
    lams = list(tc.lam or tuning_setup.DEFAULT_LAMS)
    target = None
    if tc.proxy_noise == "simulated" and epsilon is not None:
        target = PrivacyTarget(float(epsilon), cfg.privacy.delta)
    scores = P.grid_on_proxy(fed, model, tc.method, lams, tcfg, metric,
                             cfg.training.weighted, target=target)
    lam = P.best_lam(scores, metric)
    info = {"mode": "proxy", "proxy_source": tc.proxy_source, "proxy_path": tc.proxy_path,
            "declared_public": True, "silo_epsilon_spent_on_tuning": 0.0,
            "metric": metric, "grid": scores, "chosen_lam": lam,
            "proxy_noise": "simulated at the run's ε (seeded)" if target else "none",
            "note": "λ chosen non-privately on data declared public; the silos' rows were "
                    "not read for the choice, so it cost them nothing"}
    return P.chosen_algorithm(tc.method, lam, info, cfg.training.weighted)
