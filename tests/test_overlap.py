"""Keyed pseudonyms (silofl.data.pseudonyms) and the private overlap histogram and
per-person weights (silofl.privacy.overlap)."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import math
import pickle
from collections import Counter

import dp_accounting as dpa
import numpy as np
import pytest

from silofl.data.pseudonyms import (
    KEY_ENV,
    LinkageKey,
    LinkageKeyError,
    load_linkage_key,
    pseudonymize,
)
from silofl.errors import BudgetExceeded, DataError, PrivacyError
from silofl.privacy import overlap
from silofl.privacy.ledger import Ledger, tightest
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget

SECRET = b"consortium-secret-0123456789"
SETS = {"a": ["p1", "p2", "p3", "p5"], "b": ["p2", "p3"], "c": ["p3", "p4", "p5"]}


# --- pseudonyms ----------------------------------------------------------------------------

def test_pseudonyms_are_hmac_sha256_keyed_and_type_tolerant() -> None:
    key = LinkageKey(SECRET)
    ref = hmac.new(SECRET, b"patient-7", hashlib.sha256).hexdigest()
    assert key.pseudonym("patient-7") == ref
    out = pseudonymize(key, ["patient-7", 12, "12", np.int64(12), "patient-7"])
    assert out.shape == (5,) and out[0] == out[4] == ref
    assert out[1] == out[2] == out[3] == hmac.new(SECRET, b"12", hashlib.sha256).hexdigest()
    other = pseudonymize(LinkageKey(SECRET + b"!"), ["patient-7", 12])
    assert other[0] != out[0] and other[1] != out[1]  # another key: unrelated pseudonyms
    assert (pseudonymize(LinkageKey(SECRET), np.array([3, 4, 3])) ==
            pseudonymize(key, [3, 4, 3])).all()  # deterministic per key
    for bad in (1.0, True, None, float("nan")):
        with pytest.raises(DataError, match="strings or integers"):
            pseudonymize(key, [1, bad])


def test_short_or_missing_keys_are_refused_and_the_key_never_shows(tmp_path) -> None:
    with pytest.raises(LinkageKeyError, match="15 bytes, fewer than the 16"):
        LinkageKey(b"x" * 15)
    with pytest.raises(LinkageKeyError, match=KEY_ENV):
        load_linkage_key(None, environ={})
    with pytest.raises(LinkageKeyError, match="cannot read"):
        load_linkage_key(tmp_path / "absent.key", environ={})
    short = tmp_path / "short.key"
    short.write_bytes(b"tooshortkey\n")
    with pytest.raises(LinkageKeyError, match="11 bytes") as err:
        load_linkage_key(short, environ={KEY_ENV: SECRET.decode()})
    assert "tooshortkey" not in str(err.value)
    f = tmp_path / "linkage.key"
    f.write_bytes(SECRET + b"\n")  # one trailing newline dropped: equals the env variable
    from_file = load_linkage_key(f, environ={})
    from_env = load_linkage_key("", environ={KEY_ENV: SECRET.decode()})
    assert from_file.pseudonym("p") == from_env.pseudonym("p") == LinkageKey(SECRET).pseudonym("p")
    for k in (from_file, from_env):
        assert SECRET.decode() not in repr(k) and SECRET.decode() not in str(k)
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(k)


# --- the overlap histogram -----------------------------------------------------------------

def test_histogram_counts_persons_by_multiplicity() -> None:
    assert overlap.histogram(SETS).tolist() == [2, 2, 1]  # p1, p4 | p2, p5 | p3
    assert overlap.multiplicities({"a": ["x", "x"], "b": ["x"]}) == Counter({"x": 2})


def test_one_person_at_one_silo_moves_the_histogram_by_at_most_sqrt2() -> None:
    rng = np.random.default_rng(3)
    worst = 0.0
    for _ in range(200):
        k = int(rng.integers(2, 6))
        sets = {f"s{j}": set(rng.choice(12, size=int(rng.integers(0, 12)), replace=False).tolist())
                for j in range(k)}
        h = overlap.histogram(sets)
        silo, person = f"s{int(rng.integers(k))}", int(rng.integers(14))
        other = {n: set(s) for n, s in sets.items()}
        other[silo] ^= {person}  # add or remove one person at one silo
        worst = max(worst, float(np.linalg.norm(overlap.histogram(other) - h)))
    assert worst == pytest.approx(math.sqrt(2)) and worst <= overlap.SENSITIVITY + 1e-12


def _roomy(names, n: int = 10 ** 6, z: float = 2.0) -> list[Ledger]:
    return [Ledger(s, PrivacyTarget(1.0, 1e-5), allowance=Counter({overlap.overlap_event(z): n}))
            for s in names]


def test_released_noise_has_the_declared_std() -> None:
    z, draws = 2.0, 3000
    ledgers, rng = _roomy(SETS, z=z), Randomness.seeded(11)
    noise = np.stack([overlap.release_overlap(SETS, ledgers, z, rng).noisy for _ in range(draws)])
    noise -= overlap.histogram(SETS)
    std = z * math.sqrt(2)
    # the sample std of 9000 draws is within 3% of the true one with overwhelming
    # probability (its relative std error is 1/sqrt(2·9000) ≈ 0.75%)
    assert np.std(noise) == pytest.approx(std, rel=0.03)
    assert abs(noise.mean()) < 4 * std / math.sqrt(noise.size)
    assert all(len(led.entries) == draws for led in ledgers)
    assert all(e.label == "overlap" and e.event == dpa.GaussianDpEvent(z)
               for led in ledgers for e in led.entries)


def test_a_silo_without_room_stops_the_release_before_anything_is_charged(monkeypatch) -> None:
    computed = []
    monkeypatch.setattr(overlap, "histogram", lambda sets: computed.append(1) or np.zeros(3))
    ledgers = [Ledger("a", PrivacyTarget(5.0, 1e-5)), Ledger("b", PrivacyTarget(5.0, 1e-5)),
               Ledger("c", PrivacyTarget(0.05, 1e-5))]  # z = 2 costs ε ≈ 2 here
    with pytest.raises(BudgetExceeded, match="'c'"):
        overlap.release_overlap(SETS, ledgers, 2.0, Randomness.seeded(0))
    assert not computed and all(not led.entries for led in ledgers)
    with pytest.raises(PrivacyError, match="one ledger per silo"):
        overlap.release_overlap(SETS, ledgers[:2], 2.0, Randomness.seeded(0))
    assert not computed and all(not led.entries for led in ledgers)
    with pytest.raises(PrivacyError, match="positive"):
        overlap.release_overlap(SETS, ledgers, 0.0, Randomness.seeded(0))
    ok = overlap.release_overlap(SETS, ledgers[:2] + [Ledger("c", PrivacyTarget(5.0, 1e-5))],
                                 2.0, Randomness.seeded(0))
    assert computed == [1] and ok.counts().min() >= 0 and ok.to_dict()["m"] == [1, 2, 3]


def test_noise_for_meets_its_target_and_no_less_noise_does() -> None:
    z = overlap.noise_for(1.0, 1e-5)
    assert tightest(overlap.overlap_event(z), 1e-5)[0] <= 1.0
    assert tightest(overlap.overlap_event(0.98 * z), 1e-5)[0] > 1.0


# --- per-person weights --------------------------------------------------------------------

def test_record_weights_sum_to_one_per_person() -> None:
    rows = {"a": ["x", "x", "y", "z"], "b": ["x", "z", "z", "z"], "c": ["w"]}
    w = overlap.record_weights(rows)
    assert w["a"]["x"] == pytest.approx(2 / 3) and w["b"]["z"] == pytest.approx(3 / 4)
    assert w["c"] == {"w": 1.0}
    people = {p for r in rows.values() for p in r}
    for p in people:
        assert sum(w[s].get(p, 0.0) for s in rows) == pytest.approx(1.0)
    assert overlap.uniform_weight(4) == 0.25
    for bad in (0, 2.0, True):
        with pytest.raises(PrivacyError):
            overlap.uniform_weight(bad)


def test_pseudonyms_link_persons_across_silos() -> None:
    key = LinkageKey(SECRET)
    ids = {"a": [101, 102, 103], "b": ["103", "104"], "c": [101, 103]}
    sets = {s: pseudonymize(key, v) for s, v in ids.items()}
    assert overlap.histogram(sets).tolist() == [2, 1, 1]  # 102, 104 | 101 | 103
    assert all(len(p) == 64 and int(p, 16) >= 0 for p in itertools.chain(*sets.values()))
