"""The clipping bound every backend aims at: a privacy constant, below the models.

Every backend clips to `clip_bound(clip)` = clip / (1 + CLIP_MARGIN), slightly inside the
ball, so that rounding (float32 data, a float32 cast of the clip factor) can never leave a
clipped per-example gradient (or update) above `clip` — the sensitivity the noise is
calibrated to.
"""

from __future__ import annotations

#: Relative margin of every clipping: 2⁻²⁰ ≈ 9.5e-7, 16 float32 ulps at 1. The float32 paths
#: err by at most ≈ 2.5·2⁻²⁴ (‖x‖² stored in float32 from the unrounded data, the float32
#: data itself, the clip factor cast to float32; float64 steps add ~1e-15), so 2⁻²⁰ covers
#: them 6× over while shrinking clipped gradients by under a millionth (no utility cost).
CLIP_MARGIN = 2.0**-20


def clip_bound(clip: float) -> float:
    """The norm clipping aims at, slightly inside the ball.

    Parameters
    ----------
    clip : float
        The clipping norm C the noise is calibrated to.

    Returns
    -------
    float
        C / (1 + CLIP_MARGIN), so that the clipped vector as computed in floating point has
        norm ≤ C.
    """
    return float(clip) / (1.0 + CLIP_MARGIN)
