"""The model interface the engine trains.

Parameters are flat float64 vectors of length `num_params`, so averaging, distances and
regularizers are plain array arithmetic. Batched methods take a leading silo axis K:
params (K, P), X (K, B, ...), y (K, B), mask (K, B) marking real (not padded) rows.

A backend only has to provide `per_example_grads`, `predict` and `loss`; the default
`clipped_grad_sum` clips each row to L2 norm ≤ clip and sums. The GLMs override it with a
closed form that never builds the (K, B, P) gradient tensor.

Every backend clips to `silofl.privacy.clipping.clip_bound(clip)`, slightly inside the ball,
so that rounding can never leave a clipped per-example gradient above `clip` — the
sensitivity the noise is calibrated to.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from silofl.errors import ConfigError
from silofl.privacy.clipping import clip_bound


class Model:
    """The interface every model implements: a pure function of a flat parameter vector.

    Build one with `silofl.make_model`. A backend provides `per_example_grads`,
    `predict` and `loss`; `clipped_grad_sum` and `grad_sum` have generic defaults.

    Attributes
    ----------
    name : str
        The model's name ("logistic", "mlp", ...).
    tasks : tuple of str
        The federation tasks it accepts ("binary", "multiclass", "regression").
    num_params : int
        P, the length of the flat parameter vector.
    """

    name: str = "model"
    #: which Federation tasks this model accepts
    tasks: tuple[str, ...] = ()
    num_params: int

    def init_params(self) -> np.ndarray:
        """The starting parameters.

        Returns
        -------
        numpy.ndarray
            Shape (P,) float64 (zeros unless the backend overrides it).
        """
        return np.zeros(self.num_params)

    def check_task(self, task: str) -> None:
        """Refuse data of a task this model cannot learn.

        Parameters
        ----------
        task : str
            The federation's task.

        Raises
        ------
        ConfigError
            `task` is not in `tasks`; the message lists models that fit it.
        """
        if task not in self.tasks:
            raise ConfigError(
                f"model {self.name!r} needs {' or '.join(self.tasks)} labels but the data is "
                f"a {task} task; choose a model for {task} data "
                f"({', '.join(_models_for(task))})")

    def param_groups(self) -> dict[str, np.ndarray]:
        """Named parts of the flat parameter vector, for methods that share only some of it.

        Returns
        -------
        dict of str to numpy.ndarray
            Boolean (P,) masks: "head", the personal head of FedPer / FedRep (the rest is
            the shared body), and "norm", the affine parameters of normalization layers
            (FedBN). A backend without such a split returns no entry for it (the default:
            none).
        """
        return {}

    # -- per-example ----------------------------------------------------------------
    def per_example_grads(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Each example's loss gradient.

        Parameters
        ----------
        w : numpy.ndarray
            Parameters, shape (P,).
        X : numpy.ndarray
            Examples, shape (n, d) or (n, C, H, W).
        y : numpy.ndarray
            Labels, shape (n,).

        Returns
        -------
        numpy.ndarray
            Shape (n, P).
        """
        raise NotImplementedError

    def loss(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Each example's loss.

        Parameters
        ----------
        w : numpy.ndarray
            Parameters, shape (P,).
        X : numpy.ndarray
            Examples, shape (n, ...).
        y : numpy.ndarray
            Labels, shape (n,).

        Returns
        -------
        numpy.ndarray
            Shape (n,).
        """
        raise NotImplementedError

    def predict(self, w: np.ndarray, X: np.ndarray) -> np.ndarray:
        """The model's scores.

        Parameters
        ----------
        w : numpy.ndarray
            Parameters, shape (P,).
        X : numpy.ndarray
            Examples, shape (n, ...).

        Returns
        -------
        numpy.ndarray
            (n,) for regression/binary (the value, or the probability of class 1), (n, C)
            class probabilities for multiclass.
        """
        raise NotImplementedError

    # -- batched over silos ---------------------------------------------------------
    def clipped_grad_sum(self, W: np.ndarray, X: np.ndarray, y: np.ndarray, mask: np.ndarray,
                         clip: float, *, coords: np.ndarray | None = None,
                         **aux: Any) -> np.ndarray:
        """The sum of clipped per-example gradients, per silo: Σ_i min(1, c/‖g_i‖) g_i.

        Parameters
        ----------
        W : numpy.ndarray
            Each silo's parameters, shape (K, P).
        X : numpy.ndarray
            Batches, shape (K, B, ...).
        y : numpy.ndarray
            Labels, shape (K, B).
        mask : numpy.ndarray
            Shape (K, B): 1 (True) for real rows, 0 for padding; or float row weights
            w ∈ [0, 1] (person level: 1/r_p on each of a person's r_p rows), and the sum
            is Σ_i w_i·min(1, c/‖g_i‖) g_i: each row clipped first, then weighed.
        clip : float
            The L2 norm bound C; rows are clipped to c = clip_bound(C) (norms in float64).
        coords : numpy.ndarray, optional
            Boolean (P,): only these coordinates are trained (FedRep's head or body pass);
            each g_i is restricted to them before its norm is taken, so the sum has
            sensitivity C on them and is 0 elsewhere. None: all coordinates.
        **aux
            Precomputed per-row quantities a backend can use (or ignore).

        Returns
        -------
        numpy.ndarray
            Shape (K, P).
        """
        # the generic loop (not a subclass's override): one clip for every silo
        return Model.clipped_grad_sum_count(self, W, X, y, mask, np.full(W.shape[0], clip),
                                            coords=coords)[0]

    def clipped_grad_sum_count(self, W: np.ndarray, X: np.ndarray, y: np.ndarray,
                               mask: np.ndarray, clip: np.ndarray, *,
                               coords: np.ndarray | None = None,
                               **aux: Any) -> tuple[np.ndarray, np.ndarray]:
        """`clipped_grad_sum` at a clip per silo, and how many rows were within it (private
        adaptive clipping, `training.dpsgd.QuantileClip`).

        Parameters
        ----------
        W, X, y, mask, coords, **aux
            As `clipped_grad_sum`.
        clip : numpy.ndarray
            Shape (K,): silo k's rows are clipped to clip_bound(clip[k]).

        Returns
        -------
        (numpy.ndarray, numpy.ndarray)
            The clipped sums (K, P) and, per silo, the number of unmasked rows whose
            gradient norm is ≤ clip[k] (K,) float64 (weighted by a float mask).
        """
        clip = np.asarray(clip, dtype=float)
        out, count = np.zeros_like(W), np.zeros(W.shape[0])
        for k in range(W.shape[0]):
            w = np.asarray(mask[k], dtype=np.float64)
            g = np.asarray(self.per_example_grads(W[k], X[k], y[k]), dtype=np.float64)
            g = np.where(w[:, None] > 0, g, 0.0)  # padded rows may hold anything
            if coords is not None:
                g = g * coords
            norms = np.linalg.norm(g, axis=1)
            c = clip_bound(clip[k])
            factor = np.minimum(1.0, c / np.maximum(norms, 1e-12)) * w  # clip, then weigh
            out[k] = (g * factor[:, None]).sum(0)
            count[k] = np.sum((norms <= clip[k]) * w)
        return out, count

    def grad_sum(self, W: np.ndarray, X: np.ndarray, y: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The sum of per-example gradients over unmasked rows (the non-private path).

        Parameters
        ----------
        W : numpy.ndarray
            Shape (K, P).
        X : numpy.ndarray
            Shape (K, B, ...).
        y : numpy.ndarray
            Shape (K, B).
        mask : numpy.ndarray
            Shape (K, B).

        Returns
        -------
        numpy.ndarray
            Shape (K, P).
        """
        return np.stack([(self.per_example_grads(W[k], X[k], y[k]) * mask[k][:, None]).sum(0)
                         for k in range(W.shape[0])])


#: Built-in model classes by name, for `check_task`'s advice; models.glm adds the GLMs (so
#: this module never imports its subclasses)
NAMED_MODELS: dict[str, type[Model]] = {}


def _models_for(task: str) -> list[str]:
    # the torch MLP fits every task (the ConvNet too, on image data)
    return [n for n, cls in NAMED_MODELS.items() if task in cls.tasks] + ["mlp"]
