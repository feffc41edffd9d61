"""One implementation of each shared concept: the AUPRC, the TNB mean, the atomic writer
and file hashes (silofl.io). Each is checked against an outside reference."""

import hashlib

import numpy as np
import pytest

from silofl import io
from silofl.errors import ConfigError
from silofl.models import metrics as M
from silofl.pandemic import metrics as PM
from silofl.tuning import distributions as D


def _scores(rng, n: int, kind: int) -> np.ndarray:
    if kind == 0:
        return rng.random(n)                    # distinct scores
    if kind == 1:
        return rng.random(n).round(1)           # many ties
    return np.full(n, 0.5)                      # one threshold


def test_the_one_auprc_matches_sklearn_on_random_and_tied_scores():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(11)
    for trial in range(60):
        n = int(rng.integers(2, 400))
        y = (rng.random(n) < rng.uniform(0.01, 0.6)).astype(int)
        y[int(rng.integers(n))] = 1             # AP needs a positive
        s = _scores(rng, n, trial % 3)
        want = metrics.average_precision_score(y, s)
        assert M.auprc(y, s) == pytest.approx(want, abs=1e-12)
        assert PM.average_precision(y, s) == M.auprc(y, s)  # the same function underneath
        assert M.auprc(y, np.c_[1 - s, s]) == M.auprc(y, s)


def test_auprc_is_nan_without_positives_and_the_pandemic_wrapper_checks_input():
    s = np.array([0.2, 0.9, 0.4])
    assert np.isnan(M.auprc(np.zeros(3), s)) and np.isnan(PM.average_precision([0, 0, 0], s))
    assert np.isnan(M.auprc(np.array([0, 1, 1]), np.array([0.1, np.nan, 0.3])))


def test_the_one_tnb_mean_matches_the_distribution_it_describes():
    from silofl.theory import tnb_mean as theory_tnb_mean
    assert theory_tnb_mean is D.tnb_mean
    for eta, gamma in ((0.0, 0.2), (1.0, 0.1), (2.5, 0.05), (0.5, 0.6)):
        h = np.arange(1, 20_000)
        pmf = D.tnb(eta, gamma=gamma).pmf(h)
        assert D.tnb_mean(eta, gamma) == pytest.approx(float(np.sum(h * pmf)), rel=1e-9)
    assert D.tnb(1.0, mean=10.0).mean == pytest.approx(10.0, rel=1e-12)
    with pytest.raises(ConfigError, match="γ"):
        D.tnb_mean(1.0, 1.5)
    with pytest.raises(ConfigError, match="eta"):
        D.tnb_mean(-2.0, 0.5)


def test_atomic_writes_replace_whole_files_and_hashes_match_hashlib(tmp_path):
    f = tmp_path / "a" / "b.json"
    with pytest.raises(OSError):                # no folder: refused unless asked
        io.write_json_atomic(f, {"x": 1})
    io.write_text_atomic(f, "old", mkdir=True)
    io.write_json_atomic(f, {"x": float("nan"), "y": np.float32(2.0)})
    assert f.read_text() == '{"x": null, "y": 2.0}'
    assert [p.name for p in f.parent.iterdir()] == ["b.json"]  # no temp file left
    assert io.sha256_file(f) == hashlib.sha256(f.read_bytes()).hexdigest()
    assert io.file_hashes(f.parent, {"doc": "b.json"}) == {"doc": io.sha256_file(f)}


def test_one_array_digest_sees_values_dtype_and_shape():
    from silofl.runtime.job import fingerprint
    x = np.arange(6.0)
    d = io.array_digest(x.reshape(2, 3), np.zeros(2))
    assert d == fingerprint(x.reshape(2, 3), np.zeros(2)) and len(d) == 16
    assert d != io.array_digest(x.reshape(3, 2), np.zeros(2))            # shape
    assert d != io.array_digest(x.reshape(2, 3).astype(np.float32), np.zeros(2))  # dtype
    x[0] = 1e-300
    assert d != io.array_digest(x.reshape(2, 3), np.zeros(2))            # values
