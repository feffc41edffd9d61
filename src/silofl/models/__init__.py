"""Models as pure functions of (flat parameter vector, data).

GLMs (numpy, closed-form gradients) are always available; the neural models 'mlp' and
'convnet' need PyTorch (`pip install "silofl[torch]"`) and are imported only when asked for.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from silofl.errors import ConfigError
from silofl.models import glm
from silofl.models.base import Model
from silofl.models.glm import MODELS

#: neural models of the PyTorch backend (silofl.models.torch_nets)
TORCH_MODELS = ("mlp", "mlp_norm", "convnet", "kt_cnn")

__all__ = ["MODELS", "TORCH_MODELS", "Model", "check_input", "make_model"]


def make_model(name: str, dim: int, num_classes: int = 2, **options: Any) -> Model:
    """Build a model by name.

    Parameters
    ----------
    name : str
        A GLM ("linear", "logistic", "focal", "svm", "softmax"; numpy, closed-form
        gradients) or a neural model ("mlp", "mlp_norm", "convnet", "kt_cnn"; needs
        ``pip install "silofl[torch]"``).
    dim : int
        Input features per example (``Federation.dim``).
    num_classes : int, default 2
        Classes C of a multiclass model.
    **options
        Model options: for the GLMs those of ``silofl.models.glm``; for the neural
        models task, input_shape, hidden, kernel, seed, device (see
        ``silofl.models.torch_nets.make_torch_model``).

    Returns
    -------
    Model
        The model, with ``num_params`` P.

    Raises
    ------
    ConfigError
        An unknown name (with the nearest valid one), invalid options, or a neural model
        without PyTorch installed.
    """
    if name in TORCH_MODELS:
        try:
            from silofl.models.torch_nets import make_torch_model
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
            raise ConfigError(f"model {name!r} needs PyTorch, which is not installed; "
                              'install it with: pip install "silofl[torch]"') from None
        try:
            return make_torch_model(name, dim, num_classes, **options)
        except TypeError as e:
            raise ConfigError(f"invalid options {options} for model {name!r}: {e}") from None
    if name not in MODELS:
        choices = list(MODELS) + list(TORCH_MODELS)
        near = difflib.get_close_matches(name, choices, n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(choices)}.{hint}")
    return glm.make_model(name, dim, num_classes, **options)


def check_input(model: Model, x_shape: Sequence[int]) -> None:
    """Raise ConfigError when data X of shape (n, ...) does not fit `model` (e.g. a convnet
    on tabular rows, an MLP or GLM on images). Models may define their own `check_input`."""
    own = getattr(model, "check_input", None)
    if own is not None:
        own(x_shape)
        return
    if len(x_shape) != 2:
        raise ConfigError(f"model {model.name!r} needs tabular data (n, features) but the data "
                          f"has shape {tuple(x_shape)}; use model 'convnet' for images")
    dim = getattr(model, "dim", None)
    if dim is not None and x_shape[1] != dim:
        raise ConfigError(f"model {model.name!r} was built for {dim} features but the data has "
                          f"{x_shape[1]}")
