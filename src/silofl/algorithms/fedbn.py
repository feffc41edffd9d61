"""FedBN (Li et al. 2021) under silo-specific DP: personal normalization layers.

FedBN keeps each silo's normalization layers local and averages everything else. Its
BatchNorm form cannot run under DP-SGD: batch statistics mix examples, so a per-example
gradient (and its clipping) is undefined, and the running statistics would be a data
release of their own. silofl's design: the net normalizes each example by its *own*
statistics (LayerNorm; model "mlp_norm"), so there are no batch or running statistics to
read or charge, and the normalization layers' affine parameters (scale and shift,
`Model.param_groups()["norm"]`) are FedBN's personal part — trained by the same DP-SGD
pass as the rest, never uploaded, never averaged. Each round silo k starts from the
broadcast shared parameters and its own normalization parameters, takes one DP-SGD pass
and uploads the shared parameters' change; silo k's model is (shared, its own norm).

Privacy: one DP-SGD pass per round, as FedAvg (the default `privacy_events`); the
personal normalization parameters are outputs of that charged pass. A model without
normalization layers (every GLM, "mlp", "convnet") is refused before any budget is spent.
"""

from __future__ import annotations

from silofl.algorithms.fedper import FedPer


class FedBN(FedPer):
    """FedBN: normalization layers' affine parameters personal, the rest averaged."""

    name = "fedbn"
    group = "norm"
