"""PrivateKT against its baselines at the same per-round ε (issue 11): three jobs on one
federation, each charged to the clients' lifetime budgets on its own —

* `privatekt`: K labels by randomized response per selected client and round (ε-LDP);
* `fedavg_ldp`: the clipped model update with Gaussian (or Laplace) noise per selected
  client and round (ε-LDP, (ε, δ) for Gaussian), the local DP Flower's LocalDpMod offers;
* `fedavg` with DP-SGD: σ chosen so that one round's local DP-SGD pass is (ε, δ)
  example-level DP (a weaker notion than ε-LDP over the whole dataset), every client every
  round, as silofl's FedAvg runs.

The figure plots the pooled test accuracy against rounds, each curve labelled with the
largest cumulative ε any client spent in that job (composed over the rounds it took part
in). Each job's per-client target is [privacy] epsilon for the local-DP methods; DP-SGD
FedAvg's is what its fixed σ composes to over the rounds (so it is never refused for
want of budget).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import dp_accounting as dpa
import numpy as np

from silofl.algorithms import make_algorithm
from silofl.config import Config
from silofl.errors import ConfigError
from silofl.experiments import build
from silofl.io import write_json_atomic
from silofl.privacy import accounting
from silofl.privacy.budget import BudgetStore
from silofl.privacy.ledger import tightest
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import plan_silos
from silofl.runtime.simulator import simulate

METHODS = ("privatekt", "fedavg_ldp", "fedavg")


def _dpsgd_sigma(round_eps: float, delta: float, q: float, steps: int) -> float:
    """σ with one local pass (steps Poisson-sampled Gaussian steps at rate q) ≤ round_eps."""
    return accounting.calibrate_dpsgd(round_eps, delta, q, steps, "pld")


def compare(cfg: Config, out_dir: Path | None = None, *, store: BudgetStore | None = None,
            on_round=None) -> dict:
    """Run the three methods as three jobs and return {method: {rounds, accuracy, epsilon
    (per client), ...}}; with `out_dir`, also write comparison.json and comparison.png."""
    if not cfg.privacy.enabled:
        raise ConfigError("the comparison is about privacy: it needs [privacy] enabled")
    # PrivateKT's and fedavg_ldp's uploads are accounted per client dataset, not per person
    build.require_row_unit(cfg, "silofl ldp-compare")
    fed = build.apply_privacy(build.load_federation(cfg.data), cfg)
    model = build.build_model(cfg, fed)
    tcfg = build.training_config(cfg)
    opts = build.ldp_options(cfg.training)
    out = {}
    for method in METHODS:
        alg = make_algorithm(method, **opts) if method != "fedavg" else make_algorithm(
            "fedavg", weighted=cfg.training.weighted)
        run_cfg, run_fed = tcfg, fed
        if method == "fedavg":  # per silo: σ_k for ε per round at its own q_k; its
            # target = what T rounds at σ_k compose to (the plan calibrates each silo to it)
            base = plan_silos(fed, alg, dataclasses.replace(tcfg, private=False))
            targets = {}
            for s, p in zip(fed.silos, base):
                sigma = _dpsgd_sigma(opts["ldp_epsilon"], cfg.privacy.delta, p.q,
                                     p.steps_per_pass)
                total = tightest(dpa.SelfComposedDpEvent(
                    accounting.dpsgd_event(p.q, sigma, p.steps_per_pass), tcfg.rounds),
                    cfg.privacy.delta)[0]
                targets[s.name] = PrivacyTarget(total * (1 + 1e-6), cfg.privacy.delta)
            run_fed = fed.with_targets(None, targets)
        # a scratch store per job unless one is given (then the three jobs compose in it)
        job_store = store if store is not None else BudgetStore(None)
        res = simulate(run_fed, model, alg, run_cfg, metric="accuracy", store=job_store,
                       method=method,
                       on_round=None if on_round is None else
                       (lambda t, v, m=method: on_round(m, t, tcfg.rounds, v)))
        eps = [r["epsilon"] for r in res.privacy()]
        out[method] = {"rounds": res.history.rounds, "accuracy": res.history.pooled,
                       "epsilon_per_client": eps, "max_epsilon": max(eps),
                       "mean_epsilon": float(np.mean(eps)), "delta": cfg.privacy.delta,
                       "method": res.method, "seconds": res.seconds,
                       "rounds_per_client": [len(led.entries) for led in res.ledgers]
                       if method != "fedavg" else [tcfg.rounds] * fed.num_silos,
                       "scratch": res.scratch, "run_id": res.run_id}
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out_dir / "comparison.json", {
            "per_round_epsilon": opts["ldp_epsilon"], "delta": cfg.privacy.delta,
            "notes": [
                "privatekt and fedavg_ldp: ε-LDP per upload w.r.t. the client's whole local "
                "dataset; fedavg: (ε, δ) example-level DP-SGD per round",
                "ε per client is composed over the rounds the client took part in; no "
                "shuffle-model amplification is assumed",
                *(["scratch budget stores: an experiment, not a release"]
                  if store is None or store.scratch else [])],
            "methods": out}, indent=1)
        plot(out, opts["ldp_epsilon"], out_dir / "comparison.png")
    return out


def plot(results: dict, round_eps: float, path: Path) -> None:
    """Accuracy against rounds, one curve per method, cumulative ε per client in the legend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    names = {"privatekt": "PrivateKT (RR on K labels)",
             "fedavg_ldp": "FedAvg + LDP on clipped updates",
             "fedavg": "FedAvg + DP-SGD (example-level)"}
    for m, r in results.items():
        ax.plot(r["rounds"], r["accuracy"], marker="o", ms=3,
                label=f"{names.get(m, m)}: cumulative ε per client ≤ {r['max_epsilon']:.0f} "
                      f"(mean {r['mean_epsilon']:.0f}), δ = {r['delta']:g}")
    ax.axhline(0.1, color="grey", ls=":", lw=1, label="chance (10 classes)")
    ax.set_xlabel("round")
    ax.set_ylabel("pooled test accuracy")
    ax.set_title(f"same per-round ε = {round_eps:g} per client upload")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
