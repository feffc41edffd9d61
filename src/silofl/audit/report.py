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
    if getattr(rep, "view", "model") == "server":
        return server_table(rep)
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
    elif any("estimate" in r.details for r in rep.rows):  # the last-iterate audit
        t.caption = ("† estimate, lower end – point: μ̂ of the canary's score read as μ-GDP; "
                     "assumes Gaussian scores; flagged when its lower end exceeds the claim")
    return t


def server_table(rep) -> Table:
    """The server-view audit: rigorous bound, the estimate (lower end – point), and the
    smallest true ε the estimate detects at these settings."""
    t = Table(title=f"Privacy audit, server view (white box, {rep.kind}, "
                    f"{rep.confidence:.0%} family-wise confidence): claimed ε vs what an "
                    "attacker who sees every round's update can prove and estimate")
    for c in ("silo", "claimed ε", "δ", "rigorous bound", "estimate‡ (95% low – point)",
              "detects true ε ≥", "verdict", "how"):
        t.add_column(c, justify="left" if c in ("silo", "verdict", "how") else "right")
    for r in rep.rows:
        d = r.details
        verdict = "[bold red]VIOLATION[/]" if r.violation else "[green]consistent[/]"
        e = d["estimate"]
        t.add_row(r.silo, f"{r.claimed_epsilon:.3f}", f"{r.delta:.0e}",
                  f"{r.lower_bound:.3f}", f"{_f(e['epsilon_lower'])} – {_f(e['epsilon'])}",
                  _f(d["detectable_epsilon"]), verdict, _how_server(d))
    t.caption = ("rigorous: the larger of the one-run (ε, δ) bound and the pooled-canary "
                 "Clopper–Pearson bound. ‡ " + SERVER_ESTIMATE_NOTE)
    return t


SERVER_ESTIMATE_NOTE = ("estimate, not proof: the canaries' score read through the claimed "
                        "mechanism family (Poisson-subsampled Gaussian, the claimed q and "
                        "steps); flagged when its lower end exceeds the claim. 'detects': the "
                        "smallest true ε this audit flags with the stated confidence")


def _f(x) -> str:
    return "—" if x is None else ("∞" if x == float("inf") else f"{x:.3f}")


def _how_server(d: dict) -> str:
    return (f"m={d['canaries']} ({d['included']} in), {d['passes']} passes, "
            f"{d['steps']} steps; one-run f-DP† {d['one_run']['gdp']['epsilon']:.2f}")


def _gdp(d: dict) -> str:
    """The f-DP (Gaussian) bound of a one-run audit; the estimate (lower end – point,
    assumes Gaussian scores) of a last-iterate audit (`audit.lastiter`); else '—'."""
    g, e = d.get("gdp"), d.get("estimate")
    if g is None and e is not None:
        return f"{_f(e['epsilon_lower'])} – {_f(e['epsilon'])} ({e.get('score', '')})"
    return "—" if g is None else f"{g['epsilon']:.3f}"


def _how(kind: str, d: dict) -> str:
    if kind == "one-run":
        return (f"m={d['canaries']} ({d['included']} in), {d['score']}: "
                f"{d['correct']}/{d['guesses']} right")
    return f"{d['runs']}+{d['runs']} runs, {d['statistic']}"


def _extra(r, server: bool) -> str:
    if not server:
        return _gdp(r.details)
    d = r.details
    return (f"{_f(d['estimate']['epsilon_lower'])} – {_f(d['estimate']['epsilon'])}; "
            f"{_f(d['detectable_epsilon'])}")


def selftest_table(rep) -> Table:
    """`--self-test`: each mechanism's true ε beside what the audit said."""
    t = Table(title=f"Audit self-test (server view, one run each, {rep.confidence:.0%} "
                    f"confidence, m = {rep.canaries} canaries per silo): weakened copies of "
                    "this job's mechanism")
    for c in ("mechanism", "silo", "claim", "true ε", "rigorous", "estimate low", "flagged",
              "must flag", "result"):
        t.add_column(c, justify="left" if c in ("mechanism", "silo", "result") else "right",
                     overflow="fold")
    for r in rep.rows:
        t.add_row(r.mechanism, r.silo, f"{r.claimed_epsilon:.3f}", _f(r.true_epsilon),
                  f"{r.lower_bound:.3f}", _f(r.estimate_lower), "yes" if r.flagged else "no",
                  "yes" if r.must_flag else "no",
                  "[green]ok[/]" if r.passed else "[bold red]FAILED[/]")
    t.caption = (f"must flag: true ε ≥ 2 × claim. {SERVER_ESTIMATE_NOTE}")
    return t


def write_selftest(rep, out_dir: Path) -> list[Path]:
    """selftest.json and selftest.html into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nonfinite: list[str] = []
    data = json_safe(rep.to_dict(), nonfinite)
    write_json_atomic(out_dir / "selftest.json", dict(data, nonfinite=nonfinite), indent=1)
    e = html.escape
    rows = "".join(f"<tr class='{'ok' if r.passed else 'bad'}'><td>{e(r.mechanism)}</td>"
                   f"<td>{e(r.silo)}</td><td>{r.claimed_epsilon:.3f}</td>"
                   f"<td>{_f(r.true_epsilon)}</td><td>{r.lower_bound:.3f}</td>"
                   f"<td>{_f(r.estimate_lower)}</td><td>{'yes' if r.flagged else 'no'}</td>"
                   f"<td>{'yes' if r.must_flag else 'no'}</td>"
                   f"<td>{'ok' if r.passed else 'FAILED'}</td></tr>" for r in rep.rows)
    write_text_atomic(out_dir / "selftest.html", f"""<!doctype html><html><head>
<meta charset="utf-8"><title>silofl audit self-test</title><style>body{{font-family:sans-serif;
margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px}}
tr.bad{{background:#fdd}}tr.ok{{background:#efe}}</style></head><body>
<h2>Audit self-test: weakened copies of the job's mechanism</h2>
<table><tr><th>mechanism</th><th>silo</th><th>claimed ε</th><th>true ε</th><th>rigorous</th>
<th>estimate low</th><th>flagged</th><th>must flag</th><th>result</th></tr>{rows}</table>
<p>{e(SERVER_ESTIMATE_NOTE)}.</p></body></html>
""")
    return [out_dir / "selftest.json", out_dir / "selftest.html"]


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
    server = getattr(rep, "view", "model") == "server"
    rows = "".join(
        f"<tr class='{'bad' if r.violation else 'ok'}'><td>{e(r.silo)}</td>"
        f"<td>{r.claimed_epsilon:.3f}</td><td>{r.delta:.0e}</td><td>{r.lower_bound:.3f}</td>"
        f"<td>{'VIOLATION' if r.violation else 'consistent'}</td><td>{_extra(r, server)}</td>"
        f"<td>{e(_how_server(r.details) if server else _how(rep.kind, r.details))}</td></tr>"
        for r in rep.rows)
    gdp_note = ("<p>† f-DP refinement: the ε refuted for a Gaussian tradeoff curve; "
                f"{e(GDP_ASSUMPTION)}.</p>" if rep.kind == "one-run" else "")
    if server:
        gdp_note += f"<p>‡ {e(SERVER_ESTIMATE_NOTE)}.</p>"
    notes = "".join(f"<li>{e(n)}</li>" for n in rep.notes)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>silofl audit</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child,
td:last-child{{text-align:left}}tr.bad{{background:#fdd}}tr.ok{{background:#efe}}</style>
</head><body><section id="audit"><h2>Audit: claimed ε vs empirical lower bound</h2>
<p>{e(rep.kind)} audit at {rep.confidence:.0%} confidence; methods: {e(', '.join(rep.methods))};
noise: {e(rep.noise)}; budget store: {e(rep.store or 'scratch (in memory)')}.</p>
<table><tr><th>silo</th><th>claimed ε</th><th>δ</th><th>lower bound</th><th>verdict</th>
<th>{'estimate‡ low – point; detects ≥' if server else 'if Gaussian†'}</th><th>how</th></tr>
{rows}</table>{gdp_note}
<p><b>What this means:</b> {e(LOWER_BOUND_NOTE)}.</p><ul>{notes}</ul></section>
</body></html>
"""
