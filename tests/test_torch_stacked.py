"""The stacked engine (silofl.models.torch_stacked): K silos with their own parameters in one
pass give the per-example gradients, norms and clipped sums of the torch.func path run silo
by silo (float32, tolerance 1e-5), for MLPs, LayerNorm MLPs and conv nets (padding, stride,
the ReLU/max-pool swap); architectures it does not cover fall back to torch.func; the
Opacus benchmark's smoke run works."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import silofl.models.torch_model as TM  # noqa: E402
from silofl.models import make_model  # noqa: E402
from silofl.models.torch_model import TorchModel  # noqa: E402
from silofl.models.torch_stacked import StackedNet  # noqa: E402

TOL = 1e-5  # float32, sums reduced in another order


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _padded_conv(task: str = "multiclass", C: int = 4) -> TorchModel:
    """A conv net with padding, a stride, a bias-free conv, an in-place ReLU and average
    pooling."""
    net = nn.Sequential(nn.Conv2d(2, 5, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                        nn.Conv2d(5, 6, 3, stride=2, bias=False), nn.Tanh(),
                        nn.AvgPool2d(2), nn.Flatten(), nn.Linear(6, C))
    return TorchModel(net, task=task, input_shape=(2, 12, 12), num_classes=C, name="padded")


MODELS = {
    "mlp": lambda: make_model("mlp", 6, 3, task="multiclass", hidden=[16, 8]),
    "mlp_norm": lambda: make_model("mlp_norm", 6, 2, task="binary", hidden=[8]),
    "convnet": lambda: make_model("convnet", 0, 3, task="multiclass", input_shape=(1, 14, 14)),
    "padded_conv": _padded_conv,
    "regression": lambda: make_model("mlp", 4, 1, task="regression", hidden=[5]),
    "inplace_relu": lambda: TorchModel(nn.Sequential(nn.Linear(6, 8), nn.ReLU(inplace=True),
                                                     nn.Linear(8, 3)), task="multiclass",
                                       input_shape=(6,), num_classes=3, name="inplace"),
}


def _data(model, K=3, B=7, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(K, B) + model.input_shape).astype(np.float32)
    if model.task == "regression":
        y = rng.normal(size=(K, B))
    else:
        y = rng.integers(0, max(2, model.num_classes), (K, B)).astype(float)
    W = model.init_params() + rng.normal(0, 0.2, (K, model.num_params))  # own parameters
    mask = rng.random((K, B)) > 0.3
    return W, X, y, mask


@pytest.mark.parametrize("name", list(MODELS))
def test_stacked_per_example_grads_equal_the_per_silo_loop(name):
    model = MODELS[name]()
    assert model.stacked and model._stacked is not None
    W, X, y, _ = _data(model)
    batch = model._stacked.backward(model._params(W), model._inputs(X, 2), model._labels(y),
                                    model._loss)
    pe = model._stacked.per_example(batch)
    got = torch.cat([pe[n].flatten(2) for n in model._names], -1).double().numpy()
    loop = np.stack([model.per_example_grads(W[k], X[k], y[k]) for k in range(len(W))])
    scale = np.abs(loop).max()
    np.testing.assert_allclose(got / scale, loop / scale, rtol=0, atol=TOL)
    # the norms without materializing dense-layer gradients
    norms = model._stacked.sq_norms(batch, set(model._names).__contains__).sqrt().numpy()
    ref = np.linalg.norm(loop, axis=-1)
    np.testing.assert_allclose(norms, ref, rtol=TOL, atol=TOL * ref.max())


@pytest.mark.parametrize("name", list(MODELS))
def test_stacked_clipped_sums_equal_torch_func(name):
    model = MODELS[name]()
    W, X, y, mask = _data(model, seed=1)
    ref = TorchModel.__new__(TorchModel)
    ref.__dict__.update(model.__dict__)
    ref.stacked = False  # the torch.func path, silo by silo
    ref.silo_vmap = False
    for clip in (0.05, 1.0, 50.0):
        a = model.clipped_grad_sum(W, X, y, mask, clip)
        b = ref.clipped_grad_sum(W, X, y, mask, clip)
        np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL * max(clip, np.abs(b).max()))
    clips = np.array([0.05, 0.3, 2.0])
    (a, ca), (b, cb) = (m.clipped_grad_sum_count(W, X, y, mask, clips) for m in (model, ref))
    np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL * np.abs(b).max())
    np.testing.assert_array_equal(ca, cb)
    weights = mask * np.random.default_rng(2).uniform(0.2, 1.0, mask.shape)  # person level
    np.testing.assert_allclose(model.clipped_grad_sum(W, X, y, weights, 0.3),
                               ref.clipped_grad_sum(W, X, y, weights, 0.3), rtol=TOL,
                               atol=TOL)
    plain = ref.grad_sum(W, X, y, mask)
    np.testing.assert_allclose(model.grad_sum(W, X, y, mask), plain, rtol=TOL,
                               atol=TOL * np.abs(plain).max())


def test_stacked_partial_updates_and_chunks(monkeypatch):
    model = MODELS["convnet"]()
    W, X, y, mask = _data(model, K=4, seed=3)
    head = model.param_groups()["head"]
    ref = TorchModel.__new__(TorchModel)
    ref.__dict__.update(model.__dict__)
    ref.stacked = False
    for coords in (head, ~head):  # whole tensors: the stacked engine serves them
        assert model._stacked_include(coords) is not None
        a = model.clipped_grad_sum(W, X, y, mask, 0.2, coords=coords)
        np.testing.assert_allclose(a, ref.clipped_grad_sum(W, X, y, mask, 0.2, coords=coords),
                                   rtol=TOL, atol=TOL * 0.2)
        assert not a[:, ~coords].any()
    split = head.copy()
    split[0] = True  # a tensor cut in two: torch.func serves it
    assert model._stacked_include(split) is None
    full = model.clipped_grad_sum(W, X, y, mask, 0.2)
    monkeypatch.setattr(TM, "STACK_BYTES", 1)  # one silo per chunk
    np.testing.assert_allclose(model.clipped_grad_sum(W, X, y, mask, 0.2), full, rtol=TOL,
                               atol=TOL * 0.2)


def test_examples_split_across_threads_give_the_same_sums(monkeypatch):
    """With two intra-op threads and enough work, a CPU step splits its examples over two
    worker threads (`SPLIT_BYTES`); sums, counts and the plain sum stay the same."""
    model = MODELS["padded_conv"]()
    W, X, y, mask = _data(model, K=3, B=9, seed=6)
    clips = np.array([0.05, 0.3, 2.0])
    serial = (model.clipped_grad_sum_count(W, X, y, mask, clips),
              model.grad_sum(W, X, y, mask))
    assert model._stacked_parts(3, 9)[1] == 0  # one thread (the fixture): no split
    monkeypatch.setattr(TM, "SPLIT_BYTES", 0)
    torch.set_num_threads(2)
    try:
        items, workers = model._stacked_parts(3, 9)
        assert workers == 2 and len(items) == 2 * len({i[0].start for i in items})
        (a, ca), plain = (model.clipped_grad_sum_count(W, X, y, mask, clips),
                          model.grad_sum(W, X, y, mask))
    finally:
        torch.set_num_threads(1)
    (b, cb), ref = serial
    np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL * np.abs(b).max())
    np.testing.assert_array_equal(ca, cb)
    np.testing.assert_allclose(plain, ref, rtol=TOL, atol=TOL * np.abs(ref).max())


def test_every_clipped_example_has_norm_at_most_C():
    model = MODELS["padded_conv"]()
    W, X, y, _ = _data(model, K=2, B=9, seed=4)
    X *= np.float32(30.0)  # large gradients: every example is clipped
    for i in range(9):
        one = np.zeros((2, 9), bool)
        one[:, i] = True
        for clip in (1e-3, 0.5):
            c = model.clipped_grad_sum(W, X, y, one, clip)
            assert np.all(np.linalg.norm(c, axis=1) <= clip)


def test_uncovered_architectures_fall_back_to_torch_func():
    gn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.Flatten(),
                       nn.Linear(4 * 6 * 6, 2))
    assert StackedNet.build(gn, (1, 8, 8)) is None

    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 1)

        def forward(self, x):
            return self.lin(x) * 2

    model = TorchModel(Custom(), task="binary", input_shape=(3,))
    assert not model.stacked
    W, X, y, mask = _data(model, seed=5)
    g = model.clipped_grad_sum(W, X, y, mask, 0.1)
    assert g.shape == (3, 4) and np.all(np.linalg.norm(g, axis=1) <= 0.1 * mask.sum(1) + 1e-9)


def test_opacus_benchmark_smoke():
    """bench_torch_opacus on a tiny MLP: a row with a throughput, and (with Opacus) the same
    clipped gradient and a ratio."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_torch_opacus.py"
    spec = importlib.util.spec_from_file_location("bench_torch_opacus", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_torch_opacus"] = bench
    spec.loader.exec_module(bench)

    class Args:
        steps, pairs, noise = 1, 1, "secure"
    row = bench.compare(bench.Case("mlp", (5,), 8, (4,)), 2, Args)
    assert row["ours"] > 0 and 0 <= row["noise_share"]
    if importlib.util.find_spec("opacus") is not None:
        assert row["same_grad"] < 1e-4 and row["ratio"][0] > 0
