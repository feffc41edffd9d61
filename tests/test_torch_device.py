"""[training] device for the torch backend: "cpu" (default) and "auto" give identical runs on
a machine without a GPU (same parameters, same privacy), "cuda" without a GPU and unknown
devices are refused with a clear ConfigError before anything runs or is charged, and on a GPU
the CUDA computation agrees with the CPU one."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tomli_w  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from silofl.config import config_from_dict  # noqa: E402
from silofl.data import load_heart_disease  # noqa: E402
from silofl.errors import ConfigError  # noqa: E402
from silofl.experiments.build import build_model  # noqa: E402
from silofl.experiments.run import run  # noqa: E402
from silofl.models.torch_model import resolve_device  # noqa: E402
from silofl.models.torch_nets import make_torch_model  # noqa: E402

NO_GPU = not torch.cuda.is_available()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _heart_mlp(device, **training):
    return {"model": {"name": "mlp", "hidden": [8]},
            "training": {"methods": ["fedavg"], "rounds": 3, "batch_size": 16,
                         "device": device, **training},
            "privacy": {"epsilon": 2.0, "delta": 1e-5, "noise": "seeded"},
            "budget": {"scratch": True}, "output": {"dir": ""}}


def _kt_mlp(device):
    """PrivateKT on real MNIST digits (6 clients, an MLP on flattened images)."""
    return {"data": {"source": "mnist_dirichlet", "num_silos": 6, "train_per_silo": 60,
                     "test_per_silo": 20, "public_size": 100, "flatten": True,
                     "standardize": "none"},
            "model": {"name": "mlp", "hidden": [16]},
            "training": {"methods": ["privatekt"], "rounds": 2, "local_epochs": 1,
                         "batch_size": 32, "kt_server_epochs": 1, "device": device},
            "privacy": {"epsilon": 100.0, "delta": 1e-5, "noise": "seeded"},
            "budget": {"scratch": True}, "output": {"dir": ""}}


@pytest.mark.skipif(not NO_GPU, reason="on a GPU machine 'auto' means CUDA (see the GPU test)")
@pytest.mark.parametrize("make", [_heart_mlp, _kt_mlp], ids=["dpsgd-fedavg", "privatekt"])
def test_auto_is_the_cpu_path_bit_for_bit_without_a_gpu(make):
    a, b = run(config_from_dict(make("cpu"))), run(config_from_dict(make("auto")))
    for ra, rb in zip(a.results, b.results):
        assert np.array_equal(ra.params, rb.params)
        assert ra.params.dtype == np.float64
    assert [c["epsilon"] for c in a.combined_privacy] == \
        [c["epsilon"] for c in b.combined_privacy]
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused_before_anything_runs(tmp_path):
    from silofl.cli import app
    with pytest.raises(ConfigError, match="no CUDA device"):
        run(config_from_dict(_heart_mlp("cuda")))
    cfg = _heart_mlp("cuda")
    cfg["budget"] = {"store": str(tmp_path / "b.sqlite")}
    cfg["output"] = {"dir": str(tmp_path / "o")}
    (tmp_path / "gpu.toml").write_text(tomli_w.dumps(cfg))
    res = CliRunner().invoke(app, ["run", "--config", str(tmp_path / "gpu.toml")])
    assert res.exit_code == 2, res.output
    assert "device" in res.output and "auto" in res.output
    assert not (tmp_path / "o").exists() and not (tmp_path / "b.sqlite").exists()


def test_unknown_devices_and_gpu_glms_are_config_errors():
    heart = load_heart_disease(seed=0)
    for dev in ("gpu", "cuda:x", "tpu"):
        with pytest.raises(ConfigError, match="unknown \\[training\\] device"):
            build_model(config_from_dict(_heart_mlp(dev)), heart)
        with pytest.raises(ConfigError, match="unknown \\[training\\] device"):
            build_model(config_from_dict({"training": {"device": dev}}), heart)
    with pytest.raises(ConfigError, match="only applies to the torch models"):
        build_model(config_from_dict({"training": {"device": "cuda"}}), heart)
    glm = build_model(config_from_dict({"training": {"device": "auto"}}), heart)
    assert glm.name == "logistic"


@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU")
def test_cuda_agrees_with_the_cpu():
    rng = np.random.default_rng(0)
    cpu = make_torch_model("kt_cnn", 0, 10, input_shape=(1, 28, 28), seed=3)
    gpu = make_torch_model("kt_cnn", 0, 10, input_shape=(1, 28, 28), seed=3, device="cuda")
    assert next(gpu.module.parameters()).is_cuda
    w = cpu.init_params()
    assert np.array_equal(w, gpu.init_params())  # initialization runs on the CPU
    X = rng.random((2, 8, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, (2, 8)).astype(float)
    mask = np.ones((2, 8), bool)
    W = np.stack([w, w])
    a, b = cpu.clipped_grad_sum(W, X, y, mask, 1.0), gpu.clipped_grad_sum(W, X, y, mask, 1.0)
    assert isinstance(b, np.ndarray) and b.dtype == np.float64
    assert np.allclose(a, b, atol=1e-4)
    assert np.allclose(cpu.predict(w, X[0]), gpu.predict(w, X[0]), atol=1e-5)
    wt = rng.random((1, 8))
    assert np.allclose(cpu.grad_sum(W[:1], X[:1], y[:1], wt), gpu.grad_sum(W[:1], X[:1], y[:1],
                                                                           wt), atol=1e-4)
