"""SecAgg+ settings from public plan quantities, and the error they add.

With SecAgg+ (Flower's `SecAggPlusWorkflow` / `secaggplus_mod`) each silo multiplies its
update row (P,) by its quantized weight r_k = round(w_k / w_max · Q) / Q, clips every
coordinate to [-c, c], stochastically rounds it onto Q levels, masks it and sends only the
masked integers; the server unmasks only the sum and gets Σ_k r_k u_k / Σ_k r_k, the
weighted mean the server step needs. Everything here is computed from what the server
already knows publicly: each silo's declared n_k, q_k, steps and σ_k (join replies) and the
job's lr and clip — never from an update.

Extra error (stated, tested): per coordinate, each silo's stochastic rounding is unbiased
with |error| < 2c/Q, so the recovered mean is off by less than K · 2c / (Q · Σ_k r_k) (Σ r_k ≥ 1
because the largest silo has r = 1); the weights are off by less than 1/Q relative. A
coordinate whose |r_k u_k| exceeds c is clipped to ±c: post-processing of a DP output (no
privacy cost) but a bias; `clipping_range` makes that a > 6σ event per DP-SGD step.
"""

from __future__ import annotations

#: Flower's default quantization levels (2^22) and modulus (2^32)
QUANTIZATION_RANGE = 1 << 22
MODULUS_RANGE = 1 << 32
#: methods whose server step needs only the weighted mean of the update rows
SECAGG_METHODS = ("fedavg", "mrmtl")


def clipping_range(silos: list[dict], lr: float, clip: float, rounds: int,
                   method: str) -> float:
    """c for SecAgg+ from public quantities: a bound on any coordinate of one silo's
    round update. One DP-SGD step moves a coordinate by at most lr · clip · (1 + 6 σ / b)
    outside a 6σ Gaussian tail (b = q·n the expected batch); a round has `steps` of them.
    MR-MTL's update is the personal model minus the shared one, which can drift over the
    rounds: bound it by all rounds' steps. `silos`: dicts with n_train, q, steps, sigma."""
    per_round = max(s["steps"] * lr * clip * (1.0 + 6.0 * s["sigma"] / max(s["q"] * s["n_train"],
                                                                            1.0))
                    for s in silos)
    scale = rounds if method == "mrmtl" else 1
    return float(max(1.0, per_round * scale))


def max_weight(weights: list[float]) -> float:
    """Flower's max_weight: the largest silo weight, so every r_k ≤ 1 (no overflow)."""
    return float(max(weights))


def reconstruction_threshold(num_silos: int) -> int:
    """Shares needed to unmask: a strict majority of the silos (at least 2), so fewer
    than half of them colluding with the server learn nothing about one silo's update."""
    return min(num_silos, max(2, num_silos // 2 + 1))


def mean_error_bound(num_silos: int, c: float, total_ratio: float = 1.0,
                     q: int = QUANTIZATION_RANGE) -> float:
    """Bound on |SecAgg+ mean − exact weighted mean| per coordinate (no clipping):
    K · 2c / (Q · Σ r_k), with Σ r_k ≥ 1; plus one level of slack for the weight rounding."""
    return num_silos * 2.0 * c / (q * max(total_ratio, 1.0)) * 2.0


def check_capacity(num_silos: int) -> None:
    """The masked sum of K values below Q must fit the modulus: K · Q < 2^32."""
    if num_silos * QUANTIZATION_RANGE >= MODULUS_RANGE:
        raise ValueError(f"SecAgg+ with {num_silos} silos overflows the modulus "
                         f"({MODULUS_RANGE} ≤ K · {QUANTIZATION_RANGE}); use fewer than "
                         f"{MODULUS_RANGE // QUANTIZATION_RANGE} silos")


__all__ = ["SECAGG_METHODS", "clipping_range", "max_weight", "reconstruction_threshold",
           "mean_error_bound", "check_capacity", "QUANTIZATION_RANGE", "MODULUS_RANGE"]
