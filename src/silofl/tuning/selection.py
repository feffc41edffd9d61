"""Choosing hyperparameters from sweep results, on validation only.

Records are the run lines of a sweep results file (see `sweep.py`). Following the
thesis's protocol (§1.4, appendix B.4), for each method and ε the (λ, lr) with the best mean
*validation* metric over seeds is chosen, and its *test* metric (mean ± std over seeds) is
reported: test rows never influence the choice. Pure functions over plain data.
"""

from __future__ import annotations

import numpy as np


def eps_label(eps) -> str:
    return "non-private" if eps is None else f"{eps:g}"


def mean_std(values) -> tuple[float, float]:
    """Mean and (population) std over seeds; NaN if any seed's metric is undefined or
    diverged (None/NaN/inf), so an unstable setting never looks better than it is."""
    v = np.array([np.nan if x is None else x for x in values], float)
    if not len(v) or not np.all(np.isfinite(v)):
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std())


def _score(mean: float, higher: bool) -> float:
    """Sort key where larger is better; an undefined/diverged metric ranks last."""
    if not np.isfinite(mean):
        return -np.inf
    return mean if higher else -mean


def group_runs(records: list[dict]) -> dict:
    """{(method, ε or None): {(λ, lr): [records over seeds]}} in the grid's order."""
    out: dict = {}
    for r in records:
        out.setdefault((r["method"], r["epsilon"]), {}).setdefault(
            (r["lam"], r["lr"]), []).append(r)
    return out


def _grid_order(c: tuple) -> tuple:
    lam, lr = c  # "auto" after every number
    return (-1.0 if lam is None else float("inf") if lam == "auto" else lam, lr)


def choose(candidates: dict, higher: bool) -> tuple:
    """The (λ, lr) key whose runs have the best mean final validation metric over seeds
    (ties: the smallest λ, then lr; records arrive in completion order, not grid order)."""
    return max(sorted(candidates, key=_grid_order), key=lambda c: _score(
        mean_std([r["final_validation"] for r in candidates[c]])[0], higher))


def lambda_curve(records: list[dict], method: str, epsilon, higher: bool) -> list[dict]:
    """For each λ of `method` at `epsilon` (None: non-private): the lr chosen on
    validation for that λ and the test metric mean ± std over seeds."""
    cands = group_runs(records).get((method, epsilon), {})
    out = []
    for lam in sorted({c[0] for c in cands if c[0] is not None and c[0] != "auto"}):
        best = choose({c: v for c, v in cands.items() if c[0] == lam}, higher)
        tm, ts = mean_std([r["final_test"] for r in cands[best]])
        out.append({"lam": lam, "lr": best[1], "test_mean": tm, "test_std": ts})
    return out


def curve_over_rounds(records: list[dict], method: str, epsilon, higher: bool
                      ) -> dict | None:
    """Pooled test metric per evaluated round of the (λ, lr) chosen on validation for
    `method` at `epsilon`: rounds, mean and std over seeds (None if no runs)."""
    cands = group_runs(records).get((method, epsilon))
    if not cands:
        return None
    lam, lr = choose(cands, higher)
    curves = np.array([[np.nan if v is None else v for v in r["test"]]
                       for r in cands[(lam, lr)]], float)  # (seeds, rounds)
    return {"rounds": cands[(lam, lr)][0]["rounds"], "mean": curves.mean(0),
            "std": curves.std(0), "lam": lam, "lr": lr, "seeds": len(curves)}


def select_best(head: dict, records: list[dict]) -> list[dict]:
    """Per method and ε (non-private last): the chosen λ and lr, their validation and test
    metric mean ± std over seeds, and the largest ε any silo spent in those runs."""
    higher = head["higher_is_better"]
    rows = []
    methods = [m for m in head["config"]["sweep"]["methods"]]
    eps_order = list(head["config"]["sweep"]["epsilon"]) + [None]
    groups = group_runs(records)
    for m in methods:
        for e in eps_order:
            cands = groups.get((m, e))
            if not cands:
                continue
            lam, lr = choose(cands, higher)
            runs = cands[(lam, lr)]
            vm, vs = mean_std([r["final_validation"] for r in runs])
            tm, ts = mean_std([r["final_test"] for r in runs])
            spent = [r["privacy"]["max_epsilon_spent"] for r in runs if r.get("privacy")]
            rows.append({"method": m, "epsilon": e, "lam": lam, "lr": lr,
                         "seeds": sorted(r["seed"] for r in runs),
                         "validation_mean": vm, "validation_std": vs,
                         "test_mean": tm, "test_std": ts,
                         "candidates": len(cands),
                         "max_epsilon_spent": max(spent) if spent else None,
                         "runs": [r["key"] for r in runs]})
    return rows


def _accountants(runs: list[dict], k: int) -> str:
    """The accountant(s) behind silo k's figures (each run reports the tightest valid
    bound, RDP or PLD; older results files hold one name for all silos)."""
    names = set()
    for r in runs:
        a = r["privacy"]["accountant"]
        names.add(a[k] if isinstance(a, list) else a)
    return "/".join(sorted(names))


def privacy_check(head: dict, records: list[dict]) -> list[dict]:
    """Per swept ε and silo: the target and the largest ε that silo spent in any run (from
    the ledgers), flagged when over the target."""
    out = []
    silos = head["silos"]
    for e in head["config"]["sweep"]["epsilon"]:
        runs = [r for r in records if r["epsilon"] == e and r.get("privacy")]
        if not runs:
            continue
        spent = np.array([r["privacy"]["epsilon_spent"] for r in runs], float)  # (runs, K)
        target = np.array(runs[0]["privacy"]["target_epsilon"], float)
        worst = spent.max(axis=0)
        for k, silo in enumerate(silos):
            out.append({"epsilon": e, "silo": silo, "target_epsilon": float(target[k]),
                        "max_epsilon_spent": float(worst[k]), "runs": len(runs),
                        "accountant": _accountants(runs, k),
                        "over_target": bool(not worst[k] <= target[k])})
    return out
