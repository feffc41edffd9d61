"""Human-readable output: the terminal table and the metric-over-rounds plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.table import Table

from silofl.models.metrics import HIGHER_IS_BETTER


def results_table(rep) -> Table:
    """Method, pooled metric, worst and best silo, and the largest ε any silo spent."""
    res = rep.results
    metric = res[0].metric
    higher = HIGHER_IS_BETTER[metric]
    private = rep.config.privacy.enabled
    title = "private: silo-specific example-level DP" if private else "NON-PRIVATE"
    t = Table(title=f"silofl run ({title})")
    for name in ["method", f"pooled {metric}", "worst silo", "best silo"]:
        t.add_column(name, justify="left" if name == "method" else "right")
    if private:
        t.add_column("max ε over silos\nRDP / PLD", justify="right")
    silos = res[0].silos
    for r in res:
        vals = np.array(r.final_per_silo, float)
        pick = (np.nanargmin, np.nanargmax) if higher else (np.nanargmax, np.nanargmin)
        w, b = pick[0](vals), pick[1](vals)
        row = [rep.label(r), f"{r.final_pooled:.4f}", f"{vals[w]:.4f} {silos[w]}",
               f"{vals[b]:.4f} {silos[b]}"]
        if private:
            p = r.privacy()
            row.append(f"{max(x['epsilon_rdp'] for x in p):.3f} / "
                       f"{max(x['epsilon_pld'] for x in p):.3f}")
        t.add_row(*row)
    return t


def privacy_table(rep, max_rows: int = 30) -> Table | None:
    """Per silo: its target, calibrated σ, and ε spent (RDP / PLD) by each method."""
    if not rep.config.privacy.enabled:
        return None
    t = Table(title="privacy per silo (ε spent at the silo's δ)")
    for name in ["silo", "n", "target ε, δ", "σ"]:
        t.add_column(name, justify="left" if name == "silo" else "right")
    for r in rep.results:
        t.add_column(f"{rep.label(r)}\nRDP / PLD", justify="right")
    priv = [r.privacy() for r in rep.results]
    for k, silo in enumerate(rep.results[0].silos[:max_rows]):
        p0 = priv[0][k]
        t.add_row(silo, str(p0["n_train"]), f"{p0['target_epsilon']:g}, {p0['delta']:g}",
                  f"{p0['noise_multiplier']:.3g}",
                  *[f"{p[k]['epsilon_rdp']:.3f} / {p[k]['epsilon_pld']:.3f}" for p in priv])
    return t


def plot_history(rep, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in rep.results:
        ax.plot(r.history.rounds, r.history.pooled, label=rep.label(r))
    ax.set_xlabel("round")
    ax.set_ylabel(f"pooled test {rep.results[0].metric} (weighted by test counts)")
    kind = "private" if rep.config.privacy.enabled else "non-private"
    ax.set_title(f"{rep.config.data.source}: {kind}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
