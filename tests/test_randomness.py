"""Randomness: the secure (AES-CTR keystream, OS-keyed) and seeded (PCG64) streams.

Statistical checks use thresholds that a correct sampler fails with probability ≲ 1e-6
each; the sample sizes keep the whole file to a few seconds."""

from __future__ import annotations

import copy
import math
import os
import pickle
import select
import signal

import numpy as np
import pytest
from scipy import stats

from silofl.errors import ConfigError
from silofl.privacy import randomness as R
from silofl.privacy.randomness import Randomness

P_MIN = 1e-6  # smallest acceptable p-value


@pytest.fixture(scope="module")
def secure_normals():
    return Randomness.secure().normal(4_000_000)


def _fixed_keystream(monkeypatch, words):
    """Make every secure stream's keystream repeat `words` (int64): the transformations
    become deterministic functions we can check at their extremes."""
    words = np.asarray(words, dtype=np.int64)

    def keystream(self, m):
        return np.resize(words, m)

    monkeypatch.setattr(R._Secure, "_keystream", keystream)


# --- construction, modes -----------------------------------------------------------------------

def test_modes_factories_and_the_secure_flag():
    s, d = Randomness.secure(), Randomness.seeded(0)
    assert (s.mode, d.mode) == ("secure", "seeded")
    assert s.secure is True and d.secure is False  # the instance attribute is a bool
    assert Randomness.os_entropy().mode == "secure"  # the old name still works
    assert Randomness.for_mode("secure", 0).secure
    np.testing.assert_array_equal(Randomness.for_mode("seeded", 7).normal(5),
                                  Randomness.seeded(7).normal(5))
    assert set(R.MODES) == {"secure", "seeded"}


@pytest.mark.parametrize("mode,seed,words", [
    ("urandom", 0, ["unknown noise mode 'urandom'", "secure", "seeded"]),
    ("Secure", 0, ["unknown noise mode"]),
    ("seeded", None, ["needs a seed"])])
def test_for_mode_rejects_unknown_modes_and_missing_seeds(mode, seed, words):
    with pytest.raises(ConfigError) as e:
        Randomness.for_mode(mode, seed)
    for w in words:
        assert w in str(e.value)


def test_seeded_stream_is_exactly_numpy_pcg64():
    """Experiments rely on these exact numbers: uniform = 1 − random(), normal = ziggurat."""
    gen = np.random.Generator(np.random.PCG64(42))
    r = Randomness.seeded(42)
    np.testing.assert_array_equal(r.uniform((3, 4)), 1.0 - gen.random((3, 4)))
    np.testing.assert_array_equal(r.normal(7), gen.standard_normal(7))
    a, b = Randomness.seeded(5), Randomness.seeded(5)
    np.testing.assert_array_equal(a.spawn().normal(6), b.spawn().normal(6))
    np.testing.assert_array_equal(a.gumbel(9), b.gumbel(9))
    # prefetching changes nothing for a seeded stream: same values, same order
    c, d = Randomness.seeded(9), Randomness.seeded(9)
    for shape in [(4, 3), (4, 3), (5,)]:
        np.testing.assert_array_equal(c.normal_prefetched(shape), d.normal(shape))
    np.testing.assert_array_equal(c.uniform(3), d.uniform(3))


def test_secure_streams_differ_between_instances_spawns_and_draws():
    a, b = Randomness.secure(), Randomness.secure()
    child = a.spawn()
    assert child.secure
    draws = [a.normal(256), b.normal(256), child.normal(256), a.normal(256)]
    for i in range(len(draws)):
        for j in range(i):
            assert not np.any(draws[i] == draws[j])  # independent continuous draws never tie
    u = [a.uniform(256), b.uniform(256), a.uniform(256)]
    assert not np.array_equal(u[0], u[1]) and not np.array_equal(u[0], u[2])


def test_secure_stream_cannot_be_copied_or_pickled():
    r = Randomness.secure()
    for clone in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="keystream"):
            clone(r)


def test_secure_stream_rekeys_and_keeps_drawing(monkeypatch):
    monkeypatch.setattr(R, "_REKEY_BYTES", 8 * 1000)
    r = Randomness.secure()
    enc = r._enc
    u = r.uniform(5000)  # 5 chunks worth of rekeys
    assert r._enc is not enc
    assert u.min() > 0 and u.max() <= 1 and len(np.unique(u)) == u.size


def _in_fork(draw):
    """draw() in a forked child → its float64 values (the child exits without teardown)."""
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(wr, np.asarray(draw(), dtype=np.float64).tobytes())
        finally:
            os._exit(0)
    os.close(wr)
    buf, ready = b"", []
    try:
        ready, _, _ = select.select([rd], [], [], 30)
        while ready and (chunk := os.read(rd, 1 << 16)):
            buf += chunk
    finally:
        os.close(rd)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert ready, "the forked child did not answer (waiting on the parent's worker thread?)"
    return np.frombuffer(buf, dtype=np.float64)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("prefetched_first", [False, True])
def test_forked_child_never_repeats_the_parents_keystream(monkeypatch, prefetched_first):
    monkeypatch.setattr(R, "PREFETCH", True)
    r = Randomness.secure()
    r.normal_prefetched((8, 8))  # a worker thread and a pending block exist before the fork
    r._ahead[1].result()  # (already drawn: a forked child must not hand it out again)

    def draw():  # the first draw after a fork is the one that must notice it
        calls = [lambda: r.uniform(64), lambda: r.normal(64),
                 lambda: r.normal_prefetched((8, 8)).ravel()]
        return np.concatenate([f() for f in (calls[::-1] if prefetched_first else calls)])

    child = _in_fork(draw)
    assert child.size == 192
    assert not np.any(child == draw())  # the parent's own next draws


# --- uniforms ---------------------------------------------------------------------------------

@pytest.mark.statistical
def test_secure_uniform_range_grid_and_distribution():
    r = Randomness.secure()
    u = r.uniform(400_000)
    assert u.shape == (400_000,) and u.dtype == np.float64
    assert u.min() > 0 and u.max() <= 1
    k = u * 2.0**53  # 53 random bits: integers 1 … 2^53, odd ones included
    assert np.all(k == np.floor(k)) and np.any(k % 2 == 1)
    assert stats.kstest(u, "uniform").pvalue > P_MIN
    # the low bits are random too: the 2^-20-scale digits are uniform as well
    assert stats.kstest((u * 2**20) % 1.0, "uniform").pvalue > P_MIN
    assert r.uniform((3, 5)).shape == (3, 5) and r.uniform(0).shape == (0,)
    assert r.uniform(()).shape == ()


def test_secure_uniform_extremes_are_in_0_1(monkeypatch):
    """The keystream words mapping to the ends: the smallest value is 2^-53, the largest 1."""
    _fixed_keystream(monkeypatch, [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0])
    u = Randomness.secure().uniform(4)
    np.testing.assert_array_equal(u, [2.0**-53, 1.0, 0.5, 0.5 + 2.0**-53])


@pytest.mark.statistical
def test_secure_gumbel_is_standard_gumbel():
    g = Randomness.secure().gumbel(200_000)
    assert np.all(np.isfinite(g))
    assert stats.kstest(g, "gumbel_r").pvalue > P_MIN


# --- Gaussians --------------------------------------------------------------------------------

@pytest.mark.statistical
def test_secure_normal_matches_the_standard_normal(secure_normals):
    z = secure_normals
    n = z.size
    assert z.dtype == np.float64 and np.all(np.isfinite(z))
    assert stats.kstest(z[:1_000_000], "norm").pvalue > P_MIN
    # moments, each within ~5 standard errors
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    assert abs(stats.skew(z)) < 5 * math.sqrt(6 / n)
    assert abs(stats.kurtosis(z)) < 5 * math.sqrt(24 / n)
    # polar pairs are independent: no correlation between neighbours
    assert abs(np.corrcoef(z[:-1:2], z[1::2])[0, 1]) < 5 / math.sqrt(n / 2)


@pytest.mark.statistical
@pytest.mark.parametrize("t", [2.0, 3.0, 3.5, 4.0])
def test_secure_normal_tail_frequencies(secure_normals, t):
    """P(|Z| > t) within a 5-sd binomial interval: a sampler with truncated or thin tails
    (float32 uniforms, a coarse inverse CDF) fails these."""
    n = secure_normals.size
    p = 2 * stats.norm.sf(t)
    hits = int(np.count_nonzero(np.abs(secure_normals) > t))
    assert abs(hits - n * p) < 5 * math.sqrt(n * p * (1 - p)) + 1, (t, hits, n * p)
    # P(max |Z| < 4.5 over 4M draws) = e^-27: the tail goes on beyond the tested cuts
    assert np.abs(secure_normals).max() > 4.5


def test_secure_normal_reaches_far_tails(monkeypatch):
    """The transformation itself, at its extreme: candidates u = 9·2⁻⁶³, v = 2⁻⁶³ (s ≈ 2⁻¹¹⁹)
    give z ≈ 12.8 — far beyond the 8.57 cap of Box–Muller on 53-bit uniforms — computed to
    float64 precision; candidates with u rounding to 1 (s ≥ 1) are rejected, not mapped to 0."""
    top = np.iinfo(np.int64).max

    def keystream(self, m):  # first half: the u's, second half: the v's
        return np.concatenate([np.resize([top, 9], m // 2), np.ones(m // 2, np.int64)])

    monkeypatch.setattr(R._Secure, "_keystream", keystream)
    z = Randomness.secure().normal(6).reshape(2, 3)  # u-values first, then their v's
    s = 82 * 2.0**-126
    r = math.sqrt(-2 * math.log(s) / s)
    np.testing.assert_allclose(z[0], 9 * 2.0**-63 * r, rtol=1e-14)
    np.testing.assert_allclose(z[1], 2.0**-63 * r, rtol=1e-14)
    assert z.max() > 12.7


def test_secure_normal_shapes_and_odd_sizes():
    r = Randomness.secure()
    for shape in [(), (1,), (7,), (3, 5), (2, 3, 7), 0, 11]:
        z = r.normal(shape)
        assert z.shape == (np.empty(shape).shape)
    # sizes that span several chunks and end mid-pair
    z = r.normal(3 * R._CHUNK_WORDS + 1)
    assert z.size == 3 * R._CHUNK_WORDS + 1 and np.all(np.isfinite(z))
    assert len(np.unique(z)) == z.size


@pytest.mark.statistical
def test_secure_prefetched_blocks_are_fresh_normals(monkeypatch):
    monkeypatch.setattr(R, "PREFETCH", True)  # the background thread even on one CPU
    r = Randomness.secure()
    shape = (6, 4, 500)
    blocks = [r.normal_prefetched(shape) for _ in range(8)]
    blocks.append(r.normal_prefetched((3, 7)))   # another shape: drawn now, not stale
    blocks.append(r.normal_prefetched(shape))
    assert [b.shape for b in blocks[-2:]] == [(3, 7), shape]
    flat = np.concatenate([b.ravel() for b in blocks])
    assert len(np.unique(flat)) == flat.size  # no block (or value) handed out twice
    assert stats.kstest(flat, "norm").pvalue > P_MIN
    for b in blocks:
        b *= 2.0  # each block is the caller's own, writable array
    # a block too large to prefetch is drawn in the foreground
    big = (R.PREFETCH_MAX_BYTES // 8 + 1,)
    r2 = Randomness.secure()
    r2.normal = lambda shape: np.zeros(shape)  # spy: the foreground path is taken
    assert not r2.normal_prefetched(big).any() and r2._pool is None
    assert r._pool is not None and r._child is not None  # the worker exists…
    monkeypatch.setattr(R, "PREFETCH", False)  # …and none is started when switched off
    r3 = Randomness.secure()
    assert r3.normal_prefetched((3, 4)).shape == (3, 4) and r3._pool is None


# --- a training round's noise block ------------------------------------------------------------

def test_round_noise_layout_scale_and_seeded_numbers():
    from silofl.training.dpsgd import round_noise

    steps, std, P = np.array([3, 1, 0, 3, 2]), np.array([0.5, 2.0, 9.0, 1.0, 4.0]), 4000
    # seeded: exactly the historical full (S, K, P) draw, scaled, rows of the stepping silos
    z, off = round_noise(Randomness.seeded(4), steps, std, P)
    full = Randomness.seeded(4).normal((3, 5, P))
    np.testing.assert_array_equal(off, [0, 4, 7, 9])
    rows = [(s, k) for s in range(3) for k in range(5) if steps[k] > s]
    assert z.shape == (len(rows), P) == (9, P)
    for r, (s, k) in enumerate(rows):
        np.testing.assert_array_equal(z[r], full[s, k] * std[k])
    # secure: just those rows, each silo's rows at its own std
    z, off2 = round_noise(Randomness.secure(), steps, std, P)
    np.testing.assert_array_equal(off2, off)
    assert z.shape == (9, P)
    for r, (s, k) in enumerate(rows):
        rms = np.sqrt(np.mean(z[r] ** 2))
        assert abs(rms / std[k] - 1) < 5 / np.sqrt(2 * P), (s, k, rms)
    z, off = round_noise(Randomness.secure(), np.array([0, 0]), std[:2], P)
    assert z.shape == (0, P) and off.tolist() == [0]
