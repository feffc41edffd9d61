"""The checks of [training] clip and clip = "auto"'s keys (`silofl.runtime.plan.TrainingConfig`),
kept apart so that the planner stays one concept."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NoReturn

from silofl.config.base import did_you_mean


def check_clip(cfg, bad: Callable[[str], NoReturn]) -> None:
    """[training] clip and, for clip = "auto", its keys (`plan.TrainingConfig.validate`:
    `cfg` is one; `bad` raises its ConfigError with the message)."""
    def positive(v: object) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) \
            and math.isfinite(v) and v > 0
    if not (cfg.clip == "auto" or positive(cfg.clip)):
        near = isinstance(cfg.clip, str) and did_you_mean(cfg.clip.strip().lower(), ["auto"],
                                                          cutoff=0.7)
        bad(f"[training] clip must be a positive number (the per-example gradient norm "
            f"bound) or \"auto\" (private adaptive clipping), got {cfg.clip!r}"
            + ("; did you mean \"auto\"? write it exactly as \"auto\" (lower case, no spaces)"
               if near else ""))
    q = cfg.clip_quantile
    if not (q == "auto" or (isinstance(q, (int, float)) and not isinstance(q, bool)
                            and 0 < q < 1)):
        bad(f"[training] clip_quantile (γ, the target fraction of unclipped examples) must "
            f"lie strictly between 0 and 1, or be \"auto\", got {cfg.clip_quantile!r}")
    if not positive(cfg.clip_lr):
        bad(f"[training] clip_lr (η_C, the clip's geometric step) must be a positive "
            f"number, got {cfg.clip_lr!r}")
    if not positive(cfg.clip_init):
        bad(f"[training] clip_init (C₀, the starting clip) must be a positive number, "
            f"got {cfg.clip_init!r}")
    if not positive(cfg.clip_max) or positive(cfg.clip_init) and cfg.clip_max < cfg.clip_init:
        bad(f"[training] clip_max (the ceiling of the automatic clip) must be a number ≥ "
            f"clip_init ({cfg.clip_init!r}), got {cfg.clip_max!r}")
    if not (cfg.clip_count_noise == "auto" or positive(cfg.clip_count_noise)):
        bad(f"[training] clip_count_noise (σ_b, the count's noise std in examples) must be "
            f"a positive number or \"auto\", got {cfg.clip_count_noise!r}")
    if cfg.clip == "auto" and cfg.privacy_unit == "node":
        bad("[training] clip = \"auto\" is not available with privacy_unit = 'node' (its "
            "node-level accounting assumes a fixed clip); set clip to a number")
