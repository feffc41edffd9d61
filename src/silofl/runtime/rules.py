"""Each trainer's DP-SGD rule from the plans: a fixed clip, or clip = "auto"'s private
quantile tracker per silo (`training.dpsgd.QuantileClip`), and what the reports repeat of it."""

from __future__ import annotations

import math

import numpy as np

from silofl.privacy.adaptive_clip import clip_step, gradient_noise
from silofl.runtime.plan import SiloPlan, TrainingConfig, noise_multipliers
from silofl.training.dpsgd import GradientRule, QuantileClip


def gradient_rule(cfg: TrainingConfig, plans: list[SiloPlan]) -> GradientRule:
    """The DP-SGD rule of the silos `plans` (one trainer's): their σ_k at cfg.clip, or for
    clip = "auto" a private quantile tracker per silo starting at clip_init
    (`training.dpsgd.QuantileClip`, σ_b and σ_Δ from each plan).

    Parameters
    ----------
    cfg : TrainingConfig
    plans : list of SiloPlan
        The hosted silos' plans, in the trainer's order.

    Returns
    -------
    GradientRule
        Non-private (no σ) when cfg.private is False.
    """
    if not cfg.private:
        return GradientRule(_fixed_clip(cfg), None)
    sigmas = noise_multipliers(plans)
    if not cfg.adaptive_clip or sigmas is None:
        return GradientRule(_fixed_clip(cfg), sigmas)
    sb = np.array([float(p.count_noise) if p.count_noise is not None else math.nan
                   for p in plans])
    m = np.array([p.q * p.n for p in plans], dtype=float)
    tracker = QuantileClip(
        clip=np.full(len(plans), float(cfg.clip_init)),
        quantile="auto" if cfg.clip_quantile == "auto" else float(cfg.clip_quantile),
        lr=np.array([clip_step(cfg.clip_lr, b, mk) for b, mk in zip(sb, m)]), count_noise=sb,
        gradient_noise=np.array([gradient_noise(s, b) for s, b in zip(sigmas, sb)]),
        expected_batch=m, ceiling=float(cfg.clip_max))
    return GradientRule(float(cfg.clip_init), sigmas, adaptive=tracker)


def _fixed_clip(cfg: TrainingConfig) -> float:
    """The clip of a rule with no tracker (the non-private mode does not clip)."""
    return float(cfg.clip_init) if cfg.adaptive_clip else float(cfg.clip)


#: the clip = "auto" keys of a plan's `to_dict`, as summaries and model cards repeat them
CLIP_KEYS = ("clip", "count_noise", "gradient_noise_multiplier", "final_clip",
             "clip_target_quantile", "clip_release")


def clip_entry(plan: dict) -> dict:
    """The clip = "auto" part of a plan's `to_dict` (empty for a fixed clip): σ_b, σ_Δ,
    the final C_k and γ_k, and what was released."""
    return {k: plan[k] for k in CLIP_KEYS if k in plan} if plan.get("clip") == "auto" else {}


def final_clips(plans: list[SiloPlan], rule: GradientRule, trainers: list | None = None) -> None:
    """Record each silo's clip after training in its plan (clip = "auto"; public: a function
    of the noisy counts). `trainers`: one one-silo trainer per plan (per-silo hosting)."""
    for k, p in enumerate(plans):
        tracker = rule.adaptive if trainers is None else trainers[k].rule.adaptive
        if tracker is not None:
            j = 0 if trainers is not None else k
            p.final_clip = float(tracker.clip[j])
            p.clip_target = None if np.isnan(tracker.target[j]) else float(tracker.target[j])
