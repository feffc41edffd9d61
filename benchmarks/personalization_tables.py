"""Tables, markdown and figures of benchmarks/bench_personalization.py (issue 22): results
aggregated per (method, ε) over seeds, the best untuned baseline (the better of FedAvg and
Local) marked, each method's ratio to it, the uncounted best-λ reference row."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

SEEDED = "seeded noise: experiments, not releases (scratch budget stores)"
UNCOUNTED = "mrmtl best λ (uncounted)"
BASELINES = ("fedavg", "local")

@dataclass
class Cell:
    """Mean ± sd over seeds of one (method, ε); `errors` from the failed seeds."""

    values: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    note: str = ""  # e.g. the λ of the uncounted best

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def sd(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) > 1 else None


def aggregate(records: list[dict]) -> dict[str, dict[str, dict[float, Cell]]]:
    """dataset -> method label -> ε -> Cell, in the order first seen."""
    out: dict = {}
    for r in records:
        cell = out.setdefault(r["dataset"], {}).setdefault(r["method"], {}).setdefault(
            float(r["epsilon"]), Cell())
        if r.get("value") is not None:
            cell.values.append(float(r["value"]))
        else:
            cell.errors.append(r.get("error") or "no result")
    return out


def higher_is_better(metric: str) -> bool:
    return metric.lower() not in ("mse", "rmse", "mae", "loss", "log_loss")


def _better(a: float, b: float, higher: bool) -> bool:
    return a > b if higher else a < b


def add_uncounted(cells: dict[str, dict[float, Cell]], lams: list[float], higher: bool
                  ) -> None:
    """Add the UNCOUNTED row: per ε, the MR-MTL λ of the grid with the best mean."""
    row: dict[float, Cell] = {}
    for lam in lams:
        for eps, c in cells.get(f"mrmtl:lam={lam:g}", {}).items():
            best = row.get(eps)
            if c.mean is not None and (best is None or best.mean is None
                                       or _better(c.mean, best.mean, higher)):
                row[eps] = Cell(list(c.values), note=f"λ={lam:g}")
    if row:
        cells[UNCOUNTED] = row


def baseline(cells: dict[str, dict[float, Cell]], eps: float, higher: bool
             ) -> tuple[str, float] | None:
    """The best untuned baseline at ε: (label, mean) of the better of FedAvg and Local."""
    best = None
    for name in BASELINES:
        m = cells.get(name, {}).get(eps, Cell()).mean
        if m is not None and (best is None or _better(m, best[1], higher)):
            best = (name, m)
    return best


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1].rstrip() + "…"


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def cell_text(label: str, c: Cell | None, base: tuple[str, float] | None, seeds: int) -> str:
    """``mean ± sd (ratio×)``, ``*`` on the baseline itself, ``n/a`` without values."""
    if c is None or c.mean is None:
        return "n/a"
    text = _fmt(c.mean) + (f" ± {c.sd:.2g}" if c.sd is not None else "")
    if len(c.values) < seeds:
        text += f" (n={len(c.values)})"
    if c.note:
        text += f" [{c.note}]"
    if base is not None and label == base[0]:
        text += " *"
    elif base is not None and base[1] != 0:
        text += f" ({c.mean / base[1]:.2f}×)"
    return text


def make_table(cells: dict[str, dict[float, Cell]], rows: list[str], eps_list: list[float],
               seeds: int, higher: bool) -> tuple[list[str], list[list[str]], list[str]]:
    """One dataset's table as text.

    Parameters
    ----------
    cells : method label -> ε -> Cell (`aggregate`, `add_uncounted`)
    rows : the row labels, in order (labels without cells are shown n/a)
    eps_list : the ε columns
    seeds : seeds per cell asked for (fewer values are flagged ``n=``)
    higher : whether a higher metric is better

    Returns
    -------
    header : list of str
        ``method``, then one column per ε.
    body : list of rows (list of str)
        ``n/a: <error>`` rows for methods that failed at every ε.
    footnotes : list of str
        Every distinct error of a partially failed row.
    """
    header = ["method"] + [f"ε = {e:g}" for e in eps_list]
    bases = {e: baseline(cells, e, higher) for e in eps_list}
    body, notes = [], []
    for label in rows:
        row = cells.get(label, {})
        if not any(c.values for c in row.values()):
            errs = sorted({e for c in row.values() for e in c.errors}) or ["not run"]
            body.append([label, f"n/a: {_short(errs[0], 70)}"] + [""] * (len(eps_list) - 1))
            continue
        body.append([label] + [cell_text(label, row.get(e), bases[e], seeds)
                               for e in eps_list])
        for err in sorted({e for c in row.values() for e in c.errors}):
            notes.append(f"{label}: {err[:160]}")
    return header, body, notes


def markdown(title: str, caption: str, header: list[str], body: list[list[str]],
             notes: list[str]) -> str:
    """A table as README markdown (caption, table, footnotes)."""
    lines = [f"### {title}", "", caption, "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in body]
    lines += [""] + [f"- n/a in part: {n}" for n in notes] + ([""] if notes else [])
    return "\n".join(lines)


def caption(raw: dict, seeds: int, higher: bool, uncounted: bool) -> str:
    t, p = raw["training"], raw["privacy"]
    text = (f"{'Higher' if higher else 'Lower'} is better. Mean ± sd over {seeds} seed(s), "
            f"{t['rounds']} rounds, batch {t['batch_size']}, lr {t['lr']}, clip {t['clip']}, "
            f"δ = {p['delta']:g}; * = best untuned baseline (better of FedAvg and Local), "
            f"(r×) = ratio to it; ':tuning.mode=private' = λ tuned privately, E[h] = 10: "
            f"':tuning.select=random' trials at the full rate (RepeatAndSelect), "
            f"':tuning.select=subsample' on a γ = 0.1 subsample, then one full run; "
            f"their cost counted. {SEEDED}.")
    if uncounted:
        text += (f" '{UNCOUNTED}': MR-MTL's best λ of the thesis grid per ε, chosen on the "
                 "test metric after the fact — its choice is NOT counted (reference only).")
    return text



def plot(path: Path, title: str, cells: dict[str, dict[float, Cell]], rows: list[str],
         metric: str) -> None:
    """metric vs ε, one line per method (error bars: sd over seeds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    # tab10, then tab20's light shades: up to 20 rows without repeating a colour
    colors = list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("tab20").colors[1::2])
    for i, label in enumerate(rows):
        pts = sorted((e, c) for e, c in cells.get(label, {}).items() if c.mean is not None)
        if not pts:
            continue
        style = ":" if label == UNCOUNTED else ("--" if label in BASELINES else "-")
        ax.errorbar([e for e, _ in pts], [c.mean for _, c in pts],
                    yerr=[c.sd or 0 for _, c in pts], ls=style, marker="o", ms=3,
                    capsize=2, label=label, color=colors[i % len(colors)])
    if metric.lower() == "mse":
        ax.set_yscale("log")
    ax.set(xlabel="ε per silo", ylabel=f"test {metric}", title=f"{title}\n{SEEDED}")
    ax.title.set_fontsize(9)
    if ax.lines:
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def mean_by(records: list[dict]) -> dict[str, dict]:
    """Mean job wall and CPU seconds per dataset and method (for sizing a run)."""
    by: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        if r.get("seconds") is not None:
            by.setdefault(f"{r['dataset']} {r['method']}", []).append(
                (r["seconds"], r["cpu_seconds"]))
    return {k: {"mean": statistics.fmean(w for w, _ in v),
                "cpu": statistics.fmean(c for _, c in v), "n": len(v)} for k, v in by.items()}


def print_table(con, title, cap, header, body, notes) -> None:
    from rich.markup import escape  # cells hold brackets ([λ=0.1], E[h])
    from rich.table import Table
    t = Table(title=escape(title), caption=escape(cap), caption_justify="left")
    for h in header:
        t.add_column(h, overflow="fold")
    for r in body:
        t.add_row(*map(escape, r))
    con.print(t)
    for n in notes:
        con.print(f"  n/a in part: {n}", highlight=False, markup=False)
