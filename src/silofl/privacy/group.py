"""What example-level DP-SGD guarantees a person with k rows: the figures person-level
training is compared with.

Two answers, both for add/remove-all-rows-of-one-person adjacency:

* `group_bound` — the textbook group-privacy bound (Dwork & Roth, Thm 2.2 with δ): an
  (ε, δ)-DP mechanism per row is (kε, k·e^{(k−1)ε}·δ)-DP for a group of k rows. It holds for
  any mechanism and is what a consortium can quote without further analysis.
* `example_level_person_epsilon` — the tight figure for Poisson-sampled example-level
  DP-SGD: each of the person's k rows joins a step independently with probability q, so the
  person's share of the clipped sum is j·C (at worst, all aligned) with j ~ Binomial(k, q):
  one step is a mixture-of-Gaussians mechanism (sensitivities 0..k, noise σ in units of
  C), composed over the steps under PLD (dp_accounting's
  `from_mixture_gaussian_mechanism`; the accounting of example-level sampling for users of
  Charles et al., 2024, "Fine-tuning LLMs with user-level differential privacy").

Both are functions of public settings and of k; k, the most rows one person holds, is data:
callers pass a declared k, never one read off the table into an output.
"""

from __future__ import annotations

import math

from scipy import stats


def group_bound(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """The group-privacy bound for a group of k rows.

    Parameters
    ----------
    epsilon, delta : float
        The per-row (ε, δ) guarantee.
    k : int
        Rows of one person (k ≥ 1).

    Returns
    -------
    (float, float)
        (k·ε, k·e^{(k−1)ε}·δ); δ may exceed 1 (then the bound says nothing).
    """
    if k < 1:
        raise ValueError(f"a person has at least one row, got k = {k}")
    return k * epsilon, k * math.exp((k - 1) * epsilon) * delta


def example_level_person_epsilon(q: float, sigma: float, steps: int, k: int, delta: float,
                                 discretization: float = 1e-3) -> float:
    """The person-level ε of example-level Poisson DP-SGD for a person with k rows.

    Parameters
    ----------
    q : float
        Each row's sampling probability per step (b / n_rows).
    sigma : float
        Noise multiplier (noise std / C).
    steps : int
        DP-SGD steps composed.
    k : int
        The person's rows.
    delta : float
        Target δ.
    discretization : float, default 1e-3
        The PLD's value discretisation interval (pessimistic rounding: an upper bound).

    Returns
    -------
    float
        ε at `delta` for adding or removing all k rows (k = 1: the example-level ε).
    """
    from dp_accounting.pld import privacy_loss_distribution as pld

    if k < 1 or steps < 1:
        raise ValueError(f"need k ≥ 1 and steps ≥ 1, got k = {k}, steps = {steps}")
    probs = stats.binom.pmf(range(k + 1), k, q)
    one = pld.from_mixture_gaussian_mechanism(
        standard_deviation=sigma, sensitivities=[float(j) for j in range(k + 1)],
        sampling_probs=[float(p) for p in probs],
        value_discretization_interval=discretization)
    return float(one.self_compose(int(steps)).get_epsilon_for_delta(delta))
