"""An audit's outputs: a rich table for the terminal, audit.json and an HTML panel."""

from __future__ import annotations

import html
from pathlib import Path

from rich.table import Table

from silofl.audit.bounds import GDP_ASSUMPTION
from silofl.audit.engine import LOWER_BOUND_NOTE
from silofl.io import json_safe, write_json_atomic, write_text_atomic


def audit_table(rep) -> Table:
    """Per silo: claimed ε beside the empirical lower bound, violations flagged."""
    t = Table(title=f"Privacy audit ({rep.kind}, {rep.confidence:.0%} family-wise "
                    "confidence): claimed ε vs empirical lower bound")
    for c in ("silo", "claimed ε", "δ", "lower bound", "verdict", "if Gaussian†", "how"):
        t.add_column(c, justify="left" if c in ("silo", "verdict", "how") else "right")
    for r in rep.rows:
        verdict = "[bold red]VIOLATION[/]" if r.violation else "[green]consistent[/]"
        t.add_row(r.silo, f"{r.claimed_epsilon:.3f}", f"{r.delta:.0e}",
                  f"{r.lower_bound:.3f}", verdict, _gdp(r.details), _how(rep.kind, r.details))
    if rep.kind == "one-run":
        t.caption = f"† f-DP refinement: ε refuted for a Gaussian tradeoff curve; {GDP_ASSUMPTION}"
    return t


def _gdp(d: dict) -> str:
    """The f-DP (Gaussian) bound of a one-run audit, '—' where there is none."""
    g = d.get("gdp")
    return "—" if g is None else f"{g['epsilon']:.3f}"


def _how(kind: str, d: dict) -> str:
    if kind == "one-run":
        return (f"m={d['canaries']} ({d['included']} in), {d['score']}: "
                f"{d['correct']}/{d['guesses']} right")
    return f"{d['runs']}+{d['runs']} runs, {d['statistic']}"


def write_audit(rep, out_dir: Path) -> list[Path]:
    """Write an audit's report files.

    Parameters
    ----------
    rep : AuditReport
        From `run_audit`.
    out_dir : Path
        The folder written (created if needed).

    Returns
    -------
    list of Path
        audit.json (strict JSON, written atomically) and audit.html (the audit panel).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nonfinite: list[str] = []
    data = json_safe(rep.to_dict(), nonfinite)
    write_json_atomic(out_dir / "audit.json", dict(data, nonfinite=nonfinite), indent=1)
    write_text_atomic(out_dir / "audit.html", audit_html(rep))
    return [out_dir / "audit.json", out_dir / "audit.html"]


def audit_html(rep) -> str:
    """A self-contained HTML page holding the audit panel."""
    e = html.escape
    rows = "".join(
        f"<tr class='{'bad' if r.violation else 'ok'}'><td>{e(r.silo)}</td>"
        f"<td>{r.claimed_epsilon:.3f}</td><td>{r.delta:.0e}</td><td>{r.lower_bound:.3f}</td>"
        f"<td>{'VIOLATION' if r.violation else 'consistent'}</td><td>{_gdp(r.details)}</td>"
        f"<td>{e(_how(rep.kind, r.details))}</td></tr>" for r in rep.rows)
    gdp_note = ("<p>† f-DP refinement: the ε refuted for a Gaussian tradeoff curve; "
                f"{e(GDP_ASSUMPTION)}.</p>" if rep.kind == "one-run" else "")
    notes = "".join(f"<li>{e(n)}</li>" for n in rep.notes)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>silofl audit</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child,
td:last-child{{text-align:left}}tr.bad{{background:#fdd}}tr.ok{{background:#efe}}</style>
</head><body><section id="audit"><h2>Audit: claimed ε vs empirical lower bound</h2>
<p>{e(rep.kind)} audit at {rep.confidence:.0%} confidence; methods: {e(', '.join(rep.methods))};
noise: {e(rep.noise)}; budget store: {e(rep.store or 'scratch (in memory)')}.</p>
<table><tr><th>silo</th><th>claimed ε</th><th>δ</th><th>lower bound</th><th>verdict</th>
<th>if Gaussian†</th><th>how</th></tr>{rows}</table>{gdp_note}
<p><b>What this means:</b> {e(LOWER_BOUND_NOTE)}.</p><ul>{notes}</ul></section>
</body></html>
"""
