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

ULDP (`algorithms.uldp`, the only release is the sum): every silo's weight is 1 (r_k = 1
exactly), so Flower returns Σ_k u_k / K' over the K' silos in the sum and the server
multiplies by K'; the sum is then off by less than K'·2c/Q per coordinate
(`sum_error_bound`). The range c covers a share's coordinate (`share_range`), and the
reconstruction threshold is every silo of the job (`uldp_threshold`): a sum missing a
silo (its noise share) is never unmasked.
"""

from __future__ import annotations

#: Flower's default quantization levels (2^22) and modulus (2^32)
QUANTIZATION_RANGE = 1 << 22
MODULUS_RANGE = 1 << 32
#: methods whose server step needs only the weighted mean of the update rows
SECAGG_METHODS = ("fedavg", "mrmtl", "uldp")
#: methods that run over the network ONLY inside a SecAgg+ sum (their privacy rests on it)
SECAGG_ONLY = ("uldp",)
#: noise stds a share's coordinate may reach before Flower clips it (`share_range`)
SHARE_TAIL_Z = 6.0


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


def share_range(n_persons: list[int], clip: float, sigma: float, num_silos: int, m: int,
                z: float = SHARE_TAIL_Z) -> float:
    """c for ULDP's SecAgg+ sum from public quantities: a bound on any coordinate of one
    silo's share u_k = Σ_p (1/M)·ḡ_p + N(0, σ²C²/K).

    ‖ḡ_p‖ ≤ C, so the weighted sum's every coordinate is at most n_k·C/M in absolute value;
    the noise coordinate exceeds z·σC/√K with probability 2·Φ(−z) (z = 6: 2.0e-9), so a
    coordinate is clipped (a bias, no privacy cost) with probability at most
    K·P·R·2·Φ(−z) over a run of R rounds and P parameters.

    Parameters
    ----------
    n_persons : list of int
        Every silo's number of persons n_k (its join reply).
    clip : float
        C.
    sigma : float
        The consortium's σ (0: non-private).
    num_silos : int
        K, the silos whose shares make the sum.
    m : int
        M, the declared most silos one person is in (uniform weights 1/M).
    z : float, default 6.0
        Noise stds covered.

    Returns
    -------
    float
        c ≥ 1.
    """
    mean = max(n_persons) * clip / m
    return float(max(1.0, mean + z * sigma * clip / num_silos ** 0.5))


def sum_error_bound(num_silos: int, c: float, q: int = QUANTIZATION_RANGE) -> float:
    """Bound on |SecAgg+ sum − exact Σ_k u_k| per coordinate for ULDP (no clipping; every
    weight 1): each silo's stochastic rounding is off by less than one level 2c/Q."""
    return num_silos * 2.0 * c / q


def uldp_threshold(num_silos: int) -> int:
    """ULDP's reconstruction threshold: every silo. Each share carries 1/K of the noise, so
    a sum missing one would carry less than σC; with threshold K it is never unmasked."""
    return int(num_silos)


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


__all__ = ["SECAGG_METHODS", "SECAGG_ONLY", "SHARE_TAIL_Z", "share_range", "sum_error_bound",
           "uldp_threshold", "clipping_range", "max_weight", "reconstruction_threshold",
           "mean_error_bound", "check_capacity", "QUANTIZATION_RANGE", "MODULUS_RANGE"]
