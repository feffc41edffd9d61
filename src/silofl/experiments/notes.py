"""The notes every output of a job carries: its assumptions, non-private and local-DP
wording, reproducible noise, scratch or demo store, resets, and what was not charged."""

from __future__ import annotations

from silofl.privacy import store_paths
from silofl.privacy.budget import SCRATCH_NOTE
from silofl.privacy.units import group_bound_note
from silofl.runtime.plan import SEEDED_NOTE
from silofl.tuning.setup import distribution

#: a person-level job ([privacy] unit = "person"): what it treats as public besides n_k
PERSONS_PUBLIC = ("per person: each silo's number of persons is treated as public like its "
                  "size (it sets the sampling rate q = b/n_persons and the noise "
                  "calibration); the number of rows of any one person is not released")



def unit_notes(unit: str, person_column: str, private: bool) -> list[str]:
    """What the unit of a private job's guarantee means for persons: per person, what is
    public; per row on rows that name persons, the group-privacy bound as a formula of k.

    Parameters
    ----------
    unit : str
        "example" or "person".
    person_column : str
        [data] person_column ("" if none).
    private : bool
        The job is private.

    Returns
    -------
    list of str
    """
    if not private:
        return []
    if unit == "person":
        return [PERSONS_PUBLIC]
    bound = group_bound_note(unit, person_column)
    return [bound] if bound else []


NONPRIVATE_NOTE = "NON-PRIVATE run: no differential privacy; no budget was charged"
#: local-DP methods (privatekt, fedavg_ldp): what their ε means (README "PrivateKT")
LOCAL_DP_NOTE = ("{}: each client's upload in a round is ε-LDP for its whole local dataset "
                 "(any two datasets), so the ε reported per client also holds for adding or "
                 "removing one record; it is composed over every round the client took part "
                 "in — no shuffle-model amplification is assumed")


#: clip = "auto" (`silofl.privacy.adaptive_clip`): where C came from and what it cost
CLIP_AUTO_NOTE = (
    "clip = auto: each silo's clip C_k tracks the γ = {quantile:g} quantile of its "
    "per-example gradient norms (Andrew et al. 2021): every DP-SGD step also releases a "
    "count of the batch's records with gradient norm ≤ C_k (sensitivity ½ under add/remove "
    "of one record, Gaussian noise σ_b), and the gradient noise is raised so that the pair "
    "is one Gaussian mechanism at the calibrated σ: its cost is inside every ε stated here, "
    "nothing extra; C_k is a function of the noisy counts (post-processing). "
    "privacy_report.json lists σ_b, the gradient noise and each silo's final C_k per method")


def tuning_note(label: str, method: dict, tc) -> str | None:
    """Where a tuned method's λ came from and what choosing it cost, in one sentence.

    Parameters
    ----------
    label : the method's label in the run's tables.
    method : its `ExperimentResult.method` (a private choice has "tuned", a proxy
        choice "tuning").
    tc : TuningConfig, the run's [tuning] section.

    Returns
    -------
    str or None
        None for a method whose λ was not chosen by [tuning].
    """
    proxy = method.get("tuning")
    if isinstance(proxy, dict) and proxy.get("mode") == "proxy":
        where = proxy.get("proxy_path") or proxy.get("proxy_source")
        return (f"{label}: λ = {proxy.get('chosen_lam'):g} chosen on the proxy {where} "
                f"(declared public, scored on its own test rows, DP noise "
                f"{proxy.get('proxy_noise')}), ε cost 0 for the silos: the claim rests on "
                "that declaration (a proxy holding any silo's records is not free)")
    if not method.get("tuned"):
        return None
    share = f"{tc.validation_fraction:.0%} of each silo's training rows"
    if method.get("select") == "em":
        how = ("every grid setting trained once and one picked by the exponential mechanism "
               f"(ε_sel = {tc.em_fraction:g}·ε_k)")
    else:
        dist = distribution(tc)  # as the run built it (η and E[h] defaults included)
        h = (f"Poisson(μ = {dist.mean:g})" if dist.kind == "poisson" else
             f"TNB(η = {dist.eta:g}, E[h] = {dist.mean:.3g})")
        how = f"a random number of trials h_k ~ {h}, best only (RepeatAndSelect)"
        if method.get("select") == "subsample":
            how += (f", trials on a γ = {method.get('subsample_fraction'):g} subsample, then "
                    "one full run")
    what = {"lam": "λ", "lam+lr": "λ and lr"}.get(method["tuned"], method["tuned"])
    return (f"{label}: {what} per silo chosen privately on validation rows "
            f"({share}): {how}; trials, noisy scores and the release are charged before the "
            "first trial and are inside this method's ε; h_k is not released")


def job_notes(*, private: bool, noise: str, scratch: bool, uncharged=(), extra=(),
              nonprivate: str = NONPRIVATE_NOTE, demo: bool = False) -> list[str]:
    """The notes every output of a job carries, in this order: non-private, reproducible
    noise, scratch (or demo) store, then `extra` (the command's own), then every
    uncharged item."""
    out = [] if private else [nonprivate]
    if private and noise == "seeded":
        out.append(SEEDED_NOTE)
    if private and scratch:
        out.append(SCRATCH_NOTE)
    if private and demo:
        out.append(store_paths.DEMO_NOTE)
    return out + list(extra) + [f"uncharged: {u}" for u in uncharged]


def reset_notes(lifetime: list[dict], demo: bool = False) -> list[str]:
    """One note per silo whose lifetime budget was reset (`budget reset`, not a new
    cohort): its printed lifetime position leaves out the same people's earlier charges.
    (The demo store's restarts are said by its own note.)"""
    if demo:
        return []
    return [f"the lifetime budget of silo {r['silo']!r} was reset (epoch {r['epoch']}, "
            f"reason: {r['reset']['reason']}): its lifetime position counts only the charges "
            "since then, not the earlier charges on the same data"
            for r in lifetime if r.get("reset")]
