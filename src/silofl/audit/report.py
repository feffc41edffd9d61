"""An audit's outputs: a rich table for the terminal, audit.json and an HTML panel."""

from __future__ import annotations

import html
from pathlib import Path

from rich.console import Group
from rich.table import Table

from silofl.audit.bounds import GDP_ASSUMPTION
from silofl.audit.engine import LOWER_BOUND_NOTE
from silofl.audit.selftest import MUST_FLAG
from silofl.io import json_safe, write_json_atomic, write_text_atomic


def audit_table(rep) -> Group:
    """The terminal view of an audit: per silo the claimed ε beside what the attack
    established, violations flagged, then how each silo was attacked.

    The main table keeps to about 75 columns (silo names wrap at spaces and are never cut,
    the verdict is never cut); the attack's settings go in a second table below it.

    Parameters
    ----------
    rep : AuditReport
        From `run_audit` (any view; the pandemic audit's report too).

    Returns
    -------
    rich.console.Group
        Two tables, the verdict table and the "how" table, for `Console.print`.
    """
    if getattr(rep, "view", "model") == "server":
        return server_table(rep)
    estimated = any(isinstance(r.details.get("estimate"), dict) for r in rep.rows)
    t = _table(f"Privacy audit ({_view_name(rep)}, {rep.kind}, {rep.confidence:.0%} "
               "family-wise confidence): claimed ε vs empirical lower bound")
    rows = rep.rows
    _claim_columns(t, rows, "lower\nbound")
    if estimated:  # the pandemic white box: an estimate beside the bound, as the server view
        _estimate_columns(t)
    for r in rows:
        cells = _claim_cells(r)
        if estimated:
            cells += [_estimate(r.details), _f(detectable_epsilon(r))]
        t.add_row(*cells)
    notes = ["lower bound: rigorous, at the stated confidence."]
    if estimated:
        in_verdict = any(r.estimate_lower is not None for r in rows)
        notes.append("‡ estimate, not proof (what it assumes: see the notes); 'low' is the "
                     "lower end of its one-sided interval at the stated confidence; 'detects "
                     "ε ≥': the smallest true ε it flags with that confidence. " +
                     ("VIOLATION: the bound or the estimate's lower end exceeds the claim."
                      if in_verdict else "The verdict uses the rigorous bound only."))
    t.caption = " ".join(notes)
    how = _table("How each silo was attacked")
    how.add_column("silo", min_width=_silo_width(r.silo for r in rows), overflow="fold")
    how.add_column("attack")
    if rep.kind == "one-run":
        how.add_column("if Gaussian†", justify="right")
        how.caption = (f"† f-DP refinement: ε refuted for a Gaussian tradeoff curve; "
                       f"{GDP_ASSUMPTION}.")
    else:
        how.caption = ("runs on D + runs on D′ (D plus one canary record); the statistic, "
                       "direction and threshold were chosen on the first half of the runs"
                       + (" among every silo's released statistics (the attacker sees them "
                          "all, so it may be another silo's)" if getattr(rep, "view", "") ==
                          "release" else "") + ", the bound is Clopper–Pearson on the other "
                       "half.")
    for r in rows:
        cells = [r.silo, _how(rep.kind, r.details)]
        how.add_row(*cells, *([_gdp(r.details)] if rep.kind == "one-run" else []))
    return Group(t, how)


def server_table(rep) -> Group:
    """The server-view audit (`audit_table` of a server-view report): rigorous bound, the
    estimate (lower end – point) and the smallest true ε the estimate detects at these
    settings, then each silo's canaries, passes and steps.

    Parameters
    ----------
    rep : AuditReport
        A server-view report (``rep.view == "server"``).

    Returns
    -------
    rich.console.Group
        The verdict table and the "how" table.
    """
    t = _table(f"Privacy audit, server view (white box: every round's update; {rep.kind}, "
               f"{rep.confidence:.0%} family-wise confidence)")
    _claim_columns(t, rep.rows, "rigorous\nbound")
    _estimate_columns(t)
    for r in rep.rows:
        d = r.details
        t.add_row(*_claim_cells(r), _estimate(d), _f(d["detectable_epsilon"]))
    t.caption = ("rigorous bound: proof at the stated confidence, the larger of the one-run "
                 "(ε, δ) bound and the pooled-canary Clopper–Pearson bound. ‡ "
                 + SERVER_ESTIMATE_NOTE + ". VIOLATION: the rigorous bound or the "
                 "estimate's lower end exceeds the claimed ε.")
    how = _table("How each silo was attacked")
    how.add_column("silo", min_width=_silo_width(r.silo for r in rep.rows), overflow="fold")
    for c in ("canaries\n(in)", "passes", "DP-SGD\nsteps", "one-run\nf-DP†"):
        how.add_column(c, justify="right")
    for r in rep.rows:
        d = r.details
        how.add_row(r.silo, f"{d['canaries']} ({d['included']})", str(d["passes"]),
                    str(d["steps"]), f"{d['one_run']['gdp']['epsilon']:.2f}")
    how.caption = ("canaries: Dirac gradient canaries in auditing-only coordinates, each "
                   "'in' with probability ½; passes: local passes the server sees. † "
                   f"f-DP refinement for a Gaussian tradeoff curve; {GDP_ASSUMPTION}.")
    return Group(t, how)


#: what the server view's estimate is (the self-test's caption too)
ESTIMATE_NOTE = ("estimate, not proof: the canaries' score read through the claimed mechanism "
                 "family (Poisson-subsampled Gaussian, the claimed q and steps); 'low' is the "
                 "lower end of its one-sided interval at the stated confidence, and a silo is "
                 "flagged when it exceeds the claim")
SERVER_ESTIMATE_NOTE = (ESTIMATE_NOTE + ". 'detects ε ≥': the smallest true ε this audit "
                        "flags with the stated confidence")

#: the width of "0.899–0.981" and of "consistent": never wrapped or cut
_EST_W, _VERDICT_W = 11, 10


def _table(title: str) -> Table:
    """A table that fits 80 columns where it can: no outer edge, title and caption read
    left to right (long captions centred on 80 columns read badly)."""
    return Table(title=title, title_justify="left", caption_justify="left",
                 show_edge=False, pad_edge=False)


def _claim_columns(t: Table, rows, bound: str) -> None:
    """silo, verdict (second: a terminal too narrow for the table cuts numbers, not the
    verdict), claimed ε, δ and the rigorous bound's column (named `bound`)."""
    t.add_column("silo", min_width=_silo_width(r.silo for r in rows), overflow="fold")
    t.add_column("verdict", min_width=_VERDICT_W, no_wrap=True)
    for c in ("claimed\nε", "δ", bound):  # two-line headers: the table fits 80 columns
        t.add_column(c, justify="right")


def _claim_cells(r) -> list[str]:
    return [r.silo, _verdict(r), f"{r.claimed_epsilon:.3f}", f"{r.delta:.0e}", f"{r.lower_bound:.3f}"]


def _estimate_columns(t: Table) -> None:
    t.add_column("estimate‡\nlow–point", justify="right", min_width=_EST_W)
    t.add_column("detects\nε ≥", justify="right")


def _silo_width(names) -> int:
    """The silo column's minimum width: the longest word of any name (at most 24), so a
    name wraps at its spaces and is never cut ("Clevel…"); a word over 16 characters
    folds."""
    return min(max((len(w) for n in names for w in str(n).split()), default=4), 16)


def _verdict(r) -> str:
    return "[bold red]VIOLATION[/]" if r.violation else "[green]consistent[/]"


def _view_name(rep) -> str:
    """The view in words (the pandemic white box reports view 'model' at the top and
    'white-box' in its rows)."""
    view = getattr(rep, "view", "model")
    if any(r.details.get("view") == "white-box" for r in rep.rows):
        return "white box: every pass's update, Dirac canaries"
    return {"model": "model view, black box", "release": "release view: the private "
            "preprocessing statistics", "trees": "trees: the noisy histograms (white box) "
            "and the ensemble (black box), tree canaries"}.get(view, str(view))


def _estimate(d: dict) -> str:
    """'low – point' of a row's estimate, '—' where there is none."""
    e = d.get("estimate")
    if not isinstance(e, dict):
        return "—"
    return f"{_f(e.get('epsilon_lower'))}–{_f(e.get('epsilon'))}"


def detectable_epsilon(row) -> float | None:
    """The audit's power for one silo: the smallest true ε it flags with the stated
    confidence at its settings.

    Parameters
    ----------
    row : SiloAudit
        A row of an `AuditReport` (server view, or the pandemic white box).

    Returns
    -------
    float or None
        That ε (same unit as the claim), or None where the audit reports no power (the
        model and release views).
    """
    d = row.details
    if isinstance(d.get("detectable_epsilon"), (int, float)):
        return float(d["detectable_epsilon"])
    det = d.get("detectable")  # the pandemic white box nests it
    if isinstance(det, dict) and isinstance(det.get("detectable_epsilon"), (int, float)):
        return float(det["detectable_epsilon"])
    return None


def _f(x, digits: int = 3) -> str:
    if x is None or x != x:  # None or NaN: not computed
        return "—"
    return "∞" if x == float("inf") else f"{x:.{digits}f}"


def _how_server(d: dict) -> str:
    return (f"m={d['canaries']} ({d['included']} in), {d['passes']} passes, "
            f"{d['steps']} steps; one-run f-DP† {d['one_run']['gdp']['epsilon']:.2f}")


def _gdp(d: dict) -> str:
    """The f-DP (Gaussian) bound of a one-run audit; the estimate (lower end – point,
    assumes Gaussian scores) of a last-iterate audit (`audit.lastiter`); else '—'."""
    g, e = d.get("gdp"), d.get("estimate")
    if g is None and e is not None:
        tag = f" ({e['score']})" if e.get("score") else ""
        return f"{_f(e['epsilon_lower'])} – {_f(e['epsilon'])}{tag}"
    return "—" if g is None else f"{g['epsilon']:.3f}"


def _how(kind: str, d: dict) -> str:
    if d.get("view") == "release (white box)":
        return (f"{d['canaries']} canary rows ({d['included']} in), one release, each a "
                "record's full sensitivity")
    if kind == "one-run":
        return (f"m={d['canaries']} ({d['included']} in), {d['score']}: "
                f"{d['correct']}/{d['guesses']} right")
    return f"{d['runs']}+{d['runs']} runs, {d['statistic']}"


def _extra(r, server: bool) -> str:
    """The HTML cells after the verdict: the f-DP figure, or the estimate and the power."""
    if not server:
        return f"<td>{_gdp(r.details)}</td>"
    d = r.details
    return f"<td>{_estimate(d)}</td><td>{_f(d['detectable_epsilon'])}</td>"


def selftest_table(rep) -> Table:
    """`--self-test`: each mechanism's true ε beside what the audit said.

    One section per mechanism (its name on its first row), two decimals: the table keeps
    to 80 columns without cutting a name or a result.

    Parameters
    ----------
    rep : SelfTestReport
        From `audit.selftest.self_test`.

    Returns
    -------
    rich.table.Table
    """
    t = _table(f"Audit self-test: weakened copies of this job's mechanism (server view, "
               f"one run each, {rep.confidence:.0%} confidence, m = {rep.canaries} canaries "
               "per silo)")
    t.add_column("mechanism", min_width=max((len(w) for r in rep.rows
                                             for w in r.mechanism.split()), default=9))
    t.add_column("silo", min_width=_silo_width(r.silo for r in rep.rows), overflow="fold")
    for c in ("claim\nε", "true\nε", "bound", "est.\nlow"):
        t.add_column(c, justify="right")
    t.add_column("flagged", min_width=7)
    for i, r in enumerate(rep.rows):
        first = i == 0 or rep.rows[i - 1].mechanism != r.mechanism
        last = i == len(rep.rows) - 1 or rep.rows[i + 1].mechanism != r.mechanism
        t.add_row(r.mechanism if first else "", r.silo, _f(r.claimed_epsilon, 2),
                  _f(r.true_epsilon, 2), _f(r.lower_bound, 2), _f(r.estimate_lower, 2),
                  _result(r), end_section=last)
    t.caption = (f"flagged: the rigorous lower bound (bound) or the estimate's lower end "
                 f"(est. low) exceeds the claim; (ok) when that is what it must be: a copy "
                 f"whose true ε ≥ {MUST_FLAG:g} × the claim must be flagged, the mechanism as "
                 "run must not be, a copy in between may go either way. MISSED or FALSE "
                 "ALARM: the self-test failed. " + ESTIMATE_NOTE + ".")
    return t


def _result(r) -> str:
    """'yes (ok)', 'no (ok)', or the failure in red: MISSED, FALSE ALARM."""
    said = "yes" if r.flagged else "no"
    if r.passed:
        return f"{said} [green](ok)[/]"
    return f"{said}: [bold red]" + ("MISSED" if r.must_flag else "FALSE ALARM") + "[/]"


def write_selftest(rep, out_dir: Path) -> list[Path]:
    """Write a self-test's report files.

    Parameters
    ----------
    rep : SelfTestReport
        From `audit.selftest.self_test`.
    out_dir : Path
        The folder written (created if needed).

    Returns
    -------
    list of Path
        selftest.json (strict JSON, written atomically; an infinite true ε is null, its
        path listed under "nonfinite") and selftest.html.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nonfinite: list[str] = []
    data = json_safe(rep.to_dict(), nonfinite)
    write_json_atomic(out_dir / "selftest.json", _with_nonfinite(data, nonfinite), indent=1)
    e = html.escape
    notes = "".join(f"<li>{e(n)}</li>" for n in rep.notes)
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
<p><b>{'PASSED' if rep.passed else 'FAILED'}</b>: the one-run server-view audit (m =
{rep.canaries} canaries per silo, {rep.confidence:.0%} confidence) against the job's
mechanism and deliberately weakened copies of it; {rep.seconds:.0f} s.</p>
<table><tr><th>mechanism</th><th>silo</th><th>claimed ε</th><th>true ε</th>
<th>rigorous lower bound</th><th>estimate, lower end</th><th>flagged</th><th>must flag</th>
<th>result</th></tr>{rows}</table>
<p>flagged: the rigorous lower bound or the estimate's lower end exceeds the claim. A copy
whose true ε is at least {MUST_FLAG:g} × the claim must be flagged, the mechanism as run
must not be; a copy in between may go either way. ∞: the copy has no finite ε.</p>
<p>{e(ESTIMATE_NOTE)}.</p><ul>{notes}</ul></body></html>
""")
    return [out_dir / "selftest.json", out_dir / "selftest.html"]


#: what a null listed under "nonfinite" means, written beside the list when it is not empty
NONFINITE_NOTE = ("the values at these paths are not finite (∞: no finite ε, e.g. clipping "
                  "off) and are written as null: strict JSON has no infinity")


def _with_nonfinite(data: dict, nonfinite: list[str]) -> dict:
    out = dict(data, nonfinite=nonfinite)
    if nonfinite:
        out["nonfinite_means"] = NONFINITE_NOTE
    return out


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
    write_json_atomic(out_dir / "audit.json", _with_nonfinite(data, nonfinite), indent=1)
    write_text_atomic(out_dir / "audit.html", audit_html(rep))
    return [out_dir / "audit.json", out_dir / "audit.html"]


def audit_html(rep) -> str:
    """A self-contained HTML page holding the audit panel."""
    e = html.escape
    server = getattr(rep, "view", "model") == "server"
    rows = "".join(
        f"<tr class='{'bad' if r.violation else 'ok'}'><td>{e(r.silo)}</td>"
        f"<td>{r.claimed_epsilon:.3f}</td><td>{r.delta:.0e}</td><td>{r.lower_bound:.3f}</td>"
        f"<td>{'VIOLATION' if r.violation else 'consistent'}</td>{_extra(r, server)}"
        f"<td>{e(_how_server(r.details) if server else _how(rep.kind, r.details))}</td></tr>"
        for r in rep.rows)
    gdp_note = ("<p>† f-DP refinement: the ε refuted for a Gaussian tradeoff curve; "
                f"{e(GDP_ASSUMPTION)}.</p>" if rep.kind == "one-run" else "")
    if server:
        gdp_note += (f"<p>‡ {e(SERVER_ESTIMATE_NOTE)}. VIOLATION: the rigorous bound or the "
                     "estimate's lower end exceeds the claimed ε.</p>")
    notes = "".join(f"<li>{e(n)}</li>" for n in rep.notes)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>silofl audit</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child,
td:last-child{{text-align:left}}tr.bad{{background:#fdd}}tr.ok{{background:#efe}}</style>
</head><body><section id="audit"><h2>Audit: claimed ε vs empirical lower bound</h2>
<p>{e(_view_name(rep) if not server else "server view (white box)")}, {e(rep.kind)}
audit at {rep.confidence:.0%} family-wise confidence; methods: {e(', '.join(rep.methods))};
noise: {e(rep.noise)}; budget store: {e(rep.store or 'scratch (in memory)')}.
{'Neighbouring datasets: ' + e(rep.neighbouring) + '.' if rep.neighbouring else ''}</p>
<table><tr><th>silo</th><th>claimed ε</th><th>δ</th>
<th>{'rigorous lower bound' if server else 'lower bound'}</th><th>verdict</th>
{'<th>estimate‡ (lower end–point)</th><th>detects true ε ≥</th>' if server
  else '<th>if Gaussian†</th>'}<th>how</th></tr>
{rows}</table>{gdp_note}
<p><b>What this means:</b> {e(LOWER_BOUND_NOTE)}.</p><ul>{notes}</ul></section>
</body></html>
"""
