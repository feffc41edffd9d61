"""Accounting of ULDP-FL weighting (Kato et al., VLDB 2024): persons across silos.

Every round each silo k releases, inside a SecAgg+ sum, u_k = Σ_p w_{p,k}·ḡ_{p,k} +
N(0, σ²C²/K I), where ḡ_{p,k} (norm ≤ C) is person p's average clipped gradient over
their rows in silo k and Σ_k w_{p,k} ≤ 1 for every person. Adding or removing *all* rows
of one person, in every silo at once, moves Σ_k u_k by at most Σ_k w_{p,k}·C ≤ C, and the
sum carries the noise N(0, σ²C² I): the aggregate is one Gaussian mechanism with
sensitivity C and noise σC per round — `GaussianDpEvent(σ)` — whatever the number of
silos the person appears in. R rounds compose to `SelfComposedDpEvent(Gaussian(σ), R)`,
which is a Gaussian mechanism with σ/√R (the analytic Gaussian of Balle & Wang 2018 gives
its exact ε(δ); the accountants here give a valid upper bound of it).

Assumptions, stated in every report (`consortium_report`):
* SecAgg+ with an honest-but-curious server: the server sees only Σ_k u_k, never one
  silo's u_k; the silos do not collude with it (a colluding silo knows its own noise).
* No person is in more silos than the weights account for: Σ_k w_{p,k} ≤ 1 ("uniform":
  w = 1/M for a declared M ≥ the silos any person is in; "linked": record proportions
  from keyed pseudonyms, which sum to one by construction). A person's weights depend on
  their own rows only, so removing them leaves everyone else's weights unchanged.
* One gradient step per round (FedSGD): a multi-step local update would make each
  person's contribution depend on the trajectory, and the bound above would not hold.

Sampling (optional, rate q < 1): person p takes part in round t iff a keyed PRF of their
(pseudonymous) id and t falls below q — the same decision in every silo, from a consortium
secret the server does not hold (`training.uldp.consortium_sample`). The aggregate is then
a Poisson-subsampled Gaussian over persons, `PoissonSampledDpEvent(q, Gaussian(σ))` per
round (the PRF stands in for true randomness: a computational assumption, stated).

If SecAgg+ fails (or the server sees silo k's share), u_k alone is a Gaussian mechanism
on silo k's persons with sensitivity w_{p,k}·C ≤ C and noise σC/√K: per round
`GaussianDpEvent(σ/√K)` — each silo's *own* guarantee without SecAgg+, reported beside
the consortium figure, never hidden.
"""

from __future__ import annotations

import math

import dp_accounting as dpa

from silofl.errors import CalibrationError, ConfigError
from silofl.privacy.calibration import calibrate, calibrate_dpsgd
from silofl.privacy.evaluate import DEFAULT_ACCOUNTANT, Accountant
from silofl.privacy.ledger import tightest
from silofl.privacy.targets import PrivacyTarget

#: the ledger label of a ULDP round
ULDP_LABEL = "uldp"
#: what a ULDP report says is protected, and under which assumptions
ULDP_TEXT = ("person level across silos (ULDP-FL weighting): adding or removing all rows of "
             "one person in every silo at once; each person's weights sum to ≤ 1 over the "
             "silos, so the SecAgg+ sum has sensitivity C and noise σC per round. Assumes "
             "SecAgg+ with an honest-but-curious server that sees only the sum and silos that "
             "do not collude with it; the simulator models SecAgg+ as an exact sum")


def round_event(sigma: float, q: float = 1.0) -> dpa.DpEvent:
    """One ULDP round of the aggregate: a Gaussian mechanism, sensitivity C, noise σC
    (on the persons sampled at rate q, consistently in every silo, when q < 1).

    Parameters
    ----------
    sigma : float
        σ > 0, the aggregate's noise multiplier (std σ·C of the SecAgg+ sum's noise).
    q : float, default 1.0
        The consortium-wide Poisson sampling rate of persons, in (0, 1].

    Returns
    -------
    dp_accounting.DpEvent
        GaussianDpEvent(σ), or PoissonSampledDpEvent(q, GaussianDpEvent(σ)) for q < 1.
    """
    if not (math.isfinite(sigma) and sigma > 0):
        raise ConfigError(f"the ULDP noise multiplier must be a positive number, got {sigma}")
    check_rate(q)
    base = dpa.GaussianDpEvent(float(sigma))
    return base if q == 1.0 else dpa.PoissonSampledDpEvent(float(q), base)


def check_rate(q: float) -> float:
    """`q` as a float if it is a sampling rate in (0, 1], else ConfigError."""
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= 1:
        raise ConfigError(f"the uldp sampling rate of persons (uldp_sample_rate) must lie in "
                          f"(0, 1] (1: every person every round), got {q!r}")
    return float(q)


def run_event(sigma: float, rounds: int, q: float = 1.0) -> dpa.DpEvent:
    """`rounds` ULDP rounds of the aggregate (the consortium-wide, person-level event).

    Parameters
    ----------
    sigma : float
        The aggregate's noise multiplier σ.
    rounds : int
        R ≥ 1.
    q : float, default 1.0
        The persons' sampling rate per round.

    Returns
    -------
    dp_accounting.DpEvent
        `round_event(σ, q)` self-composed R times.
    """
    return dpa.SelfComposedDpEvent(round_event(sigma, q), int(rounds))


def share_event(sigma: float, num_silos: int, rounds: int, q: float = 1.0) -> dpa.DpEvent:
    """A silo's own release if SecAgg+ fails: its share u_k carries noise σC/√K.

    Parameters
    ----------
    sigma : float
        The aggregate's noise multiplier σ.
    num_silos : int
        K, the silos whose shares sum to the aggregate (each adds N(0, σ²C²/K)).
    rounds : int
        R ≥ 1.
    q : float, default 1.0
        The persons' sampling rate per round.

    Returns
    -------
    dp_accounting.DpEvent
        Gaussian(σ/√K) (Poisson-sampled at q) self-composed R times.
    """
    return run_event(sigma / math.sqrt(int(num_silos)), rounds, q)


def calibrate_sigma(targets: list[PrivacyTarget], rounds: int,
                    kind: Accountant = DEFAULT_ACCOUNTANT, q: float = 1.0) -> float:
    """The consortium's σ: the smallest noise multiplier whose R rounds meet every target.

    Every silo's ledger is charged the same aggregate event (it holds for every silo's
    persons), so one σ serves all: the largest of the σ each target needs alone.

    Parameters
    ----------
    targets : list of PrivacyTarget
        The silos' targets (ε, δ) for this run.
    rounds : int
        R ≥ 1.
    kind : {"pld", "rdp"}, default "pld"
        The accountant σ is calibrated with (the ledgers check the tighter of both).
    q : float, default 1.0
        The persons' sampling rate per round (q < 1: the DP-SGD calibration, same event).

    Returns
    -------
    float
        σ (units of the clip C).

    Raises
    ------
    CalibrationError
        No σ ≤ 1e4 meets some target.
    """
    sigma = 0.0
    for t in {(t.epsilon, t.delta) for t in targets}:
        try:
            s = (calibrate(lambda x: run_event(x, rounds), t[0], t[1], kind) if q == 1.0
                 else calibrate_dpsgd(t[0], t[1], q, rounds, kind))
        except CalibrationError:
            raise CalibrationError(
                f"uldp: no noise multiplier up to 1e4 reaches ε = {t[0]:g} at δ = {t[1]:g} "
                f"over {rounds} rounds; raise epsilon or train for fewer rounds") from None
        sigma = max(sigma, s)
    return sigma


def consortium_report(sigma: float, num_silos: int, rounds: int,
                      target: PrivacyTarget, q: float = 1.0) -> dict:
    """What a ULDP run guarantees, for one silo's δ.

    Parameters
    ----------
    sigma : float
        The aggregate's noise multiplier σ.
    num_silos : int
        K.
    rounds : int
        R.
    target : PrivacyTarget
        The silo's target (its δ is used for both figures).
    q : float, default 1.0
        The persons' sampling rate per round.

    Returns
    -------
    dict
        ``consortium_epsilon`` (person level, consortium-wide, any number of silos per
        person: the figure charged to the ledger), ``share_epsilon`` (the silo's own if
        SecAgg+ fails: noise σ/√K), ``aggregate_noise_multiplier`` σ,
        ``share_noise_multiplier`` σ/√K, the accountant each came from, and the assumptions.
    """
    agg, agg_kind = tightest(run_event(sigma, rounds, q), target.delta)
    share, share_kind = tightest(share_event(sigma, num_silos, rounds, q), target.delta)
    return {"mechanism": "uldp", "rounds": int(rounds), "silos": int(num_silos),
            "person_sampling_rate": float(q),
            "aggregate_noise_multiplier": float(sigma),
            "share_noise_multiplier": float(sigma / math.sqrt(num_silos)),
            "consortium_epsilon": agg, "consortium_accountant": agg_kind,
            "share_epsilon": share, "share_accountant": share_kind,
            "delta": target.delta, "protects": ULDP_TEXT,
            "share_text": ("ε of the silo's own share u_k if SecAgg+ fails or the server "
                           "sees it (noise σ/√K); the ledger is charged the aggregate's "
                           "event, which holds only inside the SecAgg+ sum")}


__all__ = ["ULDP_LABEL", "ULDP_TEXT", "calibrate_sigma", "check_rate", "consortium_report", "round_event",
           "run_event", "share_event"]
