"""Byzantine-robust MR-MTL under DP (figures printed, not asserted; issue 10's checks).

For School (all 139 schools, batch 16 so none is dropped), the 23-silo synthetic task
(`vehicle_like`) and the 4 heart hospitals, MR-MTL with DP-SGD runs every aggregation rule
against every attack, with f = ⌈20% of K⌉ attacking silos (School 28, synthetic 5; heart 1
of 4, where Krum cannot run): the final test metric of the HONEST silos (test-count
weighted), averaged over repeats. An attack's harm is measured against the same rule's
honest run (accuracy: points; MSE: % relative); the "none" column is what each rule costs
without attackers under DP, against the plain mean. The margin: 2 accuracy points, or 2% of
the honest MSE.

Attacks (the `robust.Attack` harness, same attackers for every attack and rule):
sign_flip (−u), scaled (−10·u), gaussian (N(0, 10²) per coordinate), nan, little ("a little
is enough": honest mean − 1·std per coordinate), label_flip (`robust.flip_labels`: the
attackers run honest DP-SGD on flipped labels; regression: y → 1 − y in School's [0, 1]).

Noise: seeded by default (repeat r uses seed r for every rule and attack: paired
comparisons, reproducible; an EXPERIMENT, not a privacy guarantee); `--noise secure` draws
it from the OS CSPRNG (the deployment default; unpaired, so differences are noisier).
Privacy is the same for every cell: aggregation is post-processing of the DP updates.
Centered clipping's radius τ is set from public quantities only: the median over silos of
lr·√steps·C·√(1 + σ²P/b²), about the norm of one silo's noisy round update.

Run: .venv/bin/python benchmarks/bench_robust.py [--tasks school,synthetic23,heart]
     [--repeats N] [--noise seeded|secure] [--rounds R] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from silofl.algorithms import make_algorithm
from silofl.algorithms.robust import Attack, Attacked, flip_labels
from silofl.data import load_heart_disease, load_school, vehicle_like
from silofl.io import json_safe, write_json_atomic
from silofl.models import make_model
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig, plan_silos
from silofl.runtime.simulator import simulate

RULES = ("mean", "median", "trimmed_mean", "krum", "multi_krum", "centered_clipping")
ATTACKS = ("none", "sign_flip", "scaled", "gaussian", "nan", "little", "label_flip")
MARGIN = 0.02  # 2 accuracy points, or 2% of the honest MSE
TRIM = 0.25    # ⌊0.25·K⌋ ≥ ⌈0.2·K⌉ for K = 4, 23, 139


@dataclass
class Task:
    label: str
    load: Callable
    model: str
    target: PrivacyTarget
    lam: float
    cfg: TrainingConfig
    rules: tuple = RULES
    attackers: int | None = None  # None: ⌈20% of K⌉
    repeats: int = 3              # small test sets (heart) need more


def tasks(rounds: int | None) -> dict[str, Task]:
    def cfg(r, b, lr):
        return TrainingConfig(rounds=rounds or r, batch_size=b, lr=lr, clip=1.0,
                              eval_every=rounds or r)  # the default accountant (PLD)
    return {
        "school": Task("School (139 schools, linear, MSE; ε=6, δ=1e-3)", load_school,
                       "linear", PrivacyTarget(6.0, 1e-3), 1.0, cfg(50, 16, 0.03)),
        "synthetic23": Task("synthetic, 23 silos (vehicle_like, logistic; ε=1, δ=1e-5)",
                            vehicle_like, "logistic", PrivacyTarget(1.0, 1e-5), 0.1,
                            cfg(30, 64, 0.03)),
        "heart": Task("heart, 4 hospitals (logistic; ε=1, δ=1e-4)", load_heart_disease,
                      "logistic", PrivacyTarget(1.0, 1e-4), 0.3, cfg(30, 16, 0.03),
                      rules=("mean", "median", "trimmed_mean", "centered_clipping"),
                      attackers=1, repeats=12),
    }


def public_tau(plans, cfg: TrainingConfig, num_params: int) -> float:
    """Centered clipping's radius from public quantities: the median over silos of
    lr·√steps·C·√(1 + σ²P/b²) (≈ the L2 norm of one silo's noisy round update)."""
    return float(np.median([cfg.lr * math.sqrt(p.steps_per_pass) * cfg.clip
                            * math.sqrt(1 + (p.noise_multiplier / cfg.batch_size) ** 2
                                        * num_params) for p in plans]))


def run_task(task: Task, repeats: int | None, noise: str, progress: Progress) -> dict:
    repeats = repeats or task.repeats
    fed = task.load().with_targets(task.target)
    K = fed.num_silos
    f = task.attackers if task.attackers is not None else math.ceil(0.2 * K)
    model = make_model(task.model, fed.dim)
    cfg = dataclasses.replace(task.cfg, noise=noise)
    plans = plan_silos(fed, make_algorithm("mrmtl", lam=task.lam), cfg)  # the same for all
    tau = public_tau(plans, cfg, model.num_params)
    bad = Attack("nan", count=f, seed=0).attackers(K)  # every attack hits these silos
    honest = np.setdiff1d(np.arange(K), bad)
    tc = np.array([s.n_test for s in fed.silos], float)[honest]
    poisoned = flip_labels(fed, bad)
    cells, rejected, seconds, runs = {}, {}, 0.0, 0
    job = progress.add_task(task.label.split(" (")[0], total=len(task.rules) * len(ATTACKS)
                            * repeats)
    for rule in task.rules:
        for attack in ATTACKS:
            vals, rej = [], 0
            for rep in range(repeats):
                alg = make_algorithm("mrmtl", lam=task.lam, aggregation=rule,
                                     attackers=0 if rule == "mean" else f,
                                     trim_fraction=TRIM, clip_radius=tau)
                if attack not in ("none", "label_flip"):
                    alg = Attacked(alg, Attack(attack, count=f, seed=0))
                t0 = time.perf_counter()
                res = simulate(poisoned if attack == "label_flip" else fed, model, alg,
                               dataclasses.replace(cfg, seed=rep), plans=plans)
                seconds, runs = seconds + time.perf_counter() - t0, runs + 1
                per = np.array(res.final_per_silo)[honest]
                vals.append(float((per * tc).sum() / tc.sum()))
                rej += res.method.get("aggregation", {}).get("rejected", 0)
                assert np.isfinite(res.shared).all() or attack != "nan", (rule, attack)
                progress.advance(job)
            cells[rule, attack] = float(np.mean(vals))
            rejected[rule, attack] = rej
    return {"label": task.label, "K": K, "f": f, "attackers": [fed.names[k] for k in bad],
            "metric": res.metric, "lam": task.lam, "rounds": cfg.rounds,
            "batch_size": cfg.batch_size, "lr": cfg.lr, "tau": tau,
            "sigma": [min(p.noise_multiplier for p in plans),
                      max(p.noise_multiplier for p in plans)],
            "rules": list(task.rules), "cells": cells, "rejected": rejected,
            "repeats": repeats, "seconds_per_run": seconds / runs, "runs": runs}


def harm(metric: str, value: float, ref: float) -> float:
    """How much worse `value` is than `ref`: accuracy points lost, or % MSE added."""
    if metric == "mse":
        return 100 * (value - ref) / ref
    return 100 * (ref - value)


def show(out: dict, console: Console) -> list[tuple[str, str, float]]:
    """Print one task's table and verdicts; returns the (rule, attack, harm) cells that
    are not within the margin of the rule's own honest run."""
    unit = "% MSE" if out["metric"] == "mse" else "acc. points"
    cells, m = out["cells"], out["metric"]
    t = Table(title=f"{out['label']}: MR-MTL λ={out['lam']:g}, {out['rounds']} rounds, "
                    f"b={out['batch_size']}, σ {out['sigma'][0]:.2f}..{out['sigma'][1]:.2f}, "
                    f"f={out['f']} of {out['K']}, τ={out['tau']:.3f}",
              caption=f"honest silos' {m}, mean of {out['repeats']} repeats. 'none': cost vs "
                      f"the honest MEAN; attacks: harm vs the SAME rule's honest run ({unit}, "
                      f"> 0 = worse; green: within {MARGIN * 100:g})")
    t.add_column("rule")
    for a in ATTACKS:
        t.add_column(a, justify="right")
    fails = []
    for rule in out["rules"]:
        row = [rule]
        for a in ATTACKS:
            v = cells[rule, a]
            ref = cells["mean" if a == "none" else rule, "none"]
            d = harm(m, v, ref)
            ok = bool(np.isfinite(d) and d <= MARGIN * 100)
            if not ok and a != "none":
                fails.append((rule, a, d))
            fmt = f"{v:.4f}" if abs(v) < 100 else f"{v:.3g}"
            dd = f"{d:+.1f}" if abs(d) < 1e3 else f"{d:+.0e}"
            row.append(fmt if rule == "mean" and a == "none"
                       else f"[{'green' if ok else 'red'}]{fmt} {dd}[/]")
        t.add_row(*row)
    console.print(t)
    cost = ", ".join(f"{r} {harm(m, cells[r, 'none'], cells['mean', 'none']):+.1f}"
                     for r in out["rules"][1:])
    console.print(f"  cost of each robust rule WITHOUT attackers under DP ({unit} vs the "
                  f"mean, which averages the silos' noise best): {cost}")
    nan_rej = {r: out["rejected"][r, "nan"] for r in out["rules"]}
    console.print(f"  NaN updates rejected (all runs): {nan_rej}; attackers: "
                  f"{', '.join(out['attackers'][:6])}{' …' if out['f'] > 6 else ''}")
    mean_fails = [f"{a} ({d:+.1f})" for r, a, d in fails if r == "mean"]
    console.print(f"  plain mean fails on: {', '.join(mean_fails) or 'nothing'}")
    for rule in out["rules"][1:]:
        bad = [f"{a} ({d:+.1f})" for r, a, d in fails if r == rule]
        verdict = ("within the margin for every attack" if not bad
                   else "NOT within the margin on: " + ", ".join(bad))
        console.print(f"  {rule:18s} {verdict}")
    return fails


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="school,synthetic23,heart")
    ap.add_argument("--repeats", type=int, help="per task (default: 3; heart 12)")
    ap.add_argument("--noise", choices=("seeded", "secure"), default="seeded")
    ap.add_argument("--rounds", type=int, help="override every task's rounds")
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)
    console = Console(width=max(132, Console().width))  # the 7 attack columns
    all_tasks = tasks(a.rounds)
    chosen = [all_tasks[n] for n in a.tasks.split(",")]
    console.print(f"noise: {a.noise}" + (" (reproducible, paired across rules; an experiment, "
                                          "not a privacy guarantee)" if a.noise == "seeded"
                                          else " (OS CSPRNG)"))
    results, t0 = {}, time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        for name, task in zip(a.tasks.split(","), chosen):
            results[name] = run_task(task, a.repeats, a.noise, progress)
    for out in results.values():
        show(out, console)
    wall = time.perf_counter() - t0
    per = {n: o["seconds_per_run"] for n, o in results.items()}
    console.print(f"wall time {wall:.0f} s; seconds per run: "
                  + ", ".join(f"{n} {s:.2f}" for n, s in per.items()))
    proj = sum(s * (200 / o["rounds"]) * len(o["rules"]) * len(ATTACKS) * 5
               for s, o in zip(per.values(), results.values()))
    console.print(f"projected: 200 rounds and 5 repeats for these tasks ≈ {proj / 60:.0f} min "
                  "(run time is linear in rounds; longer runs also need larger σ)")
    if a.json:
        data = {n: dict(o, cells={f"{r}|{k}": v for (r, k), v in o["cells"].items()},
                        rejected={f"{r}|{k}": v for (r, k), v in o["rejected"].items()})
                for n, o in results.items()}
        write_json_atomic(a.json, json_safe({"noise": a.noise,
                                             "tasks": data}), indent=1)


if __name__ == "__main__":
    main()
