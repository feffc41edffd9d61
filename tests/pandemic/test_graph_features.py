"""Deterministic pruning (graph.py) and neighbourhood features (features.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from silofl.errors import ConfigError, DataError, PrivacyError
from silofl.pandemic.features import build_neighbourhood_features
from silofl.pandemic.graph import (
    appearance_counts,
    check_appearance_bound,
    dedupe_contacts,
    max_appearances,
    priority_keys,
    prune_pairs,
    prune_to_max_degree,
)
from silofl.pandemic.tables import DECLARED_CONSTANTS, pagerank_scores

T = 57


# --- test graphs -----------------------------------------------------------------------

def heavy_tailed_contacts(n: int, rows: int, seed: int, star_leaves: int = 0):
    """Chung-Lu-like multigraph with Pareto weights (a few big hubs), self-loops and
    repeated pairs, plus optionally a star: person 0 meets `star_leaves` others."""
    rng = np.random.default_rng(seed)
    w = rng.pareto(1.5, n) + 1.0
    p = w / w.sum()
    src = rng.choice(n, rows, p=p)
    dst = rng.choice(n, rows, p=p)
    dup = rng.integers(0, rows, rows // 5)  # repeated contacts of the same pairs
    src = np.concatenate([src, dst[dup]])
    dst = np.concatenate([dst, src[dup]])
    if star_leaves:
        leaves = rng.choice(np.arange(1, n), star_leaves, replace=False)
        src = np.concatenate([src, np.zeros(star_leaves, np.int64)])
        dst = np.concatenate([dst, leaves])
    r = src.shape[0]
    return dict(src=src.astype(np.int32), dst=dst.astype(np.int32),
                start_time=rng.integers(0, 2 * 86400, r).astype(np.int32),
                duration=rng.integers(60, 40000, r).astype(np.int32),
                lid=rng.integers(0, 60, r).astype(np.int32))


def make_region(n=400, rows=3000, seed=0, star_leaves=150, num_loc=50):
    rng = np.random.default_rng(seed + 1)
    c = heavy_tailed_contacts(n, rows, seed, star_leaves)
    states = np.zeros((n, T), np.int8)
    onset = rng.integers(0, 90, n)
    for i in range(n):
        if onset[i] < T:
            states[i, onset[i]:] = 1
            states[i, min(T, onset[i] + rng.integers(3, 12)):] = 2
    return dict(
        **c, num_nodes=n, age=rng.integers(0, 95, n), sex=rng.integers(1, 3, n),
        household_size=rng.integers(1, 8, n),
        activities=rng.integers(0, 2, (n, 6)).astype(np.uint8),
        frac_out_of_home=rng.random(n).astype(np.float32), states=states,
        # ids 0..49 known (shuffled, non-contiguous order), lids 50..59 unknown
        location_ids=rng.permutation(num_loc),
        location_flags=rng.integers(0, 2, (num_loc, 6)).astype(np.uint8),
        longitude=rng.normal(-78, 1, num_loc).astype(np.float32),
        latitude=rng.normal(38, 1, num_loc).astype(np.float32))


def edge_set(index):
    r, c = index.edges()
    return set(zip(r.tolist(), c.tolist()))


# --- dedupe ----------------------------------------------------------------------------

def test_dedupe_matches_reference():
    c = heavy_tailed_contacts(200, 2000, seed=3, star_leaves=50)
    pairs = dedupe_contacts(c["src"], c["dst"], 200, start_time=c["start_time"],
                            duration=c["duration"], lid=c["lid"])
    best, count, total = {}, {}, {}
    for r, (a, b) in enumerate(zip(c["src"].tolist(), c["dst"].tolist())):
        if a == b:
            continue
        key = (min(a, b), max(a, b))
        d = int(c["duration"][r])
        if key not in best or d > best[key][0]:
            best[key] = (d, r)
        count[key] = count.get(key, 0) + 1
        total[key] = total.get(key, 0) + d
    keys = sorted(best)
    assert list(zip(pairs.u.tolist(), pairs.v.tolist())) == keys
    rows = np.array([best[k][1] for k in keys])
    np.testing.assert_array_equal(pairs.duration, c["duration"][rows])
    np.testing.assert_array_equal(pairs.start_time, c["start_time"][rows])
    np.testing.assert_array_equal(pairs.lid, c["lid"][rows])
    np.testing.assert_array_equal(pairs.n_contacts, [count[k] for k in keys])
    np.testing.assert_array_equal(pairs.total_duration, [total[k] for k in keys])


# --- pruning ---------------------------------------------------------------------------

def test_pruning_is_deterministic_and_order_invariant():
    c = heavy_tailed_contacts(500, 6000, seed=1, star_leaves=300)
    a = prune_to_max_degree(c["src"], c["dst"], 500, 7, seed=11, duration=c["duration"])
    b = prune_to_max_degree(c["src"], c["dst"], 500, 7, seed=11, duration=c["duration"])
    for name in ("indptr", "nbr", "duration", "n_contacts", "original_degree"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    # shuffled rows and swapped endpoints: the same people get the same neighbours
    perm = np.random.default_rng(5).permutation(c["src"].shape[0])
    s = prune_to_max_degree(c["dst"][perm], c["src"][perm], 500, 7, seed=11,
                            duration=c["duration"][perm])
    assert edge_set(s) == edge_set(a)
    for p in range(500):
        assert set(s.neighbours(p).tolist()) == set(a.neighbours(p).tolist())
    other = prune_to_max_degree(c["src"], c["dst"], 500, 7, seed=12, duration=c["duration"])
    assert edge_set(other) != edge_set(a)


@pytest.mark.parametrize("S", [1, 2, 5, 20])
def test_no_person_in_more_than_S_examples_with_hubs(S):
    n = 2000
    c = heavy_tailed_contacts(n, 20000, seed=2, star_leaves=500)
    pairs = dedupe_contacts(c["src"], c["dst"], n, duration=c["duration"])
    assert pairs.degree().max() > 500  # there really are hubs
    index = prune_pairs(pairs, S - 1, seed=0)
    assert index.degree.max() <= S - 1
    counts = appearance_counts(index)
    np.testing.assert_array_equal(counts, 1 + index.degree)  # ℓ = 1: own + neighbours
    assert max_appearances(index) <= S == index.appearance_bound
    assert check_appearance_bound(index, S) <= S
    if S > 1:
        assert index.degree[0] == S - 1  # the star centre is filled up to the bound
        with pytest.raises(PrivacyError, match="appears in"):
            check_appearance_bound(index, S - 1)


def test_greedy_matches_reference_and_is_maximal():
    n = 300
    c = heavy_tailed_contacts(n, 4000, seed=4, star_leaves=100)
    pairs = dedupe_contacts(c["src"], c["dst"], n, duration=c["duration"])
    for priority in ("random", "duration"):
        k = 4
        index = prune_pairs(pairs, k, seed=9, priority=priority)
        keys = priority_keys(pairs, seed=9, priority=priority)
        assert np.unique(keys).size == keys.size
        cap = np.full(n, k)
        ref = set()
        for e in np.argsort(keys):  # pure-Python greedy over the same priorities
            a, b = int(pairs.u[e]), int(pairs.v[e])
            if cap[a] and cap[b]:
                cap[a] -= 1
                cap[b] -= 1
                ref.add((a, b))
        assert edge_set(index) == ref
        deg = index.degree
        for a, b in zip(pairs.u.tolist(), pairs.v.tolist()):
            if (a, b) not in ref:  # maximal: a dropped pair has a full endpoint
                assert deg[a] == k or deg[b] == k


def test_duration_priority_prefers_long_contacts():
    pairs = dedupe_contacts(np.zeros(10, np.int32), np.arange(1, 11, dtype=np.int32), 11,
                            duration=np.arange(1, 11, dtype=np.int32) * 600)
    index = prune_pairs(pairs, 3, seed=0, priority="duration")
    assert index.neighbours(0).tolist() == [10, 9, 8]


def test_nothing_removed_when_degree_already_bounded():
    n = 100  # ring + chords: degree 4, every pair met 3 times
    u = np.arange(n)
    src = np.concatenate([u, u] * 3)
    dst = np.concatenate([(u + 1) % n, (u + 7) % n] * 3)
    pairs = dedupe_contacts(src.astype(np.int32), dst.astype(np.int32), n)
    index = prune_pairs(pairs, 4, seed=3)
    assert index.num_edges == pairs.num_pairs == 2 * n
    np.testing.assert_array_equal(index.degree, pairs.degree())
    assert np.all(index.n_contacts == 3)
    index = prune_pairs(pairs, 10, seed=3, hops=2, max_degree_hop2=4)
    assert edge_set(index.hop2) == edge_set(index)


def test_rows_are_ordered_by_duration():
    c = heavy_tailed_contacts(300, 3000, seed=6, star_leaves=80)
    index = prune_to_max_degree(c["src"], c["dst"], 300, 10, seed=1, duration=c["duration"])
    for p in range(300):
        d = index.duration[index.indptr[p]:index.indptr[p + 1]]
        assert np.all(np.diff(d) <= 0)
    # edge attributes are symmetric (both directions describe the same contact)
    r = np.repeat(np.arange(300), index.degree)
    att = {(int(a), int(b)): int(d) for a, b, d in zip(r, index.nbr, index.duration)}
    assert all(att[(b, a)] == d for (a, b), d in att.items())


def test_two_hop_appearance_bound():
    n, k1, k2 = 1500, 6, 2
    c = heavy_tailed_contacts(n, 15000, seed=7, star_leaves=400)
    index = prune_to_max_degree(c["src"], c["dst"], n, k1, seed=2, duration=c["duration"],
                                hops=2, max_degree_hop2=k2)
    assert index.hop2.degree.max() <= k2
    assert edge_set(index.hop2) <= edge_set(index)
    bound = 1 + k1 + k2 * (k1 - 1)
    assert index.appearance_bound == bound
    # brute force: the set of people in every example, as gather lays it out
    counts = np.ones(n, np.int64)
    for u in range(n):
        members = set()
        for v in index.neighbours(u).tolist():
            members.add(v)
            members.update(w for w in index.hop2.neighbours(v).tolist() if w != u)
        members.discard(u)
        for w in members:
            counts[w] += 1
    np.testing.assert_array_equal(appearance_counts(index), counts)
    assert counts.max() <= bound
    assert check_appearance_bound(index) == counts.max()


def test_pruning_input_errors():
    s = np.array([0, 1, 2], np.int32)
    d = np.array([1, 2, 3], np.int32)
    with pytest.raises(ConfigError, match="max_degree"):
        prune_to_max_degree(s, d, 4, -1)
    with pytest.raises(DataError, match="outside 0..2"):
        prune_to_max_degree(s, d, 3, 2)
    with pytest.raises(DataError, match="rows"):
        prune_to_max_degree(s, d[:2], 4, 2)
    with pytest.raises(DataError, match="person indices"):
        prune_to_max_degree(s.astype(float), d, 4, 2)
    with pytest.raises(DataError, match="duration must hold integers"):
        prune_to_max_degree(s, d, 4, 2, duration=np.ones(3))
    with pytest.raises(DataError, match="negative"):
        prune_to_max_degree(s, d, 4, 2, duration=-np.ones(3, np.int32))
    with pytest.raises(ConfigError, match="max_degree_hop2"):
        prune_to_max_degree(s, d, 4, 2, hops=2)
    with pytest.raises(ConfigError, match="priority"):
        prune_to_max_degree(s, d, 4, 2, priority="degree")


# --- features ---------------------------------------------------------------------------

def slow_reference_features(raw, index, person, window_end, S, t_window, k2=0,
                            pagerank=None, constants="uncharged"):
    """Loop-based, from the raw arrays; only the neighbour lists come from `index`
    (and, for graph features, the PageRank vector, tested separately).  ``constants``:
    "uncharged" z-scores over the data; "declared" uses the published numbers."""
    n = raw["num_nodes"]
    src, dst, dur = raw["src"].tolist(), raw["dst"].tolist(), raw["duration"]
    D = DECLARED_CONSTANTS

    def z(x, key=None):
        x = np.asarray(x, float)
        if constants == "declared" and key is not None:
            return (x - getattr(D, key + "_mean")) / getattr(D, key + "_std")
        return (x - x.mean()) / x.std() if x.std() > 1e-12 else np.zeros_like(x)

    nbrs = [set() for _ in range(n)]
    best, count = {}, {}
    for r, (a, b) in enumerate(zip(src, dst)):
        if a == b:
            continue
        nbrs[a].add(b)
        nbrs[b].add(a)
        key = (min(a, b), max(a, b))
        if key not in best or dur[r] > dur[best[key]]:
            best[key] = r
        count[key] = count.get(key, 0) + 1
    if constants == "declared":  # a fixed log transform (Box-Cox λ = 0), declared scale
        age_z, hh_z = z(raw["age"], "age"), z(np.log(raw["household_size"]), "household")
    else:
        age_z, hh_z = z(raw["age"]), z(stats.boxcox(raw["household_size"].astype(float))[0])
    deg_z = z(np.log1p([len(s) for s in nbrs]))

    pr_z = None if pagerank is None else z(np.log(np.asarray(pagerank) * n))

    def node(i):
        x = [age_z[i], raw["sex"][i] - 1, hh_z[i], *raw["activities"][i],
             raw["frac_out_of_home"][i]]
        if pr_z is not None:
            x += [len(index.neighbours(i)) / max(S - 1, 1), deg_z[i], pr_z[i]]
        return x

    kept = [(u, w) for u in range(n) for w in index.neighbours(u).tolist()]
    key = lambda a, b: (min(a, b), max(a, b))  # noqa: E731
    ld = [math.log1p(dur[best[key(u, w)]]) for u, w in kept]
    lc = [math.log1p(count[key(u, w)]) for u, w in kept]
    if constants == "declared":
        dm, ds, cm, cs = D.dur_mean, D.dur_std, D.cnt_mean, D.cnt_std
    else:
        dm, ds, cm, cs = np.mean(ld), np.std(ld), np.mean(lc), np.std(lc)
    ids = list(raw["location_ids"])
    lon_z, lat_z = z(raw["longitude"], "lon"), z(raw["latitude"], "lat")

    def edge(a, b):
        r = best[key(a, b)]
        feats = [(raw["start_time"][r] % 86400) / 86400,
                 (math.log1p(dur[r]) - dm) / ds,
                 (math.log1p(count[key(a, b)]) - cm) / cs]
        lid = int(raw["lid"][r])
        if lid in ids:
            j = ids.index(lid)
            return feats + [*raw["location_flags"][j], lon_z[j], lat_z[j], 0]
        return feats + [0] * 6 + [0, 0, 1]

    def hist(i):
        out = []
        for d in range(window_end - t_window, window_end):
            s = raw["states"][i, d]
            out += [s == 0, s == 1, s == 2]
        return out

    def block(i, other, via):
        return [0] + node(other) + edge(via, other) + hist(other)

    width = 1 + len(node(person)) + 3 + 9 + 3 * t_window
    empty = [1] + [0] * (width - 1)
    x = node(person) + hist(person)
    nb = index.neighbours(person).tolist()
    for i in range(S - 1):
        x += block(person, nb[i], person) if i < len(nb) else empty
    if k2:
        for i in range(S - 1):
            cands = ([w for w in index.hop2.neighbours(nb[i]).tolist() if w != person]
                     if i < len(nb) else [])
            for j in range(k2):
                x += block(person, cands[j], nb[i]) if j < len(cands) else empty
    y = None
    if window_end + 7 <= raw["states"].shape[1]:
        st = raw["states"][person]
        y = int(any(st[d - 1] == 0 and st[d] == 1 for d in range(window_end, window_end + 7)))
    return np.array(x, dtype=np.float64), y


@pytest.fixture(scope="module")
def region():
    return make_region()


@pytest.mark.parametrize("hops,graph_features,constants", [
    (1, False, "declared"), (1, False, "uncharged"), (2, False, "declared"),
    (1, True, "uncharged")])
def test_gather_equals_slow_reference(region, hops, graph_features, constants):
    S, tw, k2 = 6, 21, (2 if hops == 2 else 0)
    f = build_neighbourhood_features(**region, S=S, t_window=tw, seed=3, hops=hops,
                                     hop2_neighbours=k2 or None,
                                     graph_features=graph_features, constants=constants)
    assert f.fitted["constants"]["source"] == constants
    assert f.dim == len(f.feature_names())
    pr = None
    if graph_features:
        pr = pagerank_scores(dedupe_contacts(region["src"], region["dst"], 400))
        with pytest.raises(PrivacyError, match="graph_features=False"):
            _ = f.node_dp_S
    else:
        assert f.node_dp_S == f.appearance_bound == 1 + (S - 1) + k2 * (S - 2)
    persons = np.array([0, 5, 17, 123, 399, 5])  # the star centre, duplicates are fine
    persons = np.concatenate([persons, np.flatnonzero(f.index.degree == 0)[:1]])
    we = np.array([21, 30, 50, 44, 21, 33, 40])[:persons.size]
    X, y = f.gather(persons, we)
    assert X.shape == (persons.size, f.dim) and X.dtype == np.float32
    assert y.dtype == np.uint8
    for b, (p, w) in enumerate(zip(persons.tolist(), we.tolist())):
        ref_x, ref_y = slow_reference_features(region, f.index, p, w, S, tw, k2, pr,
                                               constants)
        np.testing.assert_allclose(X[b], ref_x, rtol=1e-5, atol=1e-5)
        assert y[b] == ref_y


def test_labels_are_transitions_into_infection(region):
    r = dict(region)
    states = np.zeros((r["num_nodes"], T), np.int8)
    states[1, 40:] = 1            # S → I on day 40
    states[2, :] = 1              # infected from the start: never a transition
    states[3, 30:] = 1
    states[3, 35:] = 2            # S → I on 30, then R
    r["states"] = states
    f = build_neighbourhood_features(**r, S=3)
    y = f.labels(np.array([1, 1, 1, 2, 3, 3, 0]), np.array([34, 40, 41, 30, 24, 31, 30]))
    assert y.tolist() == [1, 1, 0, 0, 1, 0, 0]


def test_windows_random_per_epoch_and_prediction_window(region):
    f = build_neighbourhood_features(**region, S=4, t_window=21)
    lo, hi = f.train_window_range
    assert (lo, hi) == (21, T - 7)
    e0, e1 = f.epoch_windows(seed=1, epoch=0), f.epoch_windows(seed=1, epoch=1)
    assert e0.shape == (f.num_nodes,)
    assert np.all((e0 >= lo) & (e0 <= hi)) and np.all((e1 >= lo) & (e1 <= hi))
    assert np.mean(e0 != e1) > 0.8
    np.testing.assert_array_equal(e0, f.epoch_windows(seed=1, epoch=0))
    assert set(np.unique(np.concatenate([e0, e1]))) == set(range(lo, hi + 1))
    rng = np.random.default_rng(0)
    persons, we = f.sample_batch(rng, 64)
    assert np.unique(persons).size == 64 and np.all((we >= lo) & (we <= hi))
    X, y = f.gather(persons, we)
    assert X.shape == (64, f.dim)
    # prediction: features from the last t_window days, no labels
    p = np.arange(10)
    Xp = f.gather_prediction(p)
    np.testing.assert_array_equal(Xp, f.gather(p, T, labels=False)[0])
    own_hist = Xp[:, f.d_node:f.own_dim].reshape(10, 21, 3)
    np.testing.assert_array_equal(own_hist.argmax(-1), region["states"][p, T - 21:])
    batches = list(f.iter_prediction_batches(150))
    assert sum(b[0].size for b in batches) == f.num_nodes


def test_S1_examples_have_no_neighbour_slots(region):
    f = build_neighbourhood_features(**region, S=1)
    X, _ = f.gather(np.arange(5), 30)
    assert f.num_slots == 0 and X.shape == (5, f.own_dim) and f.node_dp_S == 1


def test_pagerank_matches_power_iteration():
    c = heavy_tailed_contacts(150, 1500, seed=8, star_leaves=40)
    pairs = dedupe_contacts(c["src"], c["dst"], 150)
    pr = pagerank_scores(pairs)
    a = np.zeros((150, 150))
    a[pairs.u, pairs.v] = a[pairs.v, pairs.u] = 1
    deg = a.sum(1)
    x = np.full(150, 1 / 150)
    for _ in range(300):
        x = 0.85 * a.T @ np.where(deg > 0, x / np.maximum(deg, 1), 0) + (
            0.15 + 0.85 * x[deg == 0].sum()) / 150
    np.testing.assert_allclose(pr, x, rtol=2e-2, atol=1e-5)
    assert abs(pr.sum() - 1) < 1e-6


def test_feature_input_errors(region):
    with pytest.raises(ConfigError, match="positive integer"):
        build_neighbourhood_features(**region, S=0)
    with pytest.raises(ConfigError, match="between 1 and 50"):
        build_neighbourhood_features(**region, t_window=60)
    f = build_neighbourhood_features(**region, S=3)
    n = f.num_nodes
    with pytest.raises(ConfigError, match="larger than the region"):
        f.sample_batch(np.random.default_rng(0), n + 1)
    with pytest.raises(ConfigError, match="larger than the region"):
        f.gather(np.zeros(n + 1, np.int64), 30)
    with pytest.raises(ConfigError, match=r"window_end must lie in \[21, 50\]"):
        f.gather(np.arange(3), 20)
    with pytest.raises(ConfigError, match="labels=False"):
        f.gather(np.arange(3), T)
    with pytest.raises(ConfigError, match="0..399"):
        f.gather(np.array([n]), 30)
    bad = dict(region, states=np.full((n, T), 3, np.int8))
    with pytest.raises(DataError, match="0=S"):
        build_neighbourhood_features(**bad, S=3)
    bad = dict(region, household_size=np.zeros(n))
    with pytest.raises(DataError, match="household sizes must be positive"):
        build_neighbourhood_features(**bad, S=3)
    bad = dict(region, sex=np.full(n, 5))
    with pytest.raises(DataError, match="sex"):
        build_neighbourhood_features(**bad, S=3)


def test_boxcox_lambda_matches_scipy():
    from silofl.pandemic.tables import boxcox_lambda
    rng = np.random.default_rng(0)
    for x in (rng.integers(1, 9, 5000), rng.poisson(2.5, 3000) + 1, rng.integers(1, 3, 100)):
        x = x.astype(float)
        assert boxcox_lambda(x) == pytest.approx(stats.boxcox(x)[1], abs=1e-5)


# --- evaluation: metrics and the SIR baseline ---------------------------------------------

def test_average_precision_hand_computed():
    from silofl.pandemic.metrics import average_precision
    # ranks: .8(+) .4(-) .35(+) .1(-): AP = 1/2·1 + 1/2·2/3
    assert average_precision([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(5 / 6)
    # ties form one threshold: .9(-) | .5(+,-) | .2(+): AP = 1/2·1/3 + 1/2·1/2
    assert average_precision([1, 0, 1, 0], [0.5, 0.5, 0.2, 0.9]) == pytest.approx(5 / 12)
    assert average_precision([1, 1, 0], [3, 2, 1]) == 1.0
    assert average_precision([1, 1], [0.1, 0.1]) == 1.0
    assert math.isnan(average_precision([0, 0], [0.3, 0.1]))
    # constant scores: AP = positive rate
    assert average_precision([1, 0, 0, 0], [1, 1, 1, 1]) == pytest.approx(0.25)


def test_ranking_metrics():
    from silofl.pandemic.metrics import (
        per_region_average_precision,
        positive_rate,
        precision_at_k,
        recall_at_k,
        recall_at_threshold,
    )
    y, s = np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])
    assert recall_at_k(y, s, 1) == 0.5 and recall_at_k(y, s, 3) == 1.0
    assert precision_at_k(y, s, 2) == 0.5
    assert recall_at_threshold(y, s, 0.35) == 1.0 and recall_at_threshold(y, s, 0.5) == 0.5
    assert positive_rate(y) == 0.5
    ap = per_region_average_precision(np.r_[y, 1, 0], np.r_[s, 0.2, 0.9],
                                      np.array(["a"] * 4 + ["b"] * 2))
    assert ap["a"] == pytest.approx(5 / 6) and ap["b"] == pytest.approx(0.5)
    with pytest.raises(ConfigError):
        recall_at_k(y, s, 5)
    with pytest.raises(DataError):
        recall_at_k(y, s[:3], 1)
    rng = np.random.default_rng(0)
    yy = (rng.random(200_000) < 0.01).astype(int)
    from silofl.pandemic.metrics import average_precision
    assert average_precision(yy, rng.random(yy.size)) == pytest.approx(yy.mean(), rel=0.15)


def test_sir_baseline():
    from silofl.pandemic.baseline import sir_baseline_scores, sir_fit
    r = make_region(n=400, rows=100, star_leaves=0)
    states = r["states"]
    fit = sir_fit(states)
    n = states.shape[0]
    s_cnt = (states == 0).sum(0)
    i_cnt = (states == 1).sum(0)
    new = [((states[:, t - 1] == 0) & (states[:, t] == 1)).sum() for t in range(1, T)]
    x = i_cnt[:-1] * s_cnt[:-1] / n
    beta = np.linalg.lstsq(x[:, None], np.array(new, float), rcond=None)[0][0]
    assert fit.beta == pytest.approx(beta, rel=1e-10)
    scores = sir_baseline_scores(states)
    p = beta * i_cnt[-1] / n
    susceptible = states[:, -1] == 0
    np.testing.assert_allclose(scores[susceptible], 1 - (1 - p) ** 7)
    assert np.all(scores[~susceptible] == 0)
    # evaluation mode: fit on days < 40, score the week from day 40
    early = sir_baseline_scores(states, window_end=40)
    assert np.all((early > 0) == (states[:, 39] == 0))
    assert sir_fit(np.zeros((5, T), np.int8)).beta == 0.0
    with pytest.raises(ConfigError):
        sir_baseline_scores(states, window_end=1)
    with pytest.raises(DataError):
        sir_baseline_scores(states + 3)
