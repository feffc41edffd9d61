"""The contribution report's outputs: the console table, the two figures per user, and
contribution.json / contribution.html (figures embedded), written atomically."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import numpy as np
from rich.markup import escape
from rich.table import Table

from silofl.experiments.contribution import (
    HOW_TEXT,
    USER_EVAL_NOTE,
    ZERO_COST_NOTE,
    Contribution,
)
from silofl.io import (
    json_safe,
    savefig_atomic,
    write_json_atomic,
    write_text_atomic,
)
from silofl.privacy.ledger import silo_file_id


def _alpha_cell(a: float) -> str:
    return f"{a:.2f}" if np.isfinite(a) else "— (not joined)"


def table(c: Contribution) -> Table:
    how = ("exact" if c.method == "exact"
           else f"{c.permutations} random orders, ± 1 s.e.")
    u = escape(c.user)
    t = Table(title=f"contribution to user {u}'s Weight Erosion model (test-loss drop on "
                    f"{u}'s held-out rows; Shapley {how})")
    for col in ("silo", "final α", "Ndoye rank", "leave-one-out", "Shapley"):
        t.add_column(col, justify="left" if col == "silo" else "right")
    for r in sorted(c.rows(), key=lambda r: -r["shapley"]):
        sh = f"{r['shapley']:+.4f}" + (f" ± {r['shapley_se']:.4f}" if c.method != "exact"
                                        else "")
        t.add_row(escape(r["silo"]), _alpha_cell(r["final_alpha"]),
                  "—" if r["ndoye_rank"] is None else str(r["ndoye_rank"]),
                  f"{r['loo']:+.4f}", sh)
    t.caption = (f"V(all) = {c.v_all:+.4f}, user alone V(∅) = {c.v_alone:+.4f}. From "
                 "released updates only (zero privacy cost); computed on the user's test "
                 "rows, not privatized")
    return t


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


#: figures name at most this many silos: the highest and lowest Shapley values
MAX_NAMED = 12


def named(c: Contribution, limit: int = MAX_NAMED) -> list[str]:
    """The other silos the figures name: all, or the limit/2 highest and lowest by Shapley."""
    if len(c.others) <= limit:
        return list(c.others)
    order = [c.others[j] for j in np.argsort(-c.shapley, kind="stable")]
    return order[:limit // 2] + order[-(limit // 2):]


def plot_alpha(c: Contribution, path: Path) -> None:
    """α_i over rounds (above) and every silo's cumulative Shapley value (below); with
    many silos only the `named` ones are coloured and labelled, the rest thin grey."""
    plt = _plt()
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8.5, 6.5), sharex=True)
    r = np.arange(1, c.alpha.shape[0] + 1)
    show = named(c)
    cmap = plt.get_cmap("tab20" if len(show) > 10 else "tab10")
    color = {s: cmap(i % cmap.N) for i, s in enumerate(show)}  # the same in both panels
    cum = np.cumsum(c.per_round, axis=0)
    for k, s in enumerate(c.silos):
        if s == c.user:
            ax.plot(r, c.alpha[:, k], "-", lw=2, color="black", label=f"{s} (user)")
        elif s in color:
            ax.plot(r, c.alpha[:, k], ":", lw=1.5, color=color[s], label=s)
        else:
            ax.plot(r, c.alpha[:, k], "-", lw=0.5, color="0.8")
    for j, s in enumerate(c.others):
        if s in color:
            ax2.plot(r, cum[:, j], color=color[s], label=s)
        else:
            ax2.plot(r, cum[:, j], lw=0.5, color="0.8")
    ax.set_ylabel("weight α_i")
    ax.set_ylim(-0.05, 1.05)
    more = (f"{len(show)} of {len(c.others)} named: highest and lowest Shapley; grey: the "
            "rest" if len(show) < len(c.others) else "")
    ax.set_title(f"user {c.user}: Weight Erosion weights and cumulative Shapley value\n{more}",
                 fontsize=9)
    ax2.axhline(0, color="grey", lw=0.8)
    ax2.set_ylabel("cumulative Shapley\n(test-loss drop)")
    ax2.set_xlabel("round")
    for a in (ax, ax2):
        a.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    savefig_atomic(fig, path, dpi=110)
    plt.close(fig)


def plot_values(c: Contribution, path: Path) -> None:
    """Bars of leave-one-out and Shapley (± 1 s.e. when estimated) per `named` silo."""
    plt = _plt()
    show = named(c, 2 * MAX_NAMED)
    idx = [c.others.index(s) for s in show]
    n = len(show)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * n + 2.5), 4.2))
    x = np.arange(n)
    ax.bar(x - 0.2, c.loo[idx], 0.4, label="leave-one-out")
    ax.bar(x + 0.2, c.shapley[idx], 0.4,
           yerr=c.shapley_se[idx] if c.method != "exact" else None, capsize=3,
           label="Shapley" + (" (± 1 s.e.)" if c.method != "exact" else ""))
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(x, show, rotation=45 if n > 6 else 0, ha="right" if n > 6 else "center",
                  fontsize=8)
    ax.set_ylabel(f"drop of {c.user}'s test loss")
    more = (f"; the {n} of {len(c.others)} silos with the highest and lowest Shapley value"
            if n < len(c.others) else "")
    ax.set_title(f"contribution to user {c.user} (from released updates only{more})",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    savefig_atomic(fig, path, dpi=110)
    plt.close(fig)


def figure_paths(out_dir: Path, user: str) -> dict[str, Path]:
    u = silo_file_id(user)
    return {"alpha": out_dir / f"contribution_alpha_{u}.png",
            "values": out_dir / f"contribution_values_{u}.png"}


def write_reports(out_dir: str | Path, reports: dict[str, Contribution],
                  notes=()) -> Path:
    """contribution.json, two PNGs per user and contribution.html (figures embedded) in
    `out_dir`; returns the HTML's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fixed = (USER_EVAL_NOTE, ZERO_COST_NOTE)
    first = next(iter(reports.values())).notes if reports else []
    common = [n for n in first if n not in fixed and all(n in c.notes
                                                         for c in reports.values())]
    notes = list(dict.fromkeys([*notes, *common]))  # shown once, on top
    bad: list[str] = []
    data = json_safe({"how": HOW_TEXT, "privacy": ZERO_COST_NOTE, "user_evaluation":
                      USER_EVAL_NOTE, "notes": list(notes),
                      "per_user": {u: c.to_dict() for u, c in reports.items()}}, bad)
    write_json_atomic(out_dir / "contribution.json", dict(data, nonfinite=bad), indent=1)
    e = html.escape
    css = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
           "table{border-collapse:collapse;margin:1em 0}"
           "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
           "td:first-child,th:first-child{text-align:left}"
           ".note{background:#fff4d6;padding:.8em;border-left:4px solid #e0a000}")
    parts = [("<!doctype html><html><head><meta charset='utf-8'><title>silofl contribution "
              f"report</title><style>{css}</style></head><body>"),
             "<h1>Contribution report (Weight Erosion)</h1>",
             (f"<p class='note'><b>For the user silo; sharing it releases numbers computed "
              f"from the user's test rows, not privatized.</b> {e(ZERO_COST_NOTE)}.</p>")]
    for note in notes:
        parts.append(f"<p class='note'>{e(note)}</p>")
    parts.append(f"<h2>How it is computed</h2><p>{e(HOW_TEXT)}</p>")
    for u, c in reports.items():
        figs = figure_paths(out_dir, u)
        plot_alpha(c, figs["alpha"])
        plot_values(c, figs["values"])
        how = ("exact enumeration of all coalitions" if c.method == "exact" else
               f"permutation Monte Carlo, {c.permutations} orders (seed {c.seed}), ± 1 s.e.")
        parts.append(f"<h2>User {e(u)}</h2><p>V(all) = {c.v_all:+.4f}, user alone "
                     f"V(∅) = {c.v_alone:+.4f}; Shapley: {e(how)}; "
                     f"{c.evaluations} model evaluations on the user's held-out rows.</p>")
        if c.ndoye_source:
            parts.append(f"<p>Ndoye rank: {e(c.ndoye_source)}.</p>")
        for note in c.notes:
            if note not in fixed and note not in notes:
                parts.append(f"<p class='note'>{e(note)}</p>")
        parts.append("<table><tr><th>silo</th><th>final α</th><th>Ndoye rank</th>"
                     "<th>leave-one-out</th><th>Shapley</th></tr>")
        for r in sorted(c.rows(), key=lambda r: -r["shapley"]):
            sh = f"{r['shapley']:+.4f}" + (f" ± {r['shapley_se']:.4f}"
                                           if c.method != "exact" else "")
            rk = "—" if r["ndoye_rank"] is None else str(r["ndoye_rank"])
            parts.append(f"<tr><td>{e(r['silo'])}</td>"
                         f"<td>{_alpha_cell(r['final_alpha'])}</td><td>{rk}</td><td>{r['loo']:+.4f}</td><td>{sh}</td></tr>")
        parts.append("</table>")
        for name, path in figs.items():
            b64 = base64.b64encode(path.read_bytes()).decode()
            parts.append(f"<img alt='{e(name)} {e(u)}' style='max-width:100%' "
                         f"src='data:image/png;base64,{b64}'>")
    parts.append("</body></html>")
    write_text_atomic(out_dir / "contribution.html", "\n".join(parts))
    return out_dir / "contribution.html"
