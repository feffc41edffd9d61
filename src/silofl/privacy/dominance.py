"""Provable dominance between silos' mechanisms, and the candidate worst-case silo sets.

Used by `person_composition` to find, without composing every subset, which m silos give
a person present in m silos the largest ε.

**Base events.** Write a Gaussian step as (q = 1, σ) and a Poisson-subsampled Gaussian as
(q, σ). (q, σ) *dominates* (q', σ') when q ≥ q' and σ ≤ σ': the pair of output
distributions of (q', σ') is a post-processing of the pair of (q, σ), so every
hypothesis test (hence every (ε, δ), under either neighbouring direction) is at least as
hard for (q', σ'):

* smaller q: the kernel "keep the output with probability q'/q, otherwise replace it by
  a fresh N(0, σ²) draw" maps N(0, σ²) to itself and (1 − q)N(0, σ²) + qN(1, σ²) to the
  same mixture with rate q';
* larger σ: adding independent N(0, σ'² − σ²) noise maps both distributions of σ to those
  of σ'.

Any other base event dominates only itself. **Silos.** A silo's mechanism is the
composition of its base events (a multiset). Silo A dominates silo B when B's steps can be
matched one-to-one to distinct A steps that dominate them (a bipartite matching, solved as
a maximum flow); A's unmatched steps only add privacy loss. Composition preserves the
order (post-process each factor, ignore extra outputs), so replacing a silo of a set by a
silo that dominates it never lowers the set's ε.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import dp_accounting as dpa
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow

from silofl.privacy.adaptive_clip import equivalent
from silofl.privacy.rdp_curves import _is_poisson_gaussian

#: a silo's mechanism as a canonical multiset of base events
Signature = frozenset


def signature(counts: Counter) -> Signature:
    """The canonical multiset of a silo's base events (adaptive-clipping steps as their
    equivalent Gaussian, as the accountants evaluate them).

    Parameters
    ----------
    counts : collections.Counter
        Base event → count (`events.flatten` of the silo's executed events, summed).

    Returns
    -------
    frozenset of (dp_accounting.DpEvent, int)
        Equal for two silos exactly when their compositions are the same multiset.
    """
    merged: Counter = Counter()
    for e, c in counts.items():
        if c > 0:
            merged[equivalent(e)] += c
    return frozenset(merged.items())


def _q_sigma(e: dpa.DpEvent) -> tuple[float, float] | None:
    if isinstance(e, dpa.GaussianDpEvent):
        return 1.0, float(e.noise_multiplier)
    if _is_poisson_gaussian(e):
        return float(e.sampling_probability), float(e.event.noise_multiplier)
    return None


def base_dominates(a: dpa.DpEvent, b: dpa.DpEvent) -> bool:
    """Does base event `a` provably dominate `b` (see the module docstring)?

    Parameters
    ----------
    a, b : dp_accounting.DpEvent
        Base events (no composition).

    Returns
    -------
    bool
        True only where the dominance is proven; False also where it is unknown.
    """
    if a == b:
        return True
    qa, qb = _q_sigma(a), _q_sigma(b)
    return qa is not None and qb is not None and qa[0] >= qb[0] and qa[1] <= qb[1]


def dominates(a: Signature, b: Signature) -> bool:
    """Does the silo mechanism `a` provably dominate `b` (one-to-one step matching)?

    Parameters
    ----------
    a, b : Signature
        Multisets of base events (`signature`).

    Returns
    -------
    bool
        True when every step of `b` is matched to a distinct step of `a` that dominates
        it; False when no such matching exists (which proves nothing either way).
    """
    if a == b or not b:
        return True
    if len(a) == 1 and len(b) == 1:  # one step type each (the usual silo): no flow needed
        (ea1, ca), = a
        (eb1, cb), = b
        return ca >= cb and base_dominates(ea1, eb1)
    ea, eb = sorted(a, key=repr), sorted(b, key=repr)
    need = sum(c for _, c in eb)
    if need > sum(c for _, c in ea):
        return False
    # nodes: 0 source, 1..len(eb) b-types, then a-types, last sink
    nb, na = len(eb), len(ea)
    sink = 1 + nb + na
    edges: list[tuple[int, int, int]] = []  # (from, to, capacity)
    for i, (e, c) in enumerate(eb):
        edges.append((0, 1 + i, c))
        edges.extend((1 + i, 1 + nb + j, c) for j, (f, _) in enumerate(ea)
                     if base_dominates(f, e))
    edges.extend((1 + nb + j, sink, c) for j, (_, c) in enumerate(ea))
    rows, cols, caps = (list(x) for x in zip(*edges))
    if max(caps) >= 2 ** 31:
        return False  # beyond int32 flows: claim nothing
    graph = csr_matrix((np.array(caps, dtype=np.int32), (rows, cols)),
                       shape=(sink + 1, sink + 1))
    return int(maximum_flow(graph, 0, sink).flow_value) == need


def strict_dominators(sigs: Sequence[Signature]) -> list[set[int]]:
    """For each signature, the signatures that strictly dominate it.

    Parameters
    ----------
    sigs : sequence of Signature
        One per silo.

    Returns
    -------
    list of set of int
        Entry i: the indices j whose signature dominates i's and is not dominated by it.
    """
    n = len(sigs)
    dom = [[i != j and dominates(sigs[j], sigs[i]) for j in range(n)] for i in range(n)]
    return [{j for j in range(n) if dom[i][j] and not dom[j][i]} for i in range(n)]


def maximal_multisets(caps: Sequence[int], strict: Sequence[set[int]], m: int,
                      limit: int) -> list[tuple[int, ...]] | None:
    """The multisets of m silos (counts per signature) that cannot be upgraded.

    A multiset can be upgraded when it holds a signature d and a signature strictly
    dominating d has a silo left; upgrading never lowers ε and ends (each move goes to a
    signature with fewer strict dominators), so the worst case over all multisets is
    attained among the ones returned.

    Parameters
    ----------
    caps : sequence of int, shape (D,)
        Number of silos with each signature.
    strict : sequence of set of int, shape (D,)
        `strict_dominators` of each signature.
    m : int
        Silos per multiset, 1 ≤ m ≤ sum(caps).
    limit : int
        The most multisets to return.

    Returns
    -------
    list of tuple of int, each shape (D,), or None
        Counts per signature of every non-upgradeable multiset; None when there are more
        than `limit` (or the search visits more than 200·`limit` partial multisets).
    """
    d = len(caps)
    order = sorted(range(d), key=lambda i: (len(strict[i]), i))  # dominators come first
    suffix = np.concatenate((np.cumsum([caps[i] for i in order][::-1])[::-1], [0]))
    counts = [0] * d
    out: list[tuple[int, ...]] = []
    visits = [0]

    def rec(pos: int, left: int) -> bool:
        visits[0] += 1
        if visits[0] > 200 * limit:
            return False
        if left == 0:
            out.append(tuple(counts))
            return len(out) <= limit
        if pos == d or suffix[pos] < left:
            return True
        i = order[pos]
        allowed = all(counts[j] == caps[j] for j in strict[i])
        for x in range(min(caps[i], left) if allowed else 0, -1, -1):
            counts[i] = x
            if not rec(pos + 1, left - x):
                return False
        counts[i] = 0
        return True

    return out if rec(0, m) else None


def join_event(sigs: Sequence[Signature]) -> tuple[dpa.DpEvent, int] | None:
    """One (base event, count) that dominates every silo's mechanism.

    Parameters
    ----------
    sigs : sequence of Signature
        One per silo.

    Returns
    -------
    (dp_accounting.DpEvent, int) or None
        Where every silo's mechanism is a single (subsampled) Gaussian type: that type
        with the largest q and count and the smallest σ; None otherwise.
    """
    parts = []
    for s in sigs:
        if len(s) != 1:
            return None
        (e, c), = s
        qs = _q_sigma(e)
        if qs is None:
            return None
        parts.append((qs[0], qs[1], c))
    q, sigma, count = max(p[0] for p in parts), min(p[1] for p in parts), max(p[2] for p in parts)
    gauss = dpa.GaussianDpEvent(sigma)
    return (gauss if q >= 1 else dpa.PoissonSampledDpEvent(q, gauss)), count
