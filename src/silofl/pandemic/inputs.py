"""What the per-region model sees: pooled or summarized neighbourhood examples and their scaling.

Every input is a deterministic function of one person's gathered example (their own row and
their ≤ S − 1 pruned neighbours), so the node-level accounting does not depend on the pooling.
"""

from __future__ import annotations

import numpy as np

from silofl.pandemic.features import N_STATES, NeighbourhoodFeatures

POOLINGS = ("summary", "mean", "concat")


#: Columns of `summary_inputs`.  "infectious" = recorded I on the last history day;
#: "recent" = recorded I on any of the last 7 days; "new" = turned S → I within the last
#: 7 days; hours = the duration of the pair's longest contact (the edge kept by
#: `graph.dedupe_contacts`; not the pair's total time), in hours; home = that contact's
#: location has none of the activity flags (a residence).  Neighbours are the pruned
#: ones (≤ S − 1); tests/pandemic/test_learning.py recounts all of this from raw records.
SUMMARY_FEATURES = (
    "own_susceptible", "occupied_slots", "log_contact_hours",
    "log_n_infectious", "log_n_recent", "log_n_new",
    "log_hours_infectious", "log_hours_recent", "log_hours_new",
    "n_home_infectious", "n_home_recent", "n_home_new",
)


RECENT_DAYS = 7


def summary_inputs(F: NeighbourhoodFeatures, X: np.ndarray) -> np.ndarray:
    """(B, 12) recent-infection summaries of gathered examples X (B, D), columns
    `SUMMARY_FEATURES`: whether the person is still susceptible, how many neighbour slots
    are filled and the total contact time, and — for neighbours infectious now, recently
    or newly infected — their number, the contact hours with them and how many of them
    are household contacts.  Counts are summed over the slots (not averaged: the risk
    grows with the number of infectious contacts) and log1p-compressed.  A deterministic
    function of the example, so the node-level accounting is unchanged."""
    b, tw, dn, de = X.shape[0], F.t_window, F.d_node, F.d_edge
    own_last = X[:, dn + (tw - 1) * N_STATES]                  # own state S on the last day
    blocks = X[:, F.own_dim:].reshape(b, F.num_slots, F.block_dim)
    occupied = 1.0 - blocks[:, :, 0].astype(np.float64)
    edge = blocks[:, :, 1 + dn:1 + dn + de]
    hist = blocks[:, :, 1 + dn + de:].reshape(b, F.num_slots, tw, N_STATES)
    k = min(RECENT_DAYS, tw)
    infectious = hist[:, :, -1, 1].astype(np.float64)
    recent = hist[:, :, -k:, 1].max(axis=2).astype(np.float64)
    if tw > 1:
        k = min(RECENT_DAYS, tw - 1)
        new = (hist[:, :, -k - 1:-1, 0] * hist[:, :, -k:, 1]).max(axis=2).astype(np.float64)
    else:
        new = np.zeros_like(infectious)
    st = F.edge_stats  # undo the log-duration standardization of `_edge_features`
    seconds = np.expm1(edge[:, :, 1].astype(np.float64) * st["dur_std"] + st["dur_mean"])
    hours = occupied * np.maximum(seconds, 0.0) / 3600.0
    flags = edge[:, :, 3:de - 3]  # location activity flags (then lon, lat, unknown)
    home = occupied * ((flags.sum(axis=2) == 0) & (edge[:, :, de - 1] == 0))
    cols = [own_last.astype(np.float64), occupied.mean(axis=1),
            np.log1p(hours.sum(axis=1))]
    cols += [np.log1p(s.sum(axis=1)) for s in (infectious, recent, new)]
    cols += [np.log1p((s * hours).sum(axis=1)) for s in (infectious, recent, new)]
    cols += [(s * home).sum(axis=1) for s in (infectious, recent, new)]
    return np.stack(cols, axis=1).astype(np.float32)


def model_inputs(F: NeighbourhoodFeatures, X: np.ndarray, pooling: str) -> np.ndarray:
    """The model's view of gathered examples (B, D).  "summary": `summary_inputs`.
    "mean" averages the neighbour blocks (features, contact features, infection history,
    empty-slot flag), which a linear model can use far better than S − 1 separately
    weighted slots, with ~10× fewer parameters (so less DP noise).  "concat": the
    example as gathered.  Each example still depends only on the person and its ≤ S − 1
    pruned neighbours, so the node-level accounting is unchanged."""
    if pooling == "concat":
        return X
    if pooling == "summary":
        return summary_inputs(F, X)
    blocks = X[:, F.own_dim:].reshape(X.shape[0], F.num_slots, F.block_dim)
    return np.concatenate([X[:, :F.own_dim], blocks.mean(1)], axis=1)


def input_dim(F: NeighbourhoodFeatures, pooling: str) -> int:
    if pooling == "summary":
        return len(SUMMARY_FEATURES)
    return F.dim if pooling == "concat" else F.own_dim + F.block_dim


#: Declared (centre, scale) of every `SUMMARY_FEATURES` column (preprocessing="declared"):
#: public numbers, rounded from the per-region statistics of three outbreaks of the public
#: generator (`synth`: 4k seed 7, 10k seed 3, 20k seed 1 — the first two are the test
#: outbreaks, so test figures may flatter them), never from a real silo's data.  Their
#: reasoning: almost everyone is still
#: susceptible; a fraction of occupied slots lies in [0, 1]; about e^3.5 ≈ 30 contact
#: hours per person; infection around a person is rare, so the infection columns are
#: near 0 with small spreads (the scale of a rare event), which gives them the weight
#: they need in the equal-weight prior.  On real data they are a public guess.
SUMMARY_DECLARED: dict[str, tuple[float, float]] = {
    "own_susceptible": (1.0, 0.1), "occupied_slots": (0.5, 0.3),
    "log_contact_hours": (3.5, 1.0),
    "log_n_infectious": (0.0, 0.1), "log_n_recent": (0.0, 0.1), "log_n_new": (0.0, 0.1),
    "log_hours_infectious": (0.0, 0.2), "log_hours_recent": (0.0, 0.2),
    "log_hours_new": (0.0, 0.2),
    "n_home_infectious": (0.0, 0.05), "n_home_recent": (0.0, 0.05), "n_home_new": (0.0, 0.05),
}


SUMMARY_DECLARED_SOURCE = (
    "centre/scale per summary column rounded from synthetic outbreaks of the public "
    "generator (silofl pandemic synth), not from the data trained on: own_susceptible "
    "1/0.1, occupied_slots 0.5/0.3, log_contact_hours 3.5/1, infection counts 0/0.1, "
    "infection hours 0/0.2, household infections 0/0.05")


def declared_input_scaling(F: NeighbourhoodFeatures,
                           pooling: str) -> tuple[np.ndarray, np.ndarray]:
    """(shift, scale) of the model inputs from declared constants: `SUMMARY_DECLARED`
    for summary inputs; for "mean"/"concat" the identity (their columns are already
    normalized by the feature constants, or one-hot)."""
    if pooling == "summary":
        c = np.array([SUMMARY_DECLARED[k] for k in SUMMARY_FEATURES], dtype=np.float64)
        return c[:, 0].copy(), c[:, 1].copy()
    d = input_dim(F, pooling)
    return np.zeros(d), np.ones(d)


_SCALING_SAMPLE = 20_000


def fit_input_scaling(F: NeighbourhoodFeatures, pooling: str, seed: int,
                      max_persons: int = _SCALING_SAMPLE,
                      batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation (1 where a column is constant) of each model-input
    column over the region's examples, at one random training window per person (up to
    ``max_persons`` persons, a seeded sample).  Features only, no labels — and **not
    charged** to any accountant: preprocessing="uncharged" only, listed as such."""
    rng = np.random.default_rng([int(seed), 0x5CA1E])
    n = F.num_nodes
    persons = np.arange(n) if n <= max_persons else np.sort(
        rng.choice(n, size=max_persons, replace=False))
    windows = F.sample_windows(rng, n)
    total = np.zeros(input_dim(F, pooling))
    total_sq = np.zeros_like(total)
    for lo in range(0, persons.size, batch_size):
        p = persons[lo:lo + batch_size]
        Z = model_inputs(F, F.gather(p, windows[p], labels=False)[0], pooling)
        Z = Z.astype(np.float64)
        total += Z.sum(axis=0)
        total_sq += np.einsum("bd,bd->d", Z, Z)
    mean = total / persons.size
    std = np.sqrt(np.maximum(total_sq / persons.size - mean ** 2, 0.0))
    return mean, np.where(std > 1e-6, std, 1.0)


def fold_scaling(w: np.ndarray, shift: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Weights [v, c] acting on (x − shift) / scale → weights acting on raw x."""
    v = w[:-1] / scale
    return np.concatenate([v, [w[-1] - v @ shift]])
