"""Models: per-example gradients, the closed-form clipped sum, clipping bounds, metrics,
and model/task compatibility."""

from __future__ import annotations

import numpy as np
import pytest

from silofl.algorithms import make_algorithm
from silofl.data import linear_silos
from silofl.errors import ConfigError
from silofl.models import MODELS, make_model
from silofl.models import metrics as M
from silofl.models.base import Model
from silofl.privacy.clipping import clip_bound
from silofl.runtime.plan import TrainingConfig
from silofl.runtime.simulator import simulate

D = 4


def _data(name, n=12, d=D, seed=0, num_classes=3):
    """Random inputs and labels that fit model `name`."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    if name == "linear":
        y = rng.normal(size=n) * 2
    elif name == "softmax":
        y = rng.integers(0, num_classes, n).astype(float)
        y[:num_classes] = np.arange(num_classes)
    else:
        y = (np.arange(n) % 2).astype(float)
    return X, y


def _model(name, d=D):
    if name == "focal":
        return make_model("focal", d, gamma=1.5, alpha=0.3)
    if name == "softmax":
        return make_model("softmax", d, 3)
    return make_model(name, d)


def _params(model, seed=1, scale=0.7):
    return np.random.default_rng(seed).normal(size=model.num_params) * scale


def _fd_grads(model, w, X, y, h=1e-6):
    """Central finite differences of each example's loss → (n, P)."""
    out = np.zeros((X.shape[0], w.size))
    for j in range(w.size):
        e = np.zeros_like(w)
        e[j] = h
        out[:, j] = (model.loss(w + e, X, y) - model.loss(w - e, X, y)) / (2 * h)
    return out


# --- per-example gradients ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["linear", "logistic", "focal", "softmax"])
def test_per_example_grads_match_finite_differences(name):
    model = _model(name)
    X, y = _data(name)
    w = _params(model)
    g = model.per_example_grads(w, X, y)
    assert g.shape == (X.shape[0], model.num_params)
    fd = _fd_grads(model, w, X, y)
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)
    assert np.abs(g).max() > 1e-3  # not a degenerate all-zero comparison


@pytest.mark.parametrize("gamma,alpha", [(0.0, 0.5), (2.0, 0.25), (3.5, 0.8)])
def test_focal_grads_for_several_gamma_alpha(gamma, alpha):
    model = make_model("focal", D, gamma=gamma, alpha=alpha)
    X, y = _data("focal", seed=3)
    w = _params(model, seed=4, scale=1.5)
    np.testing.assert_allclose(model.per_example_grads(w, X, y), _fd_grads(model, w, X, y),
                               rtol=1e-5, atol=1e-7)


def test_focal_with_gamma0_alpha_half_is_half_logistic():
    """γ = 0, α = 0.5 reduces focal loss to 0.5 · cross-entropy."""
    X, y = _data("logistic")
    foc, log = make_model("focal", D, gamma=0.0, alpha=0.5), make_model("logistic", D)
    w = _params(log)
    np.testing.assert_allclose(foc.loss(w, X, y), 0.5 * log.loss(w, X, y), rtol=1e-12)
    np.testing.assert_allclose(foc.per_example_grads(w, X, y),
                               0.5 * log.per_example_grads(w, X, y), rtol=1e-10, atol=1e-14)


def test_svm_hinge_grads_away_from_kink():
    model = make_model("svm", D)
    X, y = _data("svm", n=40, seed=5)
    w = _params(model, seed=6, scale=1.0)
    margin = (2 * y - 1) * model.logits(w, X)
    keep = np.abs(margin - 1) > 1e-2  # finite differences are invalid at the kink
    X, y, margin = X[keep], y[keep], margin[keep]
    assert (margin < 1).any() and (margin > 1).any()  # both branches exercised
    g = model.per_example_grads(w, X, y)
    np.testing.assert_allclose(g, _fd_grads(model, w, X, y), rtol=1e-6, atol=1e-8)
    assert np.all(g[margin > 1] == 0)


# --- closed-form clipped sums ---------------------------------------------------------------

def _batched(name, K=3, B=9, seed=0, dtype=np.float64):
    model = _model(name)
    rng = np.random.default_rng(seed)
    Xs, ys = zip(*[_data(name, n=B, seed=seed + 10 + k) for k in range(K)])
    X = (np.stack(Xs) * rng.uniform(0.2, 3.0, size=(K, B, 1))).astype(dtype)
    y = np.stack(ys)
    W = np.stack([_params(model, seed=seed + 20 + k, scale=1.0) for k in range(K)])
    mask = rng.random((K, B)) < 0.7
    mask[:, 0] = True
    mask[0, -1] = False
    return model, W, X, y, mask


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("clip", [0.05, 0.7, 1e6])
def test_closed_form_clipped_sum_equals_generic(name, clip):
    model, W, X, y, mask = _batched(name)
    fast = model.clipped_grad_sum(W, X, y, mask, clip)
    ref = Model.clipped_grad_sum(model, W, X, y, mask, clip)
    assert fast.shape == ref.shape == W.shape
    np.testing.assert_allclose(fast, ref, rtol=1e-10, atol=1e-12)
    # masked rows contribute nothing: zeroing their data leaves the sum unchanged
    X2 = np.where(mask[..., None], X, 123.0)
    np.testing.assert_allclose(model.clipped_grad_sum(W, X2, y, mask, clip), fast,
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(MODELS))
def test_closed_form_clipped_sum_float32_inputs(name):
    """The trainer feeds float32 rows (and a float32 ‖x‖²); parameters stay float64."""
    model, W, X, y, mask = _batched(name, seed=7)
    X32 = X.astype(np.float32)
    sq = np.einsum("kbd,kbd->kb", X, X).astype(np.float32)
    fast = model.clipped_grad_sum(W, X32, y, mask, 0.5, x_sqnorm=sq)
    ref = Model.clipped_grad_sum(model, W, X.astype(np.float64), y, mask, 0.5)
    assert fast.dtype == np.float64
    np.testing.assert_allclose(fast, ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_grad_sum_equals_sum_of_per_example_grads(name):
    model, W, X, y, mask = _batched(name, seed=11)
    ref = np.stack([(model.per_example_grads(W[k], X[k], y[k]) * mask[k][:, None]).sum(0)
                    for k in range(W.shape[0])])
    np.testing.assert_allclose(model.grad_sum(W, X, y, mask), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(MODELS))
def test_clipping_bounds_every_per_example_norm(name):
    clip = 0.3
    model, W, X, y, mask = _batched(name, B=15, seed=2)
    K, B = mask.shape
    for k in range(K):
        raw = model.per_example_grads(W[k], X[k], y[k])
        raw_norm = np.linalg.norm(raw, axis=1)
        assert (raw_norm > clip).any()  # clipping is actually exercised
        # Each example as its own one-row "silo": the clipped sums ARE the clipped gradients.
        Wk = np.repeat(W[k][None], B, 0)
        ones = np.ones((B, 1), bool)
        fast = model.clipped_grad_sum(Wk, X[k][:, None, :], y[k][:, None], ones, clip)
        generic = Model.clipped_grad_sum(model, Wk, X[k][:, None, :], y[k][:, None], ones, clip)
        for g in (fast, generic):
            norms = np.linalg.norm(g, axis=1)
            assert np.all(norms <= clip)
            # clipped to the bound just inside the ball (see privacy.clipping.CLIP_MARGIN)
            np.testing.assert_allclose(norms, np.minimum(raw_norm, clip_bound(clip)), rtol=1e-9,
                                       atol=1e-12)
            # clipping only rescales: the direction is kept
            np.testing.assert_allclose(g * np.maximum(raw_norm, 1e-300)[:, None],
                                       raw * np.maximum(norms, 1e-300)[:, None],
                                       rtol=1e-8, atol=1e-12)
    s = model.clipped_grad_sum(W, X, y, mask, clip)
    assert np.all(np.linalg.norm(s, axis=1) <= clip * mask.sum(1))


def test_clipped_sum_is_c_times_count_for_aligned_large_gradients():
    """Identical huge gradients: the sum norm reaches exactly C · (#unmasked rows)."""
    model = make_model("linear", 2)
    W = np.zeros((1, 3))
    X = np.tile([[3.0, 4.0]], (1, 6, 1))
    y = np.full((1, 6), -100.0)
    mask = np.array([[True, True, False, True, False, True]])
    s = model.clipped_grad_sum(W, X, y, mask, 0.5)
    np.testing.assert_allclose(np.linalg.norm(s), clip_bound(0.5) * 4, rtol=1e-12)


def _adversarial_rows(model, clip, d=6, seed=0):
    """float64 rows (n, d) and labels: raw per-example gradient norms within ±16 float32
    ulps of `clip` (at W = 0, where the residual depends on y only), features spanning
    1e-38 … 1e37 (‖x‖² overflowing float32 above ~1e19), one huge feature among tiny ones,
    and plain random rows. None is exactly representable in float32."""
    rng = np.random.default_rng(seed)
    n_edge = 33 * 24
    y = _data(model.name, n=n_edge + 600, d=1, seed=seed)[1]
    if model.name == "linear":
        y = rng.choice([-1.0, 1.0], y.size) * rng.uniform(0.2, 2.0, y.size)
    r = model.residual(np.zeros((y.size, model.outputs)).squeeze(-1)
                       if model.outputs == 1 else np.zeros((y.size, model.outputs)), y)
    rnorm = np.abs(r) if model.outputs == 1 else np.linalg.norm(r, axis=-1)
    direction = rng.normal(size=(y.size, d))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    # edge rows: |r|·√(t² + 1) = clip·(1 + k·2⁻²⁴), k = −16…16
    k = np.tile(np.arange(-16, 17), 24)
    t = np.sqrt((clip * (1 + k * 2.0**-24) / rnorm[:n_edge]) ** 2 - 1)
    X = direction * np.concatenate([t, np.ones(600)])[:, None]
    scales = 10.0 ** rng.uniform(-38, 37, 600)
    X[n_edge:n_edge + 300] *= scales[:300, None] * (1 + 1e-3 * rng.random((300, 1)))
    X[n_edge + 300:n_edge + 450] *= 1e-20  # tiny features, one of them huge
    X[n_edge + 300:n_edge + 450, 0] = scales[300:450] * np.pi
    X[n_edge + 450:] = rng.normal(size=(150, d)) * rng.uniform(0.1, 30, (150, 1)) * np.e
    return X, y


@pytest.mark.parametrize("name", list(MODELS))
def test_clipped_gradients_never_exceed_clip_in_floating_point(name, monkeypatch):
    """Each adversarial row as its own one-row silo, in the trainer's format (float32 rows,
    ‖x‖² from the float64 data stored as float32) and via the in-model ‖x‖²: the returned
    clipped gradient IS the per-example gradient as computed (float32 products included),
    and its float64 norm must be ≤ C. Without the margin some of these rows exceed C."""
    clip = 3.0
    model = _model(name, d=6)
    X64, y = _adversarial_rows(model, clip)
    X32 = X64.astype(np.float32)
    with np.errstate(over="ignore"):  # ‖x‖² overflows float32 for the huge rows, on purpose
        sq32 = np.einsum("nd,nd->n", X64, X64).astype(np.float32)
    n = len(y)
    W = np.zeros((n, model.num_params))
    ones = np.ones((n, 1), bool)
    raw = np.linalg.norm(Model.clipped_grad_sum(model, W, X32[:, None].astype(np.float64),
                                                y[:, None], ones, np.inf), axis=1)
    assert np.sum(raw > clip) > 200 and np.sum(raw < clip) > 200  # both sides of C

    def norms(**kw):
        with np.errstate(over="ignore", invalid="ignore"):
            out = model.clipped_grad_sum(W, X32[:, None], y[:, None], ones, clip, **kw)
        assert np.all(np.isfinite(out))
        return np.linalg.norm(out, axis=1)

    for kw in ({"x_sqnorm": sq32[:, None]}, {}):
        got = norms(**kw)
        assert np.all(got <= clip), (got.max() / clip - 1)
        fine = raw < 1e15  # rows whose ‖x‖² fits float32 keep their clipped norm
        np.testing.assert_allclose(got[fine], np.minimum(raw[fine], clip), rtol=2e-6)
    # random parameters: the residuals now depend on x as well
    W = np.random.default_rng(3).normal(size=(n, model.num_params))
    assert np.all(norms(x_sqnorm=sq32[:, None]) <= clip)
    # the margin is what makes it hold: clipping exactly to C overshoots on these rows
    import silofl.models.glm as glm
    monkeypatch.setattr(glm, "clip_bound", float)
    W = np.zeros((n, model.num_params))
    assert np.any(norms(x_sqnorm=sq32[:, None]) > clip)


# --- metrics ----------------------------------------------------------------------------------

def test_auprc_hand_computed():
    # ranked labels 1,0,1,0,1: precision at the hits 1, 2/3, 3/5
    y = np.array([1, 0, 1, 0, 1])
    s = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    assert M.auprc(y, s) == pytest.approx((1 + 2 / 3 + 3 / 5) / 3, abs=1e-12)
    # ties are one threshold: {0.9: +}, {0.5: -, +}, {0.1: -} → 0.5·1 + 0.5·(2/3)
    y2 = np.array([1, 0, 1, 0])
    s2 = np.array([0.9, 0.5, 0.5, 0.1])
    assert M.auprc(y2, s2) == pytest.approx(0.5 + 0.5 * 2 / 3, abs=1e-12)
    # order of the rows must not matter
    p = np.array([3, 1, 0, 2])
    assert M.auprc(y2[p], s2[p]) == pytest.approx(0.5 + 0.5 * 2 / 3, abs=1e-12)
    # perfect ranking → 1; no positives → NaN; (n, 2) probabilities use column 1
    assert M.auprc(np.array([0, 1, 1]), np.array([0.1, 0.8, 0.9])) == pytest.approx(1.0)
    assert np.isnan(M.auprc(np.zeros(3), np.array([0.1, 0.2, 0.3])))
    probs = np.stack([1 - s, s], axis=1)
    assert M.auprc(y, probs) == pytest.approx(M.auprc(y, s))


def test_roc_auc_matches_brute_force_pair_count():
    rng = np.random.default_rng(0)
    for trial in range(5):
        n = 40
        y = rng.integers(0, 2, n)
        y[:2] = [0, 1]
        s = np.round(rng.normal(size=n) + 0.8 * y, 1)  # rounding creates ties
        pos, neg = s[y == 1], s[y == 0]
        diff = pos[:, None] - neg[None, :]
        brute = ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size
        assert (diff == 0).any() or trial > 0
        assert M.roc_auc(y, s) == pytest.approx(brute, abs=1e-12)
    assert np.isnan(M.roc_auc(np.ones(4), np.arange(4.0)))


def test_accuracy_and_margin_accuracy():
    y = np.array([0, 1, 1, 0])
    assert M.accuracy(y, np.array([0.2, 0.7, 0.4, 0.5])) == 0.5
    assert M.accuracy(np.array([2, 0]), np.array([[0.1, 0.2, 0.7], [0.5, 0.4, 0.1]])) == 1.0
    assert M.margin_accuracy(y, np.array([-1.0, 0.3, 2.0, -0.1])) == 1.0
    assert M.metric_fn("accuracy", "svm") is M.margin_accuracy
    with pytest.raises(ConfigError, match="unknown metric"):
        M.metric_fn("f1", "logistic")


def test_pooled_weights_by_test_counts():
    assert M.pooled([0.5, 1.0], [1, 3]) == pytest.approx(0.875)
    assert M.pooled([0.5, 1.0], [3, 1]) == pytest.approx(0.625)
    # silos with an undefined metric or no test rows are left out
    assert M.pooled([0.5, np.nan, 0.2], [2, 5, 0]) == pytest.approx(0.5)
    assert np.isnan(M.pooled([np.nan], [3]))


def test_simulator_pools_per_silo_metrics_by_test_counts():
    fed = linear_silos(num_silos=3, sizes=[30, 90, 200], dim=3, seed=1)
    counts = np.array([s.n_test for s in fed.silos])
    assert len(set(counts.tolist())) == 3
    res = simulate(fed, make_model("linear", 3), make_algorithm("local"),
                   TrainingConfig(rounds=3, batch_size=8, private=False, seed=0))
    per = np.array(res.final_per_silo)
    assert res.final_pooled == pytest.approx(float((per * counts).sum() / counts.sum()), rel=1e-12)
    assert res.final_pooled != pytest.approx(float(per.mean()), rel=1e-6)


# --- model / task compatibility ---------------------------------------------------------------

@pytest.mark.parametrize("name,task", [("logistic", "regression"), ("linear", "binary"),
                                       ("svm", "multiclass"), ("focal", "regression"),
                                       ("softmax", "regression"), ("linear", "multiclass")])
def test_model_task_mismatch_raises_config_error(name, task):
    with pytest.raises(ConfigError, match=task):
        make_model(name, 3).check_task(task)


@pytest.mark.parametrize("name,task", [("logistic", "binary"), ("linear", "regression"),
                                       ("softmax", "multiclass"), ("softmax", "binary"),
                                       ("svm", "binary"), ("focal", "binary")])
def test_model_task_match_accepted(name, task):
    """An accepted pair must also work: the model's loss on labels of that task falls
    under plain gradient descent (its own per-example gradients) on learnable data."""
    k = 3 if task == "multiclass" else 2
    m = make_model(name, 3, k)
    m.check_task(task)  # accepted: no error
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    s = X @ np.array([1.5, -2.0, 0.5])
    y = {"regression": s, "binary": (s > 0).astype(np.int64),
         "multiclass": np.digitize(s, [-1.0, 1.0]).astype(np.int64)}[task]
    w = m.init_params()
    before = float(m.loss(w, X, y).mean())
    for _ in range(50):
        g = m.per_example_grads(w, X, y)
        assert g.shape == (len(y), w.size) and np.all(np.isfinite(g))
        w = w - 0.1 * g.mean(axis=0)
    after = float(m.loss(w, X, y).mean())
    assert np.isfinite(before) and after < 0.8 * before, (before, after)
    p = m.predict(w, X)
    assert p.shape == ((len(y), k) if name == "softmax" else (len(y),)) and np.all(np.isfinite(p))


def test_simulate_rejects_model_for_wrong_task():
    fed = linear_silos(num_silos=2, sizes=[20, 20], dim=2, seed=0)  # regression
    with pytest.raises(ConfigError, match="logistic"):
        simulate(fed, make_model("logistic", 2), make_algorithm("local"),
                 TrainingConfig(rounds=1, batch_size=4, private=False))


def test_make_model_errors():
    with pytest.raises(ConfigError, match="Did you mean 'logistic'"):
        make_model("logistc", 3)
    with pytest.raises(ConfigError, match="alpha"):
        make_model("focal", 3, alpha=1.5)
    with pytest.raises(ConfigError, match="gamma"):
        make_model("focal", 3, gamma=-1.0)
    with pytest.raises(ConfigError, match="2 classes"):
        make_model("softmax", 3, 1)
    with pytest.raises(ConfigError, match="invalid options"):
        make_model("linear", 3, gamma=2.0)
    assert make_model("softmax", 3, 4).num_params == 4 * 4
    assert make_model("logistic", 3).num_params == 4
