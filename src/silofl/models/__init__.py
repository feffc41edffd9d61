"""Models as pure functions of (flat parameter vector, data)."""

from silofl.models.base import Model
from silofl.models.glm import MODELS, make_model

__all__ = ["MODELS", "Model", "make_model"]
