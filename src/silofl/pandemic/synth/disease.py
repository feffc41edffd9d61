"""Step 7 of the generator: a discrete-time SIR outbreak on the daily repeating contact graph."""

from __future__ import annotations

import numpy as np

from silofl.data.ids import sorted_unique
from silofl.pandemic.synth.params import _H, A_HOME, OutbreakParams

#: infection day of persons never infected
NEVER = np.iinfo(np.int32).max


def _csr(src: np.ndarray, dst: np.ndarray, N: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Adjacency of the undirected contact rows: (neighbour, contact id, indptr), rows by person."""
    E = src.size
    key = np.empty(2 * E, np.int64)  # (person << 32) | slot, slot < E: src end, else dst end
    key[:E] = src
    key[E:] = dst
    key <<= 32
    key[:E] |= np.arange(E, dtype=np.int64)
    key[E:] |= np.arange(E, 2 * E, dtype=np.int64)
    indptr = np.zeros(N + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=N) + np.bincount(dst, minlength=N), out=indptr[1:])
    key.sort()
    key &= 0xFFFFFFFF
    slot = key.astype(np.int32) if 2 * E < (1 << 31) else key
    del key
    from_src = slot < E
    eid = np.where(from_src, slot, slot - E).astype(np.int32 if E < (1 << 31) else np.int64)
    del slot
    nbr = np.where(from_src, dst[eid], src[eid])
    return nbr, eid, indptr


def simulate(network: dict[str, np.ndarray], age: np.ndarray, region: np.ndarray, N: int, T: int,
              prm: OutbreakParams,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Discrete-time SIR on the (daily repeating) contact graph.

    Returns each person's first infectious day and first day no longer
    infectious (``NEVER`` if never infected; seeds may start before day 0),
    and the asymptomatic flag.
    """
    src, dst = network["src"], network["dst"]
    hours = (network["duration"].astype(np.float32) / np.float32(_H))
    home = (network["activity1"] == A_HOME) & (network["activity2"] == A_HOME)
    # CSR over both directions, built with ~12 bytes per contact row at the peak:
    # row r of the CSR is contact eid[r] seen from one end, nbr[r] the other end
    nbr, eid, indptr = _csr(src, dst, N)

    a = age.astype(np.int16)
    susc = np.select([a < 10, a < 20, a < 60], [0.5, 0.7, 1.0], 1.3).astype(np.float32)
    start = np.full(N, NEVER, np.int32)  # first infectious day
    end = np.full(N, NEVER, np.int32)  # first day no longer infectious
    asym = np.zeros(N, bool)
    Lmin, Lmax = prm.infectious_days_min, prm.infectious_days_max

    def infect(idx: np.ndarray, day: int | np.ndarray):
        n = idx.size
        length = rng.integers(Lmin, Lmax + 1, n)
        start[idx] = day
        end[idx] = np.asarray(day) + length
        asym[idx] = rng.random(n) < prm.asymptomatic_fraction

    # small populations get a floor of seeds and imports so their outbreaks behave like large ones
    n0 = min(N, max(prm.min_initial_infected, round(prm.initial_infected_fraction * N)))
    import_mean = max(prm.importation_rate * N, prm.min_importations_per_day)
    seeds = rng.choice(N, size=n0, replace=False)
    infect(seeds, -rng.integers(0, Lmin, n0))
    n_regions = int(region.max()) + 1 if N else 1
    region_size = np.maximum(np.bincount(region, minlength=n_regions), 1)
    for t in range(T - 1):
        active = np.flatnonzero((start <= t) & (t < end))
        # awareness: people cut contacts as recorded (symptomatic) prevalence in their region rises
        recorded = np.bincount(region[active[~asym[active]]], minlength=n_regions) / region_size
        damp = (1.0 / (1.0 + prm.awareness * recorded)).astype(np.float32)
        new_parts = []
        if active.size:
            lo, hi = indptr[active], indptr[active + 1]
            cnt = hi - lo
            tot = int(cnt.sum())
            if tot:
                rep = np.repeat(np.arange(active.size), cnt)
                pos = np.arange(tot) - np.repeat(np.cumsum(cnt) - cnt, cnt) + lo[rep]
                tgt = nbr[pos]
                sus = start[tgt] == NEVER
                pos, tgt, rep = pos[sus], tgt[sus], rep[sus]
                e = eid[pos]
                srcp = active[rep]
                f = np.where(asym[srcp], prm.asymptomatic_infectivity, 1.0)
                isolating = (~asym[srcp]) & (t > start[srcp]) & ~home[e]
                f = np.where(isolating, f * prm.isolation_factor, f)
                lam = prm.beta_per_hour * hours[e] * susc[tgt] * f * damp[region[tgt]]
                hit = rng.random(tgt.size) < -np.expm1(-lam)
                new_parts.append(tgt[hit])
        k = rng.poisson(import_mean)
        if k:
            new_parts.append(rng.integers(0, N, k))
        if new_parts:
            new = sorted_unique(np.concatenate(new_parts))
            new = new[start[new] == NEVER]
            if new.size:
                infect(new, t + 1)
    return start, end, asym


def states_matrix(start: np.ndarray, end: np.ndarray, asym: np.ndarray, T: int) -> np.ndarray:
    """Recorded (N, T) int8 states: 0 S, 1 I, 2 R; asymptomatic cases stay S throughout."""
    N = start.size
    states = np.zeros((N, T), np.int8)
    d = np.arange(T, dtype=np.int32)[None, :]
    step = 1 << 20
    for lo in range(0, N, step):
        s = start[lo:lo + step, None]
        e = end[lo:lo + step, None]
        blk = (d >= s).astype(np.int8) + (d >= e).astype(np.int8)
        blk[asym[lo:lo + step]] = 0
        states[lo:lo + step] = blk
    return states


