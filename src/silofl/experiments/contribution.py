"""The contribution report of a Weight Erosion run: for the user silo u, how much each other
silo's released updates helped u, from what the server already saw — no extra training, no
read of another silo's data, no extra privacy cost.

What is used. Per round t, Weight Erosion's `round_log` (`algorithms/weight_erosion.py`):
the broadcast model w_t (P,), the released DP gradients g_{t,i} (K, P) (NaN rows: not
received), the weights α_{t,i} after the round's erosion (the ones the round's step used)
and the step size η_t. Everything in it is a DP release or post-processing of one, so the
report costs the other silos nothing. The user adds its own held-out rows (the rows the data
split keeps out of training) to score models: those numbers are the user's own evaluation,
NOT privatized — they stay with the user; sharing the report releases numbers computed from
the user's test rows.

Utility (round-reconstructed models, as gradient-based Shapley in federated learning:
Song, Tong & Wei, "Profit allocation for federated learning", IEEE Big Data 2019 (the
multi-round "MR" construction) and Liu et al., "GTG-Shapley: efficient and accurate
participant contribution evaluation in federated learning", ACM TIST 13(4), 2022, whose
per-round reconstruction w_t + aggregate of the coalition's updates we follow). For a
coalition S of the other silos, round t reconstructs the step the server would have taken
had only S ∪ {u} sent gradients:

    A_t(S) = (S ∪ {u}) ∩ {i received in round t, α_{t,i} > 0}
    ḡ_t(S) = Σ_{i ∈ A_t(S)} α_{t,i} g_{t,i} / Σ_{i ∈ A_t(S)} α_{t,i}
    v_t(S) = L_u(w_t) − L_u(w_t − η_t ḡ_t(S))        (0 if u's gradient was not received)
    V(S)   = Σ_t v_t(S)

L_u is the mean per-example training loss of the model (cross-entropy, squared error, …;
no regularizer) on the user's held-out rows. v_t is the drop of the user's test loss that
round's step would give, starting every round from the model actually broadcast (GTG's
reconstruction; a coalition's own trajectory would need re-training). With the α-weighted
mean rule, A_t(all) reproduces the executed step. V(∅) is what the user's own gradients
alone give; the game is over the K − 1 other silos (the user is always in).

* Leave-one-out: LOO_i = V(all) − V(all \\ {i}).
* Shapley: φ_i = Σ_{S ∌ i} |S|!(n − |S| − 1)!/n! · [V(S ∪ {i}) − V(S)], n = K − 1; since V
  is a sum over rounds, φ_i = Σ_t φ_{t,i} (per-round values are reported too), and
  Σ_i φ_i = V(all) − V(∅) (efficiency). Exact enumeration of all 2^n coalitions for
  n ≤ `max_exact` (10: 1024 coalitions × rounds evaluations); beyond, permutation Monte
  Carlo (Castro, Gómez & Tejada, Computers & OR 36(5), 2009): `permutations` uniformly
  random orders (seeded: estimator randomness, not DP noise), the same order for every
  round, φ_i = mean over orders of i's marginal contribution to V, standard error =
  sample s.d. / √permutations. No truncation (GTG's truncations trade a bias the s.e.
  would not show for speed we do not need). Every order's marginals sum to V(all) − V(∅),
  so the estimate is efficient exactly.

A silo whose α reached 0 or whose update was not received is a null player in that round.
With a robust aggregation rule the executed step was not the α-weighted mean; the report
still values the α-weighted mean reconstruction and says so.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from silofl.config import config_from_dict
from silofl.data.preprocess import apply_preprocessing
from silofl.errors import ConfigError, DataError
from silofl.experiments import build
from silofl.io import write_npz_atomic
from silofl.models.glm import GLM
from silofl.privacy.ledger import silo_file_id

MAX_EXACT = 10           # exact Shapley up to 10 other silos (2^10 coalitions)
PERMUTATIONS = 200       # Monte-Carlo orders beyond
ROUND_LOGS = "round_logs"  # folder of an erosion run directory: one <user>.npz per user
LOG_FORMAT = 1
#: round logs bigger than this are not saved (the report is still made in memory)
MAX_LOG_BYTES = 256 * 2**20

USER_EVAL_NOTE = ("for the user silo: LOO and Shapley values are computed from the user's "
                  "held-out test rows and are not privatized; sharing this report releases "
                  "numbers computed from the user's test rows")
ZERO_COST_NOTE = ("zero privacy cost for the other silos: computed only from the updates "
                  "their Weight Erosion run already released (gradients, α, the broadcast "
                  "models: DP releases when the run was private); no training, no read of "
                  "another silo's data, nothing charged")
HOW_TEXT = (
    "Each round t starts from the model w_t the server broadcast. For a coalition S of the "
    "other silos, the step is rebuilt from the released gradients of S and the user (those "
    "received that round and still holding weight), weighted by the round's α: ḡ_t(S) = "
    "Σ α_i g_i / Σ α_i. Its value is the drop of the user's mean test loss, v_t(S) = "
    "L(w_t) − L(w_t − η_t ḡ_t(S)), summed over rounds: V(S) = Σ_t v_t(S) (the round-"
    "reconstructed models of gradient-based Shapley: Song et al. 2019, GTG-Shapley, Liu et "
    "al. 2022). Leave-one-out = V(all) − V(all without the silo). Shapley = the silo's "
    "average marginal contribution to V over all orders of the other silos; the values add "
    "up to V(all) − V(user alone). Positive: the silo's updates lowered the user's test "
    "loss; negative: they raised it. The user is always in every coalition.")


# --- the released round log ---------------------------------------------------------------

@dataclass
class RoundLog:
    """What the server saw and released in one user's Weight Erosion run, per round t."""
    params: np.ndarray   # (R, P) broadcast model w_t
    grads: np.ndarray    # (R, K, P) released gradients; NaN rows: not received
    alpha: np.ndarray    # (R, K) α after round t's erosion (its step's weights; NaN: not
    #                      joined yet)
    lr: np.ndarray       # (R,) step size η_t
    present: np.ndarray  # (R, K) bool: update received (finite and, if logged, present)

    @property
    def rounds(self) -> int:
        return int(self.lr.shape[0])

    @classmethod
    def from_rounds(cls, round_log: list[dict]) -> RoundLog:
        """From `WeightErosion.round_log` (a `present` (K,) key is used when there)."""
        if not round_log:
            raise DataError("the Weight Erosion run logged no rounds: nothing to value")
        params = np.stack([np.asarray(r["params"], float) for r in round_log])
        grads = np.stack([np.asarray(r["grads"], float) for r in round_log])
        alpha = np.stack([np.asarray(r["alpha"], float) for r in round_log])
        lr = np.array([float(r["lr"]) for r in round_log])
        present = np.isfinite(grads).all(axis=2)
        for t, r in enumerate(round_log):
            if r.get("present") is not None:
                present[t] &= np.asarray(r["present"], bool)
        return cls(params, grads, alpha, lr, present)

    def check(self, num_silos: int, num_params: int, where: str) -> None:
        R = self.rounds
        shapes = {"params": (R, num_params), "grads": (R, num_silos, num_params),
                  "alpha": (R, num_silos), "present": (R, num_silos)}
        for name, shape in shapes.items():
            if getattr(self, name).shape != shape:
                raise DataError(f"{where}: {name} has shape {getattr(self, name).shape}, "
                                f"expected {shape} (K = {num_silos} silos, P = {num_params} "
                                "parameters); the round log does not belong to this run")
        if not (np.isfinite(self.params).all() and np.isfinite(self.lr).all()):
            raise DataError(f"{where}: non-finite broadcast model or step size (the run "
                            "diverged?); no contribution report can be built from it")


# --- games and Shapley values (pure functions of a value function) ---------------------------

def _as_rounds(x) -> np.ndarray:
    return np.atleast_1d(np.asarray(x, dtype=float))


def shapley_exact(n: int, value, progress=None) -> tuple[np.ndarray, np.ndarray]:
    """Exact Shapley values of the game `value(mask) -> float or (R,)` over n players
    (player j is bit j of the int `mask`). Returns (φ (n,), per-component φ (R, n)); φ sums
    to value(all) − value(∅). `progress(done, total)` is called as coalitions are valued."""
    masks = np.arange(2 ** n)
    V = []
    for m in masks:
        V.append(_as_rounds(value(int(m))))
        if progress and (m % 64 == 63 or m == masks[-1]):
            progress(int(m) + 1, len(masks))
    V = np.stack(V)                                                     # (2^n, R)
    sizes = np.array([bin(int(m)).count("1") for m in masks])
    w = np.array([math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n)
                  for s in range(n)])
    per = np.zeros((V.shape[1], n))
    for j in range(n):
        without = masks[(masks >> j) & 1 == 0]
        per[:, j] = (w[sizes[without]][:, None] * (V[without | (1 << j)] - V[without])).sum(0)
    return per.sum(0), per


def shapley_permutation(n: int, value, permutations: int = PERMUTATIONS, seed: int = 0,
                        progress=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Permutation Monte-Carlo Shapley values (Castro et al. 2009) of `value` over n
    players: (φ (n,), standard error (n,), per-component φ (R, n)). Each order's marginal
    contributions sum to value(all) − value(∅), so the estimate does too.
    `progress(done, total)` is called after every order."""
    if permutations < 2:
        raise ConfigError(f"permutations must be ≥ 2 (for a standard error), got "
                          f"{permutations}")
    rng = np.random.default_rng(seed)
    cache: dict[int, np.ndarray] = {}

    def v(m: int) -> np.ndarray:
        if m not in cache:
            cache[m] = _as_rounds(value(m))
        return cache[m]
    R = v(0).shape[0]
    marg = np.zeros((permutations, R, n))
    for p in range(permutations):
        mask, prev = 0, v(0)
        for j in rng.permutation(n):
            mask |= 1 << int(j)
            cur = v(mask)
            marg[p, :, j] = cur - prev
            prev = cur
        if progress:
            progress(p + 1, permutations)
    total = marg.sum(1)                                                 # (T, n)
    return (total.mean(0), total.std(0, ddof=1) / math.sqrt(permutations), marg.mean(0))


def leave_one_out(n: int, value) -> np.ndarray:
    """(n,) value(all) − value(all without player j), summed over components."""
    full = (1 << n) - 1
    top = _as_rounds(value(full)).sum()
    return np.array([top - _as_rounds(value(full & ~(1 << j))).sum() for j in range(n)])


class ReconstructionGame:
    """v(S) per round (see the module docstring) for user `user` over the other silos;
    bit j of a coalition mask is `others[j]`. Cached; reads only `log` and (X, y), the
    user's held-out rows."""

    def __init__(self, model, log: RoundLog, user: int, X: np.ndarray, y: np.ndarray):
        self.model, self.log, self.user, self.X, self.y = model, log, user, X, y
        K = log.alpha.shape[1]
        self.others = [k for k in range(K) if k != user]
        # weights a round's step gives each silo; 0 where not received or eroded away
        # (α is NaN for a silo that has not joined yet: no weight)
        self.weights = np.where(log.present & np.isfinite(log.alpha), log.alpha, 0.0)
        self.grads = np.where(log.present[:, :, None], log.grads, 0.0)  # NaN rows → 0
        self.stepped = log.present[:, user] & (self.weights[:, user] > 0)
        self.base = self.losses(log.params)                             # (R,) L_u(w_t)
        self.evaluations = 0
        self._cache: dict[int, np.ndarray] = {}

    def loss(self, w: np.ndarray) -> float:
        """Mean per-example loss of parameters w (P,) on the user's held-out rows."""
        return float(np.mean(self.model.loss(w, self.X, self.y)))

    def losses(self, W: np.ndarray) -> np.ndarray:
        """(M,) mean losses of parameters W (M, P): one batched call for single-output
        GLMs (their logits take a leading axis), else one call per row."""
        if isinstance(self.model, GLM) and self.model.outputs == 1 and self.X.ndim == 2:
            z = self.model.logits(W, self.X)                              # (M, n)
            return np.mean(self.model.loss_from_logits(z, self.y[None, :]), axis=1)
        return np.array([self.loss(w) for w in W])

    def members(self, mask: int) -> np.ndarray:
        m = np.zeros(self.weights.shape[1], bool)
        m[self.user] = True
        for j, k in enumerate(self.others):
            m[k] = bool((mask >> j) & 1)
        return m

    def __call__(self, mask: int) -> np.ndarray:
        if mask in self._cache:
            return self._cache[mask]
        t = np.flatnonzero(self.stepped)
        w = (self.weights * self.members(mask))[t]                       # (R', K)
        gbar = np.einsum("rk,rkp->rp", w, self.grads[t]) / w.sum(1)[:, None]
        out = np.zeros(self.log.rounds)
        out[t] = self.base[t] - self.losses(self.log.params[t] - self.log.lr[t, None] * gbar)
        self.evaluations += t.size
        if not np.isfinite(out).all():
            raise DataError("a reconstructed model has a non-finite loss on the user's test "
                            "rows (the run diverged?); lower the step size and run again")
        self._cache[mask] = out
        return out


# --- the report -------------------------------------------------------------------------------

@dataclass
class Contribution:
    """Contribution of every other silo to the user's Weight Erosion model."""
    user: str
    silos: list[str]             # all K silos, federation order
    others: list[str]            # the players, in federation order
    method: str                  # "exact" | "permutation"
    loo: np.ndarray              # (n,)
    shapley: np.ndarray          # (n,)
    shapley_se: np.ndarray       # (n,) 0 for exact
    per_round: np.ndarray        # (R, n) per-round Shapley values
    v_all: float                 # V(all)
    v_alone: float               # V(∅): the user's own gradients alone
    user_loss: np.ndarray        # (R,) L_u(w_t), the user's test loss of the broadcast models
    alpha: np.ndarray            # (R, K)
    evaluations: int             # model evaluations on the user's rows
    permutations: int | None = None
    seed: int | None = None
    aggregation: str = "mean"
    ndoye: dict[str, int] | None = None
    ndoye_source: str | None = None
    notes: list[str] = field(default_factory=list)

    def rows(self) -> list[dict]:
        a = self.alpha[-1]
        return [{"silo": s, "final_alpha": float(a[self.silos.index(s)]),
                 "ndoye_rank": (self.ndoye or {}).get(s), "loo": float(self.loo[j]),
                 "shapley": float(self.shapley[j]), "shapley_se": float(self.shapley_se[j])}
                for j, s in enumerate(self.others)]

    def to_dict(self) -> dict:
        return {"user": self.user, "silos": self.silos, "others": self.others,
                "method": self.method, "permutations": self.permutations,
                "seed": self.seed, "rows": self.rows(),
                "v_all": self.v_all, "v_user_alone": self.v_alone,
                "efficiency_gap": float(self.shapley.sum() - (self.v_all - self.v_alone)),
                "per_round_shapley": self.per_round.tolist(),
                "user_test_loss": self.user_loss.tolist(), "alpha": self.alpha.tolist(),
                "model_evaluations": self.evaluations, "aggregation": self.aggregation,
                "ndoye_source": self.ndoye_source, "utility": HOW_TEXT,
                "privacy": ZERO_COST_NOTE, "notes": self.notes}


def contribution(model, log: RoundLog, silos: list[str], user: str, X: np.ndarray,
                 y: np.ndarray, *, max_exact: int = MAX_EXACT,
                 permutations: int = PERMUTATIONS, seed: int = 0, aggregation: str = "mean",
                 ranking: dict | None = None, notes=(), progress=None) -> Contribution:
    """LOO and Shapley values of every silo other than `user` (see the module docstring)
    from the released round log `log` and the user's held-out rows X (n, …), y (n,).
    `progress(done, total, unit)`: coalitions (exact) or orders (Monte Carlo) done."""
    if user not in silos:
        raise ConfigError(f"unknown user silo {user!r}; silos are: {', '.join(silos)}")
    if len(silos) < 2:
        raise ConfigError("a contribution report needs the user and at least one other silo")
    if len(y) == 0:
        raise DataError(f"user {user!r} has no held-out rows to evaluate on; raise "
                        "data.test_fraction")
    if isinstance(max_exact, bool) or not isinstance(max_exact, int) \
            or not 1 <= max_exact <= 20:
        raise ConfigError(f"max_exact must be an integer in 1..20 (exact Shapley values "
                          f"2^max_exact coalitions), got {max_exact!r}")
    if isinstance(permutations, bool) or not isinstance(permutations, int) \
            or permutations < 2:
        raise ConfigError(f"permutations must be an integer ≥ 2 (for a standard error), got "
                          f"{permutations!r}")
    u = silos.index(user)
    log.check(len(silos), model.num_params, f"round log of user {user!r}")
    game = ReconstructionGame(model, log, u, np.asarray(X), np.asarray(y))
    n = len(game.others)
    if n <= max_exact:
        phi, per = shapley_exact(n, game, progress and (
            lambda d, t: progress(d, t, "coalitions")))
        se, method, perms, s = np.zeros(n), "exact", None, None
    else:
        phi, se, per = shapley_permutation(n, game, permutations, seed, progress and (
            lambda d, t: progress(d, t, "orders")))
        method, perms, s = "permutation", permutations, seed
    loo = leave_one_out(n, game)
    full = (1 << n) - 1
    extra = [] if aggregation == "mean" else [
        f"the run aggregated with {aggregation!r}, not the α-weighted mean: the values are "
        "those of the α-weighted mean reconstruction, which does not reproduce the executed "
        "steps"]
    c = Contribution(user, list(silos), [silos[k] for k in game.others], method, loo, phi, se,
                     per, float(game(full).sum()), float(game(0).sum()), game.base,
                     log.alpha, game.evaluations, perms, s, aggregation,
                     notes=[USER_EVAL_NOTE, ZERO_COST_NOTE, *extra, *notes])
    if ranking is not None:
        c.ndoye, c.ndoye_source = ndoye_ranks(ranking, user, silos)
    return c


# --- Ndoye ranks from a `silofl rank` output ---------------------------------------------------

def load_ranking(path: str | Path) -> dict:
    """`ranking.json` of a `silofl rank` run directory (or the file itself)."""
    path = Path(path)
    f = path / "ranking.json" if path.is_dir() else path
    if not f.is_file():
        raise ConfigError(f"{str(path)!r} is not a `silofl rank` run directory (no "
                          "ranking.json); pass the run directory `silofl rank` printed")
    try:
        data = json.loads(f.read_text())
        _ = [(r["rank"], r["silo"]) for r in data["ranking"]], data["user"], data["silos"]
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{str(f)!r} is not a readable ranking.json ({e}); run `silofl rank` "
                        "again") from None
    return data


def ndoye_ranks(ranking: dict, user: str, silos: list[str]) -> tuple[dict[str, int], str]:
    """Rank (1 = most similar) of every silo other than `user`: the ranking itself when it
    was made for `user`, else the user's row of its transfer matrix (an analysis view)."""
    if list(ranking["silos"]) != list(silos):
        raise ConfigError(f"the ranking is for silos {', '.join(ranking['silos'])}, this run "
                          f"has {', '.join(silos)}: rank the same federation")
    if ranking["user"] == user:
        return ({r["silo"]: int(r["rank"]) for r in ranking["ranking"]},
                f"silofl rank --user {user}")
    m = ranking.get("transfer_matrix")
    if m is None:
        raise DataError("ranking.json has no transfer_matrix: run `silofl rank` again")
    u = silos.index(user)
    row = np.array([np.inf if x is None else float(x) for x in m[u]])
    order = [k for k in np.argsort(row, kind="stable") if k != u]
    return ({silos[k]: r + 1 for r, k in enumerate(order)},
            f"row {user!r} of the transfer matrix of silofl rank --user {ranking['user']} "
            "(an analysis view: that row is the user's own unreleased evaluation)")


# --- files ------------------------------------------------------------------------------------

def save_round_log(path: Path, log: RoundLog, meta: dict) -> bool:
    """Write `log` and its JSON `meta` to an .npz; False (nothing written) when it would be
    larger than MAX_LOG_BYTES. Released quantities only: no private data."""
    if log.grads.nbytes + log.params.nbytes > MAX_LOG_BYTES:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_npz_atomic(path, compressed=True, params=log.params, grads=log.grads,
                     alpha=log.alpha, lr=log.lr, present=log.present,
                     meta=np.array(json.dumps(dict(meta, format=LOG_FORMAT))))
    return True


def load_round_log(path: Path) -> tuple[RoundLog, dict]:
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            log = RoundLog(z["params"], z["grads"], z["alpha"], z["lr"],
                           z["present"].astype(bool))
    except (OSError, ValueError, KeyError) as e:
        raise DataError(f"{str(path)!r} is not a readable round log ({e}); run `silofl "
                        "erosion` again") from None
    if meta.get("format") != LOG_FORMAT:
        raise DataError(f"{str(path)!r} has round-log format {meta.get('format')!r}; this "
                        f"silofl reads format {LOG_FORMAT}")
    return log, meta


def private_preprocessing(fed) -> bool:
    """Whether the run's preprocessing released private (noisy) statistics."""
    steps = (fed.meta.get("preprocessing") or {}).get("steps", [])
    return any(st.get("mode") == "private" for st in steps)


def user_constants(fed, user: str) -> dict | None:
    """What turns the user's raw test rows into the model's inputs after private
    preprocessing (clip bounds, fills, center/scale: DP releases, plus any declared or
    uncharged ones, as the run listed them); None without private preprocessing (the rows
    are preprocessed again as the run did, which needs no budget) and for image data."""
    if not private_preprocessing(fed):
        return None
    c = fed.meta.get("constants") or {}
    own = (c.get("silos") or {}).get(user)
    if own is None:
        return None
    return {"feature_names": c["feature_names"], "clip": c.get("clip", {}), **own}


def apply_constants(X: np.ndarray, const: dict | None) -> np.ndarray:
    """Clip, fill and standardize raw rows X (n, d) as the run's preprocessing did."""
    if const is None:
        return X
    X = np.array(X, dtype=np.float64)
    index = {n: j for j, n in enumerate(const["feature_names"])}
    for col, (lo, hi) in const["clip"].items():
        X[:, index[col]] = np.clip(X[:, index[col]], lo, hi)
    for col, fill in const["fill"].items():
        j = index[col]
        X[np.isnan(X[:, j]), j] = fill
    for col, (center, scale) in const["standardize"].items():
        X[:, index[col]] = (X[:, index[col]] - center) / scale
    return X


def from_erosion_dir(run_dir: str | Path, *, ranking: str | Path | None = None,
                     max_exact: int = MAX_EXACT, permutations: int = PERMUTATIONS,
                     seed: int = 0, on_progress=None) -> dict[str, Contribution]:
    """Rebuild every user's report from a `silofl erosion` run directory: its config.toml,
    erosion.json and round_logs/<user>.npz, plus the user's held-out rows loaded again from
    the configured data (the user's own rows; nothing is trained or charged).
    `on_progress(user, done, total, unit)` reports each user's Shapley computation."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{str(run_dir)!r} is not a directory; pass the run directory "
                          "`silofl erosion` printed")
    need = [run_dir / "config.toml", run_dir / "erosion.json", run_dir / ROUND_LOGS]
    missing = [p.name for p in need if not p.exists()]
    if missing:
        raise ConfigError(f"{str(run_dir)!r} is not a `silofl erosion` run directory with "
                          f"round logs (missing {', '.join(missing)}); run `silofl erosion` "
                          "with this silofl version")
    try:
        cfg = config_from_dict(tomllib.loads((run_dir / "config.toml").read_text()))
        info = json.loads((run_dir / "erosion.json").read_text())
        silos, users = list(info["silos"]), list(info["users"])
    except (ValueError, KeyError, TypeError, tomllib.TOMLDecodeError) as e:
        raise DataError(f"{str(run_dir)!r}: config.toml or erosion.json is unreadable ({e}); "
                        "run `silofl erosion` again") from None
    rank = load_ranking(ranking) if ranking is not None else None
    raw = build.apply_privacy(build.load_raw(cfg.data), cfg)
    if raw.names != silos:
        raise DataError(f"the configured data now has silos {', '.join(raw.names)}, the run "
                        f"had {', '.join(silos)}: the data changed since the run")
    model = build.build_model(cfg, raw)
    fed = None  # preprocessed as the run did (no private step: no budget), if needed
    out = {}
    for user in users:
        path = run_dir / ROUND_LOGS / f"{silo_file_id(user)}.npz"
        if not path.is_file():
            raise ConfigError(f"no round log for user {user!r} ({path.name} missing from "
                              f"{ROUND_LOGS}/): it was too large to save, or the run is from "
                              "an older silofl")
        log, meta = load_round_log(path)
        s = raw.silo(user)
        if meta.get("user") != user or meta.get("n_test") != s.n_test:
            raise DataError(f"{path.name}: logged for user {meta.get('user')!r} with "
                            f"{meta.get('n_test')} held-out rows, but user {user!r} now has "
                            f"{s.n_test}: the data changed since the run")
        if meta.get("private_preprocessing"):  # its DP constants were saved with the log
            X = apply_constants(s.X_test, meta.get("constants"))
        else:
            if fed is None:
                plan = build.plan_data(cfg.data, raw, None)
                if plan.private:
                    raise DataError(f"{path.name} was logged without private preprocessing "
                                    "but the config now asks for it: the config changed")
                fed = apply_preprocessing(raw, plan)
            X = fed.silo(user).X_test
        out[user] = contribution(model, log, silos, user, X, s.y_test, max_exact=max_exact,
                                 permutations=permutations, seed=seed,
                                 aggregation=meta.get("aggregation", "mean"), ranking=rank,
                                 notes=meta.get("job_notes", []),
                                 progress=(lambda d, t, unit, _u=user:
                                           on_progress(_u, d, t, unit))
                                 if on_progress else None)
    return out


__all__ = ["Contribution", "ReconstructionGame", "RoundLog", "contribution",
           "from_erosion_dir", "leave_one_out", "load_ranking", "ndoye_ranks",
           "shapley_exact", "shapley_permutation"]
