"""What counted tuning over E[h] = 10 candidates costs, relative to one run (no data).

For a DP-SGD run (q, T steps) at the σ whose one-run RDP ε is 1, 2, 4, 8, prints
  ε(tuned release) / ε(one run) at the same σ, and σ(tuned) / σ(one run) at the same ε,
for: the tuned release of `select = "random"` (pivot + RepeatAndSelect, dp_accounting's
bound, TNB η = 1 / η = 0 / Poisson); the same bound on a fine order grid and with η = −0.5
(Papernot & Steinke's Theorem 2 allows η > −1; dp_accounting only η ≥ 0: an independent
transcription, `tnb_bound`, and what silofl charges, `privacy.tnb_select`);
`select = "subsample"` (γ = 0.1; η = 0 and −0.5; "sub default" is the default counted
tuning: η = 0, score ratio 4); and a naive grid of 10 settings (composition). The
score's noise multiplier is silofl's (`tuning.private.score_sigma`, ratio 2 unless
--score-ratio).

    .venv/bin/python benchmarks/bench_tuning_cost.py                 # ~1 min
    .venv/bin/python benchmarks/bench_tuning_cost.py --q 0.3 --delta 1e-3
"""

from __future__ import annotations

import argparse
import logging
import math

import dp_accounting as dpa
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as R

from silofl.privacy import accounting, events
from silofl.privacy import selection as TA
from silofl.privacy.calibration import calibrate, calibrate_dpsgd
from silofl.privacy.rdp_curves import RDP_ORDERS, rdp_to_epsilon
from silofl.tuning import distributions as D

A = np.asarray(RDP_ORDERS, float)
FINE = np.unique(np.concatenate([np.linspace(1.01, 12, 1100), np.geomspace(12, 1024, 300), A]))


def tnb_bound(orders: np.ndarray, inner: np.ndarray, mean: float, eta: float) -> np.ndarray:
    """Papernot & Steinke (2022) Theorem 2 for any η > −1, at `orders` (λ = λ̂ range)."""
    g = D.tnb(eta, mean=mean).gamma
    c = (1 + eta) * np.min((1 - 1 / orders) * inner + math.log(1 / g) / orders)
    out = inner + math.log(mean) / (orders - 1) + c
    return np.minimum.accumulate(out[::-1])[::-1]  # RDP is non-decreasing in the order


def sg(q: float, s: float, T: int, orders: np.ndarray) -> np.ndarray:
    return T * np.asarray(R._compute_rdp_poisson_subsampled_gaussian(q, s, orders), float)


def row(q: float, T: int, delta: float, e1: float, ratio: float, gam: float,
        mean: float = 10.0) -> dict:
    s = calibrate_dpsgd(e1, delta, q, T, "rdp")
    rev = events.dpsgd_event(q, s, T)  # one pass = the whole run (rounds = 1)
    ss = ratio * s / (q * math.sqrt(T))
    eps = lambda ev: accounting.epsilon(ev, delta, "rdp")  # noqa: E731
    base = eps(dpa.SelfComposedDpEvent(rev, 1))
    out = {}
    for name, dist in (("RS η=1", D.tnb(1.0, mean=mean)), ("RS η=0", D.tnb(0.0, mean=mean)),
                       ("RS Poisson", D.poisson(mean))):
        out[name] = eps(TA.tuned_event(rev, 1, dist, ss)) / base
    trial = lambda o: sg(q, s, T, o) + o / (2 * ss ** 2)  # noqa: E731
    for eta in (0.0, -0.5):
        r = sg(q, s, T, FINE) + tnb_bound(FINE, trial(FINE), mean, eta)
        out[f"fine η={eta:g}"] = rdp_to_epsilon(FINE, r, delta)[0] / base
    for eta in (1.0, 0.0):
        ev = TA.subsample_tuned_event(rev, 1, D.tnb(eta, mean=mean), ss, gam)
        out[f"sub η={eta:g}"] = eps(ev) / base
    out["RS η=-.5"] = eps(TA.tuned_event(rev, 1, D.tnb(-0.5, mean=mean), ss)) / base
    out["sub η=-.5"] = eps(TA.subsample_tuned_event(rev, 1, D.tnb(-0.5, mean=mean), ss,
                                                    gam)) / base
    out["sub default"] = eps(TA.subsample_tuned_event(
        rev, 1, D.tnb(0.0, mean=mean), 4.0 * s / (q * math.sqrt(T)), gam)) / base
    out["naive 10"] = eps(TA.naive_event(rev, 1, 10, ss)) / base
    # noise: σ needed by the tuned release at the same ε, over one run's σ
    for name, mk in (("σ× RS η=0", lambda z: TA.tuned_event(
            events.dpsgd_event(q, z, T), 1, D.tnb(0.0, mean=mean),
            ratio * z / (q * math.sqrt(T)))),
                     ("σ× sub η=0", lambda z: TA.subsample_tuned_event(
            events.dpsgd_event(q, z, T), 1, D.tnb(0.0, mean=mean),
            ratio * z / (q * math.sqrt(T)), gam))):
        out[name] = calibrate(mk, e1, delta, "rdp") / s
    return {"eps": e1, "sigma": s, **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--q", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--delta", type=float, default=1e-4)
    ap.add_argument("--score-ratio", type=float, default=2.0)
    ap.add_argument("--gamma", type=float, default=0.1, help="subsample fraction")
    a = ap.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)
    rows = [row(a.q, a.steps, a.delta, e, a.score_ratio, a.gamma) for e in (1, 2, 4, 8)]
    keys = [k for k in rows[0] if k not in ("eps", "sigma")]
    print(f"q = {a.q}, T = {a.steps} steps, δ = {a.delta}, score ratio {a.score_ratio}, "
          f"γ = {a.gamma}, E[h] = 10")
    print("ε1  σ      " + "  ".join(f"{k:>11}" for k in keys))
    for r in rows:
        print(f"{r['eps']:<3g} {r['sigma']:<6.3f} " + "  ".join(f"{r[k]:>11.2f}" for k in keys))


if __name__ == "__main__":
    main()
