"""What tuning costs, shown: per ε, untuned Local and FedAvg, MR-MTL (or Ditto) at the public
λ̄, privately tuned (honest ε) and tuned with uncounted cost — from a sweep's records.

The fixed, public setting of every untuned method is the first listed learning rate
(sweep.lr[0]) and, for the tuned method, λ̄ = tuning.pivot_lam. Pure functions over the
records of a results file, plus a table and a figure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from silofl.io import json_safe, write_json_atomic
from silofl.tuning.selection import choose, group_runs, mean_std

NOT_A_GUARANTEE = "uncounted: selection cost NOT counted — not a privacy guarantee"


def comparison(head: dict, records: list[dict]) -> list[dict]:
    """One row per swept ε (private only) with test mean ± std over seeds of each arm."""
    cfg = head["config"]
    sw, tc = cfg["sweep"], cfg.get("tuning") or {}
    method = tc.get("method", "mrmtl")
    pivot_lam = float(tc.get("pivot_lam", 0.1))
    lr0 = sw["lr"][0]
    higher = head["higher_is_better"]
    groups = group_runs(records)
    rows = []
    for e in sw["epsilon"]:
        row = {"epsilon": e}
        for name, m, key in (("local", "local", (None, lr0)), ("fedavg", "fedavg", (None, lr0)),
                             ("fixed", method, (pivot_lam, lr0))):
            runs = groups.get((m, e), {}).get(key, [])
            row[name] = mean_std([r["final_test"] for r in runs]) if runs else None
        cands = groups.get((method, e), {})
        if cands:
            best = choose(cands, higher)
            row["uncounted"] = mean_std([r["final_test"] for r in cands[best]])
            row["uncounted_setting"] = {"lam": best[0], "lr": best[1]}
        tuned = [r for r in records if r["method"] == f"{method}_tuned" and r["epsilon"] == e]
        if tuned:
            row["tuned"] = mean_std([r["final_test"] for r in tuned])
            t = tuned[0].get("tuning") or {}
            row["honest_epsilon"] = max(r["privacy"]["max_epsilon_spent"] for r in tuned)
            row["naive_grid_epsilon"] = t.get("naive_grid_epsilon")
            row["naive_grid_trials"] = t.get("naive_grid_trials")
            row["uncounted_grid_epsilon"] = t.get("uncounted_grid_epsilon")
            row["uncounted_grid_size"] = t.get("uncounted_grid_size")
            row["mean_trials"] = t.get("mean_trials")
        ends = [row[k][0] for k in ("local", "fedavg") if row.get(k)]
        if ends and row.get("tuned"):
            best_end = max(ends) if higher else min(ends)
            row["tuned_beats_endpoints"] = bool(
                row["tuned"][0] > best_end if higher else row["tuned"][0] < best_end)
        rows.append(row)
    return rows


def _cell(ms) -> str:
    if not ms or not np.isfinite(ms[0]):
        return "—"
    return f"{ms[0]:.3g}\n±{ms[1]:.2g}"


def comparison_table(head: dict, rows: list[dict]):
    from rich.table import Table
    metric = head["metric"]
    t = Table(title=f"what tuning costs ({metric}, test, mean ± std over seeds)")
    for c in ("ε", "Local", "FedAvg", "fixed λ̄", "tuned", "tuned ε", "naive ε (h)",
              "uncounted", "its ε (runs)", "tuned best?"):
        t.add_column(c, justify="right", overflow="fold")
    for r in rows:
        ng = "—" if r.get("naive_grid_epsilon") is None else \
            f"{r['naive_grid_epsilon']:.3g} ({r['naive_grid_trials']})"
        ug = "—" if r.get("uncounted_grid_epsilon") is None else \
            f"{r['uncounted_grid_epsilon']:.3g} ({r['uncounted_grid_size']})"
        he = "—" if r.get("honest_epsilon") is None else f"{r['honest_epsilon']:.3g}"
        beats = r.get("tuned_beats_endpoints")
        t.add_row(f"{r['epsilon']:g}", _cell(r.get("local")), _cell(r.get("fedavg")),
                  _cell(r.get("fixed")), _cell(r.get("tuned")), he, ng,
                  _cell(r.get("uncounted")), ug,
                  "—" if beats is None else ("yes" if beats else "no"))
    t.caption = (f"{NOT_A_GUARANTEE}. tuned ε: the largest ε any silo spent (the whole "
                 "tuned release); naive ε (h): a fixed grid of h trials at the tuned run's σ, "
                 "by composition; its ε (runs): the uncounted choice's cost by composition; "
                 "tuned best?: tuned beats both Local and FedAvg")
    return t


def plot_comparison(head: dict, rows: list[dict], path: Path, title: str = "") -> Path:
    """Test metric vs ε of every arm (error bars: std over seeds), as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    eps = [r["epsilon"] for r in rows]
    arms = (("local", "Local (untuned)", "-o"), ("fedavg", "FedAvg (untuned)", "-s"),
            ("fixed", "fixed public λ̄", "-^"), ("tuned", "privately tuned (honest ε)", "-D"),
            ("uncounted", "tuned, cost uncounted (NOT a guarantee)", "--x"))
    for key, label, style in arms:
        vals = [r.get(key) for r in rows]
        if not any(vals):
            continue
        m = [v[0] if v else np.nan for v in vals]
        s = [v[1] if v else np.nan for v in vals]
        ax.errorbar(eps, m, yerr=s, fmt=style, capsize=3, label=label)
    ax.set_xlabel("per-silo ε (the whole release)")
    ax.set_ylabel(f"test {head['metric']}")
    ax.set_title(title or "what tuning λ costs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_comparison(head: dict, records: list[dict], results: Path):
    """Table, and beside the results file <stem>-tuning.json / .png. Returns (table, files)."""
    rows = comparison(head, records)
    results = Path(results)
    js = results.with_name(results.stem + "-tuning.json")
    png = results.with_name(results.stem + "-tuning.png")
    write_json_atomic(js, json_safe({"rows": rows, "note": NOT_A_GUARANTEE,
                                     "metric": head["metric"]}))
    plot_comparison(head, rows, png)
    return comparison_table(head, rows), [js, png]
