"""Neural architectures for the PyTorch backend, and `make_torch_model` to build them.

* `mlp` — tabular data (per-example x of shape (d,)): Linear → ReLU blocks of the given
  hidden widths (default one hidden layer of 64 units: enough capacity to beat a GLM on
  interacting features while staying small, since DP noise grows with √P), then a Linear
  head.
* `mlp_norm` — the MLP with a LayerNorm after each hidden Linear (FedBN's personal
  normalization layers; LayerNorm normalizes each example by its own statistics, so it is
  safe under DP-SGD where BatchNorm is not).
* `convnet` — images (per-example x of shape (C, H, W), channels first): the ConvNet of
  thesis appendix B.1: Conv k×k 32 → ReLU → MaxPool 2 → Conv k×k 64 → ReLU → MaxPool 2 →
  Linear, no padding (k = 3; appendix B.1 uses k = 5 for ADNI).

The head has one output for binary (a logit) and regression (the value) tasks, C outputs for
multiclass. Losses and prediction conventions live in `silofl.models.torch_model`.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from silofl.errors import ConfigError
from silofl.models.torch_model import TASKS, TorchModel, mismatch_message, resolve_device

DEFAULT_HIDDEN = (64,)


def mlp(in_dim: int, out_dim: int, hidden: Sequence[int] = DEFAULT_HIDDEN,
        norm: bool = False) -> nn.Sequential:
    """(n, in_dim) → (n, out_dim); `hidden` = widths of the ReLU layers (may be empty).
    norm: a LayerNorm (with affine parameters) after each hidden Linear, before its ReLU —
    per-example statistics, so DP-SGD's per-example gradients stay separate (`mlp_norm`)."""
    layers: list[nn.Module] = []
    width = in_dim
    for h in hidden:
        layers += [nn.Linear(width, h), *([nn.LayerNorm(h)] if norm else []), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


def convnet_feature_side(side: int, kernel: int = 3) -> int:
    """Spatial side after the two conv (valid, stride 1) + 2×2 max-pool (floor) stages."""
    for _ in range(2):
        side = (side - kernel + 1) // 2
    return side


def convnet(input_shape: Sequence[int], out_dim: int, kernel: int = 3) -> nn.Sequential:
    """(n, C, H, W) → (n, out_dim), the appendix B.1 ConvNet."""
    c, h, w = (int(s) for s in input_shape)
    fh, fw = convnet_feature_side(h, kernel), convnet_feature_side(w, kernel)
    if fh < 1 or fw < 1:
        raise ConfigError(f"images of size {h}×{w} are too small for the convnet with "
                          f"{kernel}×{kernel} kernels (two conv + pool stages); use images of "
                          f"at least {3 * kernel + 1}×{3 * kernel + 1} pixels")
    return nn.Sequential(
        nn.Conv2d(c, 32, kernel), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * fh * fw, out_dim))


#: dense widths of the PrivateKT reference CNN (seed 001's MNIST model)
KT_CNN_HIDDEN = (512, 512, 512)


def kt_cnn(input_shape: Sequence[int], out_dim: int,
           hidden: Sequence[int] = KT_CNN_HIDDEN) -> nn.Sequential:
    """(n, C, H, W) → (n, out_dim), the CNN of PrivateKT's reference implementation:
    Conv 5×5 32 → ReLU → MaxPool 2 → Conv 5×5 128 → ReLU → MaxPool 2 → dense ReLU layers
    of `hidden` widths (three of 512) → Linear head."""
    c, h, w = (int(s) for s in input_shape)
    fh, fw = convnet_feature_side(h, 5), convnet_feature_side(w, 5)
    if fh < 1 or fw < 1:
        raise ConfigError(f"images of size {h}×{w} are too small for kt_cnn (two 5×5 conv + "
                          "pool stages); use images of at least 16×16 pixels")
    layers: list[nn.Module] = [nn.Conv2d(c, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Conv2d(32, 128, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten()]
    width = 128 * fh * fw
    for hdim in hidden:
        layers += [nn.Linear(width, hdim), nn.ReLU()]
        width = hdim
    return nn.Sequential(*layers, nn.Linear(width, out_dim))


def _output_dim(task: str, num_classes: int) -> int:
    return int(num_classes) if task == "multiclass" else 1


def make_torch_model(name: str, dim: int, num_classes: int = 2, *, task: str | None = None,
                     input_shape: Sequence[int] | None = None,
                     hidden: Sequence[int] | None = None, kernel: int = 3,
                     seed: int = 0, device: str = "cpu") -> TorchModel:
    """Build 'mlp', 'mlp_norm', 'convnet' or 'kt_cnn' as a `TorchModel`.

    dim: number of tabular features (mlp; ignored by convnet). num_classes: C (multiclass).
    task: 'binary' | 'multiclass' | 'regression' (default: multiclass if C > 2 else binary).
    input_shape: per-example shape — required for convnet ((C, H, W)); for mlp it defaults
    to (dim,). hidden: mlp widths (None or empty → (64,)). seed: parameter init seed.
    device: 'cpu' | 'cuda' | 'cuda:N' | 'auto' (`torch_model.resolve_device`; checked before
    anything is built).
    """
    resolve_device(device)  # a missing GPU fails here, before the architecture is built
    task = task or ("multiclass" if num_classes > 2 else "binary")
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r} for model {name!r}; use one of "
                          f"{', '.join(TASKS)}")
    if task == "multiclass" and num_classes < 2:
        raise ConfigError(f"a multiclass {name} needs num_classes ≥ 2, got {num_classes}")
    out = _output_dim(task, num_classes)
    if name in ("mlp", "mlp_norm"):
        hidden = tuple(hidden) if hidden else DEFAULT_HIDDEN
        if not all(isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in hidden):
            raise ConfigError(f"model.hidden must be a list of positive integers (layer widths), "
                              f"got {list(hidden)}; e.g. hidden = [64] or [128, 64]")
        shape = tuple(input_shape) if input_shape is not None else (int(dim),)
        if len(shape) != 1:
            raise ConfigError(mismatch_message("mlp", shape))
        return TorchModel(mlp(shape[0], out, hidden, norm=name == "mlp_norm"), task=task,
                          input_shape=shape, num_classes=num_classes, name=name, seed=seed,
                          device=device)
    if name == "convnet":
        if input_shape is None:
            raise ConfigError("model 'convnet' needs input_shape = (channels, height, width) of "
                              "one image")
        shape = tuple(int(s) for s in input_shape)
        if len(shape) != 3:
            raise ConfigError(mismatch_message("convnet", shape))
        return TorchModel(convnet(shape, out, kernel), task=task, input_shape=shape,
                          num_classes=num_classes, name="convnet", seed=seed, device=device)
    if name == "kt_cnn":
        if input_shape is None or len(tuple(input_shape)) != 3:
            raise ConfigError(mismatch_message("convnet", tuple(input_shape or ())))
        shape = tuple(int(s) for s in input_shape)
        return TorchModel(kt_cnn(shape, out, tuple(hidden) if hidden else KT_CNN_HIDDEN),
                          task=task, input_shape=shape, num_classes=num_classes,
                          name="kt_cnn", seed=seed, device=device)
    raise ConfigError(f"unknown neural model {name!r}; choose 'mlp', 'mlp_norm', 'convnet' or "
                      "'kt_cnn'")

