"""Human-readable output: the terminal tables and the metric-over-rounds plot of a run,
and for sweeps the hyperparameter selection (on validation), the privacy check and the
HTML report (figures in `figures.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Group
from rich.table import Table

from silofl.experiments import figures
from silofl.experiments.notes import CLIP_AUTO_NOTE
from silofl.experiments.quality import TINY_TEST, warnings_of
from silofl.experiments.reference import reference_of
from silofl.experiments.sweep_results import read_results
from silofl.io import json_safe, savefig_atomic, write_json_atomic, write_text_atomic
from silofl.models.metrics import HIGHER_IS_BETTER
from silofl.tuning.selection import eps_label, privacy_check, select_best

#: what the reader of any report must know about the guarantee's scope
ASSUMPTION_TEXT = (
    "Adjacency: per row, add/remove one record within a silo (example-level DP; each silo's "
    "guarantee covers the records in its own data). Silo sizes n_k are treated as public "
    "(they set q = b/n_k, σ, the averaging weights and IFCA's score sensitivity). "
    "Per-round validation and test metrics are computed on held-out rows and are not "
    "privatized.")


def results_table(rep) -> Group:
    """Two tables. The first: method, pooled metric, the baseline it must beat (the best
    constant prediction on the same test rows), for binary tasks balanced accuracy, AUROC
    and AUPRC, and the largest ε any silo spent. The second: worst and best silo, with
    test size and 95% interval (tiny test sets are not ranked). `quality_lines` has the
    warnings to print below them."""
    res = rep.results
    metric = res[0].metric
    higher = HIGHER_IS_BETTER[metric]
    private = rep.config.privacy.enabled
    quality = getattr(rep, "quality", None) or {}
    level = "person" if getattr(rep, "unit", "example") == "person" else "example"
    title = f"private: silo-specific {level}-level DP" if private else "NON-PRIVATE"
    t = Table(title=f"silofl run ({title})")
    q0 = quality.get(rep.label(res[0]))
    extra = _extra_columns(metric, q0)
    cols = ["method", f"pooled\n{metric}"]
    if q0 is not None:
        cols.append(_BASELINE_HEADER.get(metric, "baseline"))
    cols += [name for name, _ in extra]
    for name in cols:
        t.add_column(name, justify="left" if name == "method" else "right")
    if private:
        t.add_column("max ε over\nsilos (this\nmethod)", justify="right")
    s = Table(title=f"per silo: final test {metric} (n = test rows, 95% CI, the silo's "
                    f"{_SILO_BASELINE_NAME.get(metric, 'baseline')})")
    for name in ["method", "worst silo", "best silo"]:
        s.add_column(name, justify="left" if name == "method" else "right")
    silos = res[0].silos
    for r in res:
        vals = np.array(r.final_per_silo, float)
        q = quality.get(rep.label(r))
        row = [rep.label(r), _metric_cell(r.final_pooled)]
        if q0 is not None:
            row.append(_baseline_cell(q))
        row += [_extra_cell(q, key) for _, key in extra]
        if private:
            p = r.privacy()
            row.append(f"{_max_eps(x['epsilon'] for x in p)} ({_kinds(p)})")
        t.add_row(*row)
        s.add_row(rep.label(r), *_worst_best(vals, silos, higher,
                                             q["per_silo"] if q else None, metric))
    # the clip note is long and about privacy: the privacy table's caption and the closing
    # notes carry it, the metrics table does not
    short = [n for n in rep.notes() if not n.startswith(CLIP_AUTO_NOTE[:13])]
    if short:
        t.caption = "; ".join(short)
    if q0 is not None:
        s.caption = ("baselines: the best constant prediction on the same test rows (test-set "
                     "statistics, like the metrics: not privatized)")
    if q0 is not None and q0["tiny_silos"]:
        tiny = [e for e in q0["per_silo"] if e["tiny"]]
        s.caption += (f"; {len(tiny)} silo(s) with fewer than {TINY_TEST} test rows are not "
                      "ranked: " + ", ".join(f"{e['silo']} (n={e['n_test']})"
                                             for e in tiny[:8])
                      + (", …" if len(tiny) > 8 else "") + " (summary.json has every silo)")
    return Group(t, s)


_BASELINE_HEADER = {"accuracy": "majority-\nclass rate", "auprc": "positive\nrate",
                    "roc_auc": "uninform.\nAUROC", "mse": "MSE of\ntest mean"}


def _extra_cell(q: dict | None, key: str) -> str:
    rows = (q or {}).get("all_test_rows", {})
    cell = _metric_cell(rows.get(key))
    if key == "auprc" and rows.get("positive_rate") is not None:  # AUPRC's own baseline
        cell += f"\n(pos. {rows['positive_rate']:.3f})"
    return cell


def _extra_columns(metric: str, q: dict | None) -> list[tuple[str, str]]:
    """Binary tasks: the figures over all test rows beside the configured metric."""
    if q is None or "roc_auc" not in q.get("all_test_rows", {}):
        return []
    out = [] if metric == "accuracy" else [("accuracy\n(all rows)", "accuracy")]
    return out + [("balanced\naccuracy", "balanced_accuracy"), ("AUROC", "roc_auc"),
                  ("AUPRC", "auprc")]


def _baseline_cell(q: dict | None) -> str:
    if q is None:
        return "n/a"
    cell = _metric_cell(q["baseline"]["value"])
    return cell + ("\nNOT BEATEN" if q["warning"] else "")


def baseline_line(rep) -> str | None:
    """The baseline a personalized method must beat: the better of Local and FedAvg.

    Parameters
    ----------
    rep : RunReport

    Returns
    -------
    str or None
        Which of the two it is, its pooled test metric and which other methods are above
        it; a hint to add them where either is missing; None for a job of Local and
        FedAvg alone.
    """
    res = rep.results
    names = [r.method.get("name") for r in res]
    others = [r for r in res if r.method.get("name") not in ("local", "fedavg")]
    if not others:
        return None
    missing = [m for m in ("local", "fedavg") if m not in names]
    if missing:  # name only what the job lacks
        add = " and ".join(f'"{m}"' for m in missing)
        return (f"add {add} to training.methods to see the baseline a personalized "
                "method must beat (the better of local and fedavg)")
    metric = res[0].metric
    higher = HIGHER_IS_BETTER[metric]
    base = [r for r in res if r.method.get("name") in ("local", "fedavg")]
    best = (max if higher else min)(base, key=lambda r: r.final_pooled)
    b = best.final_pooled

    def cell(r) -> str:
        return f"{rep.label(r)} {_metric_cell(r.final_pooled)}"
    above = [r for r in others if (r.final_pooled > b if higher else r.final_pooled < b)]
    not_above = [r for r in others if r not in above]
    return (f"baseline to beat (the better of local and fedavg, pooled test {metric}): "
            f"{cell(best)}; above it: {', '.join(map(cell, above)) or 'none'}; not above: "
            f"{', '.join(map(cell, not_above)) or 'none'} (one run: read a difference "
            "against the per-silo intervals)")


def quality_lines(rep) -> list[str]:
    """The warnings to print below the results table: every method that does not beat
    its baseline (`silofl.experiments.quality`), and the silos dropped by
    [data] min_silo_rows."""
    out = warnings_of(getattr(rep, "quality", None) or {})
    dropped = getattr(rep, "dropped_silos", None) or []
    if dropped:
        out.append(f"{len(dropped)} silo(s) dropped by [data] min_silo_rows (small_silos = "
                   "\"drop\"), not trained or scored: " + ", ".join(
                       f"{d['silo']} ({d['n_train']} train / {d['n_test']} test rows)"
                       for d in dropped))
    return out


def _metric_cell(x) -> str:
    """A metric, or why there is none: inf = diverged, NaN = undefined (e.g. no test rows)."""
    if x is None or np.isnan(x):
        return "n/a"
    if not np.isfinite(x):
        return "inf (diverged)"
    return f"{x:.4f}" if abs(x) < 1e6 else f"{x:.4g}"  # a near-diverged MSE stays readable


def _silo_cell(v: float, silo: str, entry: dict | None, metric: str = "") -> str:
    """`v silo`, with the silo's test size and 95% interval where known."""
    cell = f"{_metric_cell(v)} {silo}"
    if entry is None:
        return cell
    ci = entry.get("ci95")
    extra = f"n={entry['n_test']}" + (f", {_short(ci[0])}–{_short(ci[1])}" if ci else "")
    base = entry.get("baseline")
    if base is not None and np.isfinite(base):  # the silo's own bar (majority rate, …)
        extra += f", {_SILO_BASELINE.get(metric, 'base')} {_short(base)}"
    return f"{cell}\n{extra}{', TINY' if entry['tiny'] else ''}"


def _short(x: float) -> str:
    return f"{x:.2f}" if abs(x) < 1e4 else f"{x:.2g}"


_SILO_BASELINE = {"accuracy": "maj.", "auprc": "pos.", "roc_auc": "base", "mse": "var."}
_SILO_BASELINE_NAME = {"accuracy": "majority-class rate (maj.)", "auprc": "positive rate",
                       "roc_auc": "uninformative AUROC", "mse": "test-label variance (var.)"}


def _worst_best(vals: np.ndarray, silos, higher: bool, per: list[dict] | None = None,
                metric: str = "") -> list[str]:
    """Worst and best silo; a silo whose metric is non-finite is the worst (never hidden).
    With `per` (the per-silo assessment) cells carry test size and interval, and silos
    with tiny test sets are ranked only when every silo's is tiny."""
    bad = ~np.isfinite(vals)
    rank = ~bad
    if per is not None and (rank & ~np.array([e["tiny"] for e in per])).any():
        rank &= ~np.array([e["tiny"] for e in per])
    ok = np.flatnonzero(rank)

    def cell(k):
        return _silo_cell(vals[k], silos[k], per[k] if per is not None else None, metric)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        worst = cell(k) + (f" (+{int(bad.sum()) - 1})" if bad.sum() > 1 else "")
    elif ok.size:
        worst = cell(ok[np.argmin(vals[ok])] if higher else ok[np.argmax(vals[ok])])
    if not ok.size:
        return [worst, "n/a"]
    return [worst, cell(ok[np.argmax(vals[ok])] if higher else ok[np.argmin(vals[ok])])]


def _kinds(entries) -> str:
    return "/".join(sorted({x["accountant"] for x in entries}))


def privacy_table(rep, max_rows: int = 30) -> Table | None:
    """Per silo: this job's target and σ (one σ for all methods, calibrated for their
    composition), ε spent by the whole job, and the silo's lifetime budget after it."""
    if not rep.config.privacy.enabled:
        return None
    priv = [r.privacy() for r in rep.results]
    how = priv[0][0].get("calibrated_for", "") if priv[0] else ""
    per = "per person" if getattr(rep, "unit", "example") == "person" else "per row"
    t = Table(title=f"privacy per silo, ε {per} (σ calibrated for {how}; ε at the silo's δ)")
    # n is what q = b/n counts: training persons at the person unit, training rows otherwise
    n_label = "n persons" if per == "per person" else "n"
    for name in ["silo", n_label, "job target ε, δ", "σ", "job ε spent", "lifetime ε spent / "
                 "target"]:
        t.add_column(name, justify="left" if name == "silo" else "right")
    life = {x["silo"]: x for x in rep.lifetime}
    for k, silo in enumerate(rep.results[0].silos[:max_rows]):
        p0, c = priv[0][k], rep.combined_privacy[k]
        lt = life.get(silo)
        t.add_row(silo, str(p0.get("n_persons", p0.get("n_train"))),
                  f"{p0['target_epsilon']:g}, {p0['delta']:g}",
                  f"{p0['noise_multiplier']:.3g}" if p0["noise_multiplier"] is not None
                  # local-DP methods (privatekt, fedavg_ldp): no σ; the rounds it uploaded in
                  else f"LDP, {len(rep.results[0].ledgers[k].entries)} rounds",
                  f"{c['epsilon']:.3f} ({c['accountant']})",
                  f"{lt['epsilon']:.3f} / {lt['target_epsilon']:g}" if lt else "-")
    if rep.results[0].silos[max_rows:]:
        t.caption = f"… {len(rep.results[0].silos) - max_rows} more silos in privacy_report.json"
    clips = clip_note(priv[0][:max_rows], rep.label(rep.results[0]), len(rep.results))
    if clips:
        t.caption = f"{t.caption}; {clips}" if t.caption else clips
    return t


def clip_note(entries: list[dict], method: str = "", methods: int = 1) -> str:
    """clip = "auto": each silo's count noise σ_b, gradient noise σ_Δ and final clip C_k
    (from the plans of `method`, the first of `methods`; each method tracks its own)."""
    auto = [e for e in entries if e.get("clip") == "auto"]
    if not auto:
        return ""
    whose = f"{method}'s " if method else ""
    rest = "; other methods' in privacy_report.json" if methods > 1 else ""
    return (f"clip: auto (each step also released a noisy count of unclipped examples, "
            f"composed into σ); per silo the count noise σ_b, the gradient noise σ_Δ and "
            f"{whose}final C_k: "
            + "; ".join(f"{e['silo']} σ_b {e['count_noise']:.3g}, "
                        f"σ_Δ {e['gradient_noise_multiplier']:.3g}, C {e['final_clip']:.3g}"
                        for e in auto if e.get("final_clip") is not None) + rest)


def _max_eps(values) -> str:
    """Largest ε to 3 decimals; "n/a" where an accountant does not support a method's
    events (PLD has no zCDP, used by private cluster selection)."""
    values = list(values)
    return "n/a" if any(v is None for v in values) else f"{max(values):.3f}"


def history_lines(rep) -> list[dict]:
    """The lines of `metric_over_rounds.png`: per method its pooled test metric, and where
    recorded (public built-in data only) its non-private reference, dashed."""
    lines = []
    for r in rep.results:
        label = rep.label(r)
        lines.append({"label": label, "method": label, "rounds": list(r.history.rounds),
                      "values": list(r.history.pooled), "style": "-", "reference": False})
        ref = reference_of(r)
        if ref is not None:
            lines.append({"label": f"{label}, no DP (public data)", "method": label,
                          "rounds": list(r.history.rounds), "values": list(ref["pooled"]),
                          "style": "--", "reference": True})
    return lines


def plot_history(rep, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    color, lines = {}, history_lines(rep)
    for line in lines:
        m = line["method"]  # a reference shares its method's colour
        (h,) = ax.plot(line["rounds"], line["values"], line["style"], label=line["label"],
                       color=color.get(m), alpha=0.6 if line["reference"] else 1.0)
        color.setdefault(m, h.get_color())
    ax.set_xlabel("round")
    ax.set_ylabel(f"pooled test {rep.results[0].metric} (weighted by test counts)")
    kind = "private" if rep.config.privacy.enabled else "non-private"
    dashed = any(x["reference"] for x in lines)
    ax.set_title(f"{rep.config.data.source}: {kind}" + (
        "\n(dashed: the same method without DP; public data only)" if dashed else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    savefig_atomic(fig, path, dpi=120)
    plt.close(fig)


#: FLamby's published Fed-Heart-Disease figures (du Terrail et al., "FLamby: Datasets and
#: Benchmarks for Cross-Silo Federated Learning in Realistic Healthcare Settings", NeurIPS
#: 2022 Datasets & Benchmarks): FedAvg's mean per-hospital test accuracy
FLAMBY_HEART = {"dp_fedavg": 0.685, "epsilon": 1.0, "delta": 1e-4, "fedavg": 0.712}


def mean_per_silo(values) -> float:
    """Unweighted mean over silos (FLamby's "mean per-hospital" figure); NaN if none."""
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    return float(v.mean()) if v.size else float("nan")


def lam_text(lam: float | str | None) -> str:
    """λ as a table cell: "—" (the method has none), "auto" or the number."""
    return "—" if lam is None else str(lam) if isinstance(lam, str) else f"{lam:g}"


def flamby_comparison(rep) -> str | None:
    """Where the methods stand against FLamby's Fed-Heart-Disease figures, like with like
    (mean per-hospital accuracy); None unless the run is on the built-in heart data."""
    if rep.config.data.source != "heart" or rep.results[0].metric != "accuracy":
        return None
    f, p = FLAMBY_HEART, rep.config.privacy
    ours = ", ".join(f"{rep.label(r)} {_metric_cell(mean_per_silo(r.final_per_silo))}"
                     for r in rep.results)
    if p.enabled:
        target = f"ε = {p.epsilon:g}, δ = {p.delta:g}" + (
            " (with per-silo overrides)" if p.silos else "")
        here = f"Here at {target} for all {len(rep.results)} methods composed: {ours}"
    else:
        here = f"Here without DP: {ours}"
    refs = [(r, reference_of(r)) for r in rep.results]
    if all(ref is not None for _, ref in refs):
        here += "; without DP (public-data reference): " + ", ".join(
            f"{rep.label(r)} {_metric_cell(mean_per_silo(ref['per_silo'][-1]))}"
            for r, ref in refs)
    return (f"FLamby Fed-Heart-Disease (du Terrail et al., NeurIPS 2022 Datasets & "
            f"Benchmarks), mean per-hospital test accuracy: DP-FedAvg {f['dp_fedavg']:.3f} "
            f"at ε = {f['epsilon']:g}, δ = {f['delta']:g}; FedAvg without DP "
            f"{f['fedavg']:.3f}. {here} (unweighted mean over the {len(rep.results[0].silos)} "
            "hospitals). The setups differ: FLamby's train/test split, model, training "
            "schedule and ε accounting may differ from ours, and here one ε per hospital "
            "covers all methods of the job together, so this is a rough placement, not a "
            "head-to-head result.")


# --- sweeps: the selection table and the HTML report (selection in selection.py) -----------

def _fmt(x, digits=4) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x:.{digits}g}"


def selection_table(head: dict, rows: list[dict]) -> Table:
    metric = head["metric"]
    better = "higher" if head["higher_is_better"] else "lower"
    t = Table(title=f"best hyperparameters by validation {metric} ({better} is better); "
                    f"test {metric} mean ± std over seeds")
    for c in ["method", "ε", "λ*", "lr*", f"val {metric}", f"test {metric}", "seeds",
              "max ε spent"]:
        t.add_column(c, justify="left" if c == "method" else "right")
    for r in rows:
        t.add_row(r["method"], eps_label(r["epsilon"]),
                  lam_text(r["lam"]), f"{r['lr']:g}",
                  _fmt(r["validation_mean"]),
                  f"{_fmt(r['test_mean'])} ± {_fmt(r['test_std'], 2)}", str(len(r["seeds"])),
                  "—" if r["max_epsilon_spent"] is None else f"{r['max_epsilon_spent']:.3f}")
    return t


def write_report(results: Path, out_dir: Path, epsilon: float | None = None) -> dict:
    """Write a sweep's report: an HTML page, PNG figures and summary.json.

    Parameters
    ----------
    results : Path
        A sweep's JSON-lines results file (`run_sweep`'s ``outcome.results``).
    out_dir : Path
        The folder written (created if needed).
    epsilon : float, optional
        The Îµ of the fixed-Îµ figures (default: the results header's report Îµ).

    Returns
    -------
    dict
        The summary (what summary.json holds).
    """
    head, records = read_results(results)
    feps = figures.figure_epsilon(head, epsilon)  # bad input: fail before writing anything
    figures.check_out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = select_best(head, records)
    check = privacy_check(head, records)
    made = figures.make_figures(head, records, out_dir, feps)
    over = [c for c in check if c["over_target"]]
    summary = {"results": str(results), "fingerprint": head["fingerprint"],
               "metric": head["metric"], "higher_is_better": head["higher_is_better"],
               "runs_recorded": len(records), "runs_in_grid": head["total_runs"],
               "figure_epsilon": feps,
               "selection": rows, "privacy_check": check, "over_target": over,
               "figures": {k: (str(v) if v else None) for k, v in made.figures.items()},
               "figure_notes": made.notes, "not_counted": head["not_counted"],
               "notes": head.get("notes", []), "assumptions": ASSUMPTION_TEXT,
               "dropped_silos": head["dropped_silos"]}
    nonfinite: list[str] = []
    json_safe(summary, nonfinite)
    summary["nonfinite"] = nonfinite  # written as null: these metrics diverged or are undefined
    write_json_atomic(out_dir / "summary.json", summary, indent=1)

    write_text_atomic(out_dir / "report.html", _report_html(head, records, rows, check, over,
                                                            made))
    return summary

def _report_html(head: dict, records: list[dict], rows: list[dict], check: list[dict],
                 over: list[dict], made) -> str:
    """report.html: the notes, every figure embedded, the selection and privacy tables."""
    import base64
    import html

    e = html.escape
    metric = e(head["metric"])
    css = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
           "table{border-collapse:collapse;margin:1em 0}"
           "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
           "td:first-child,th:first-child{text-align:left}.over{background:#f8c0c0}"
           ".note{background:#fff4d6;padding:.8em;border-left:4px solid #e0a000}")
    first, _, rest = head["not_counted"].partition(". ")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>silofl sweep "
             f"{e(head['fingerprint'])}</title><style>{css}</style></head><body>",
             f"<h1>Privacy-utility sweep</h1><p>Data: {e(str(head['config']['data']['source']))}"
             f", {len(head['silos'])} silos ({len(head['dropped_silos'])} dropped by "
             f"min_silo_train), metric: pooled {metric} (weighted by counts; "
             f"{'higher' if head['higher_is_better'] else 'lower'} is better). "
             f"{len(records)} of {head['total_runs']} runs recorded. Fingerprint "
             f"<code>{e(head['fingerprint'])}</code>.</p>",
             f"<p class='note'><b>{e(first)}.</b> {e(rest)}</p>"]
    for note in head.get("notes", []):  # scratch store, seeded noise, uncharged items
        parts.append(f"<p class='note'><b>{e(note)}</b></p>")
    parts.append(f"<p>{e(ASSUMPTION_TEXT)}</p>")
    if head["dropped_silos"]:  # which silos the results do not cover
        listed = ", ".join(f"{d['silo']} ({d['n_train']} training rows)"
                           for d in head["dropped_silos"])
        parts.append(f"<p>Silos left out by sweep.min_silo_train: {e(listed)}.</p>")
    if over:
        parts.append(f"<p class='note over'><b>{len(over)} silo×ε entries spent more than "
                     "their target</b> — see the privacy table.</p>")
    for name, title in figures.TITLES.items():
        path = made.figures.get(name)
        if path:
            b64 = base64.b64encode(Path(path).read_bytes()).decode()
            parts.append(f"<h2>{e(title)}</h2><img alt='{e(name)}' style='max-width:100%' "
                         f"src='data:image/png;base64,{b64}'>")
            if name in made.notes:
                parts.append(f"<p>Note: {e(made.notes[name])}</p>")
        else:
            parts.append(f"<h2>{e(title)}</h2><p>Not drawn: {e(made.notes.get(name, ''))}</p>")
    parts += _selection_html(rows, metric)
    parts.append(_privacy_html(head, check))
    parts.append("</body></html>")
    return "\n".join(parts)


def _selection_html(rows: list[dict], metric: str) -> list[str]:
    """The best hyperparameters per (method, ε), chosen on validation, with their test score."""
    import html
    e = html.escape
    out = [f"<h2>Best hyperparameters (chosen on validation) and test {metric}</h2>"
           "<table><tr><th>method</th><th>ε</th><th>λ*</th><th>lr*</th>"
           f"<th>validation {metric}</th><th>test {metric} (mean ± std)</th>"
           "<th>seeds</th><th>candidates</th><th>max ε spent</th></tr>"]
    for r in rows:
        lam = lam_text(r["lam"])
        spent = "—" if r["max_epsilon_spent"] is None else f"{r['max_epsilon_spent']:.3f}"
        out.append(
            f"<tr><td>{e(r['method'])}</td><td>{eps_label(r['epsilon'])}</td><td>{lam}</td>"
            f"<td>{r['lr']:g}</td><td>{_fmt(r['validation_mean'])}</td>"
            f"<td>{_fmt(r['test_mean'])} ± {_fmt(r['test_std'], 2)}</td>"
            f"<td>{len(r['seeds'])}</td><td>{r['candidates']}</td><td>{spent}</td></tr>")
    out.append("</table>")
    return out


def _privacy_html(head: dict, check: list[dict]) -> str:
    """Rows: silos; columns: swept ε; cells: largest ε spent / target (red when over)."""
    import html
    if not check:
        return "<h2>Privacy</h2><p>No private runs recorded.</p>"
    eps = sorted({c["epsilon"] for c in check})
    cell = {(c["silo"], c["epsilon"]): c for c in check}
    acc = html.escape("/".join(sorted({c["accountant"] for c in check})).upper())
    out = [f"<h2>Privacy: largest ε spent per silo over all its runs ({acc}, at the silo's "
           "δ) vs target</h2><p>Read from each run's privacy ledgers. Each run is charged "
           "separately; the cost of running all of them on the same data is not composed "
           "here (see the note above).</p><table><tr><th>silo</th>"
           + "".join(f"<th>ε = {x:g}</th>" for x in eps) + "</tr>"]
    for silo in head["silos"]:
        tds = []
        for x in eps:
            c = cell.get((silo, x))
            if c is None:
                tds.append("<td>—</td>")
                continue
            cls = " class='over'" if c["over_target"] else ""
            flag = " OVER TARGET" if c["over_target"] else ""
            tds.append(f"<td{cls}>{c['max_epsilon_spent']:.4f} / {c['target_epsilon']:g}"
                       f"{flag}</td>")
        out.append(f"<tr><td>{html.escape(silo)}</td>{''.join(tds)}</tr>")
    out.append("</table>")
    return "".join(out)
