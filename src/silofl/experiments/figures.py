"""Figures of a sweep (matplotlib PNGs), after the thesis's Figs. 1.3, 1.5 and 1.2:

(a) privacy_utility.png — ε vs pooled test metric (mean ± std over seeds) of each
    method at its validation-chosen (λ, lr); dashed lines: the same method without DP.
(b) mrmtl_lambda.png — MR-MTL's pooled test metric vs λ at one ε (lr chosen on validation
    per λ), with and without DP; Local and FedAvg at the same ε as reference lines.
(c) over_rounds.png — Finetune vs FedAvg vs Local: pooled test metric over rounds at one ε.

Each function returns False (and draws nothing) when the results hold nothing to plot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from silofl.errors import ConfigError
from silofl.io import savefig_atomic
from silofl.tuning.selection import curve_over_rounds, lambda_curve, select_best

TITLES = {"privacy_utility": "(a) Privacy-utility trade-off",
          "mrmtl_lambda": "(b) MR-MTL: test utility vs λ, with and without DP",
          "over_rounds": "(c) Finetune vs FedAvg vs Local over rounds"}
ROUNDS_METHODS = ("finetune", "fedavg", "local")


@dataclass
class Figures:
    figures: dict = field(default_factory=dict)  # name -> Path or None
    notes: dict = field(default_factory=dict)    # name -> why it was not drawn


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _ylabel(head: dict) -> str:
    better = "higher" if head["higher_is_better"] else "lower"
    return f"pooled test {head['metric']} ({better} is better)"


def _colors(methods) -> dict:
    cmap = _plt().get_cmap("tab10")
    return {m: cmap(i % 10) for i, m in enumerate(methods)}


def _finish(fig, ax, head: dict, title: str, path: Path) -> None:
    """The shared ending of every figure: metric axis label, title, grid, legend, save."""
    ax.set_ylabel(_ylabel(head))
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    savefig_atomic(fig, path, dpi=120)
    _plt().close(fig)


def alpha_lines(ax, rounds, alpha: np.ndarray, silos: list[str], user: str) -> None:
    """Weight Erosion's weights on `ax`: α (R, K) over `rounds` (R,), one line per silo, the
    user's solid and thick, the others dotted; NaN (a silo not yet joined) leaves a gap.
    Legend entries for every silo up to 12 silos, else for the user only."""
    many = len(silos) > 12
    for k, s in enumerate(silos):
        me = s == user
        ax.plot(rounds, alpha[:, k], "-" if me else ":", lw=2.5 if me else 1.5,
                zorder=3 if me else 2, color="black" if me else None,
                label=f"α {s} (user)" if me else (None if many else f"α {s}"))
    ax.set_ylabel("weight α_i")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=7, ncol=min(4, len(silos)))


def alpha_over_rounds(rounds, alpha: np.ndarray, silos: list[str], user: str, title: str,
                      path: Path) -> None:
    """`alpha_lines` as a figure of its own (`silofl run`'s alpha_over_rounds.png)."""
    fig, ax = _plt().subplots(figsize=(7, 4))
    alpha_lines(ax, rounds, alpha, silos, user)
    ax.set_xlabel("round")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    _save(fig, path)


def privacy_utility(head: dict, records: list[dict], path: Path) -> bool:
    rows = select_best(head, records)
    if not rows:
        return False
    plt = _plt()
    methods = head["config"]["sweep"]["methods"]
    color = _colors(methods)
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    any_np = False
    for m in methods:
        pts = sorted((r["epsilon"], r["test_mean"], r["test_std"]) for r in rows
                     if r["method"] == m and r["epsilon"] is not None)
        if pts:
            x, y, s = map(np.array, zip(*pts))
            ax.errorbar(x, y, yerr=s, marker="o", ms=4, capsize=3, color=color[m], label=m)
        ref = [r for r in rows if r["method"] == m and r["epsilon"] is None]
        if ref and np.isfinite(ref[0]["test_mean"]):
            ax.axhline(ref[0]["test_mean"], ls="--", lw=1, color=color[m], alpha=0.7)
            any_np = True
    if any_np:
        ax.plot([], [], ls="--", color="grey", label="non-private (same colour)")
    ax.set_xlabel("per-silo privacy budget ε (same for every silo)")
    _finish(fig, ax, head, f"{head['config']['data']['source']}: ε vs test {head['metric']} "
            "(mean ± std over seeds; λ, lr chosen on validation)", path)
    return True


def mrmtl_lambda(head: dict, records: list[dict], path: Path, epsilon: float,
                 method: str = "mrmtl") -> bool:
    higher = head["higher_is_better"]
    private = lambda_curve(records, method, epsilon, higher)
    nonprivate = lambda_curve(records, method, None, higher)
    if not private and not nonprivate:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    lams = [p["lam"] for p in private + nonprivate]
    for curve, style, label in ((private, "-", f"{method}, DP ε = {epsilon:g}"),
                                (nonprivate, "--", f"{method}, non-private")):
        if curve:
            x = np.array([p["lam"] for p in curve])
            y = np.array([p["test_mean"] for p in curve])
            s = np.array([p["test_std"] for p in curve])
            ax.plot(x, y, style, marker="o", ms=4, color="C2", label=label)
            ax.fill_between(x, y - s, y + s, color="C2", alpha=0.15)
    rows = {(r["method"], r["epsilon"]): r for r in select_best(head, records)}
    for m, c in (("local", "C0"), ("fedavg", "C1")):
        for e, style in ((epsilon, "-"), (None, "--")):
            r = rows.get((m, e))
            if r and np.isfinite(r["test_mean"]):
                kind = f"ε = {epsilon:g}" if e is not None else "non-private"
                ax.axhline(r["test_mean"], ls=style, lw=1, color=c, alpha=0.8,
                           label=f"{m} ({kind})")
    if min(lams) == 0:
        ax.set_xscale("symlog", linthresh=min([v for v in lams if v > 0] or [1e-4]))
    else:
        ax.set_xscale("log")
    ax.set_xlabel("λ (mean-regularization strength; 0 = local training)")
    _finish(fig, ax, head, f"{method}: test {head['metric']} vs λ (lr chosen on validation "
            "per λ; mean ± std over seeds)", path)
    return True


def over_rounds(head: dict, records: list[dict], path: Path, epsilon: float,
                methods=ROUNDS_METHODS) -> bool:
    higher = head["higher_is_better"]
    curves = {m: curve_over_rounds(records, m, epsilon, higher) for m in methods}
    curves = {m: c for m, c in curves.items() if c is not None}
    if not curves:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    color = _colors(head["config"]["sweep"]["methods"])
    for m, c in curves.items():
        x = np.array(c["rounds"])
        ax.plot(x, c["mean"], color=color.get(m), label=f"{m} (lr {c['lr']:g})")
        ax.fill_between(x, c["mean"] - c["std"], c["mean"] + c["std"], color=color.get(m),
                        alpha=0.15)
    ax.set_xlabel("round")
    _finish(fig, ax, head, f"pooled test {head['metric']} over rounds at ε = {epsilon:g} "
            "(mean ± std over seeds)", path)
    return True


def figure_epsilon(head: dict, epsilon: float | None = None) -> float:
    """ε of figures (b) and (c): `epsilon` if given (must be a swept value), else the
    header's report ε ([report] epsilon or the middle of the grid)."""
    if epsilon is None:
        return head["report_epsilon"]
    swept = head["config"]["sweep"]["epsilon"]
    if float(epsilon) not in swept:
        raise ConfigError(f"--epsilon {epsilon:g} was not swept; choose one of "
                          f"{', '.join(f'{e:g}' for e in swept)}")
    return float(epsilon)


def check_out_dir(out_dir: Path, what: str = "--out") -> None:
    """An output directory must be a directory (or not exist yet): refuse a file."""
    p = Path(out_dir)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{what} {str(p)!r} is a file, not a directory; name a directory "
                          "(it is created if missing)")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{what} {str(p)!r}: {str(parent)!r} is a file, not a "
                                  "directory; name a directory")
            break


def make_figures(head: dict, records: list[dict], out_dir: Path,
                 epsilon: float | None = None) -> Figures:
    """Draw (a), (b), (c) into `out_dir`; say why any was not drawn. (b) and (c) use
    `figure_epsilon(head, epsilon)`."""
    out_dir = Path(out_dir)
    eps = figure_epsilon(head, epsilon)  # bad input: fail before writing anything
    check_out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    methods = head["config"]["sweep"]["methods"]
    made = Figures()
    jobs = {"privacy_utility": (lambda p: privacy_utility(head, records, p),
                                "no runs recorded yet"),
            "mrmtl_lambda": (lambda p: mrmtl_lambda(head, records, p, eps),
                             "mrmtl is not in sweep.methods" if "mrmtl" not in methods else
                             f"no mrmtl runs at ε = {eps:g} recorded yet"),
            "over_rounds": (lambda p: over_rounds(head, records, p, eps),
                            f"none of {', '.join(ROUNDS_METHODS)} has runs at ε = {eps:g}")}
    for name, (draw, why) in jobs.items():
        path = out_dir / f"{name}.png"
        if draw(path):
            made.figures[name] = path
        else:
            made.figures[name] = None
            made.notes[name] = why
    missing = [m for m in ROUNDS_METHODS if m not in methods]
    if made.figures["over_rounds"] and missing:
        made.notes["over_rounds"] = f"not in this sweep: {', '.join(missing)}"
    return made
