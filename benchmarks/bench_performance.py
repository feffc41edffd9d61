"""Issue 25's four figures side by side (printed, not asserted): runs the four scripts one
after another, each in its own process with ``--json``, then prints one table

    what | silofl | comparison | ratio | target | met?

and writes the combined JSON. The rows and their comparisons:

- ``engine`` (bench_engine.py --paired): GLM secure DP-SGD (noise in the foreground, the rule
  on 2 cores) against non-private, CPU seconds of `simulate()` in the same fresh processes;
  ratio = DP / non-private (median over the processes), target ≤ 1.15×.
- ``opacus`` (bench_torch_opacus.py): torch DP-SGD examples/s against Opacus on the same
  network, batch, σ and C; the case with the lowest ratio is shown (all are in the JSON);
  ratio = silofl / Opacus, target ≥ 1.5× for every case.
- ``memory`` (bench_big_silos.py): peak resident memory of a lazy (Parquet) silo against
  the same 1M rows (quick: fewer) trained in memory; ratio = lazy / in memory, target: every
  lazy case (the largest is named: 2M rows by default) ≤ 8 GB.
- ``sweep`` (bench_sweep_engines.py): wall seconds of a sweep on a local Ray cluster against
  the local engine with one process; ratio = Ray / local (below 1: faster), target: the
  same results and charges.

Defaults take about 10–15 minutes on 2 cores; ``--quick`` is a smoke run of about a minute
(tiny sizes: its figures only show that everything runs). A script that fails gives a row
marked "failed" (its error in the JSON) and the others still run; the exit status is 1 then.

Run: .venv/bin/python benchmarks/bench_performance.py [--quick] [--only engine,opacus,...]
     [--json runs/benchmarks/performance.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GB = 2**30

#: key → (script, full-size arguments, --quick arguments); each also gets --json PATH
STEPS: dict[str, tuple[str, list[str], list[str]]] = {
    "engine": ("bench_engine.py", ["--paired", "3", "--rounds", "400", "--old-src", ""],
               ["--paired", "1", "--rounds", "20", "--old-src", ""]),
    "opacus": ("bench_torch_opacus.py", ["--pairs", "5"], ["--quick"]),
    "memory": ("bench_big_silos.py", ["--files", "10"],
               ["--quick", "--files", "2", "--cases", "memory"]),
    "sweep": ("bench_sweep_engines.py", ["--runs", "18"],
              ["--runs", "1", "--rounds", "10", "--scratch", "--no-local-n"]),
}


def run_step(key: str, quick: bool, out: Path, log: Callable[[str], None]) -> dict:
    """Run one script in a fresh interpreter (this tree's src first on the path), echoing
    its output indented as it comes; returns its ``--json`` figures.

    Parameters
    ----------
    key : str
        A key of `STEPS`.
    quick : bool
        Use the script's smoke-run arguments.
    out : Path
        Directory for the script's JSON file (and, for bench_big_silos, its data).
    log : callable
        Receives each progress line.

    Returns
    -------
    dict
        The figures the script wrote; raises RuntimeError when it exits non-zero.
    """
    script, full, small = STEPS[key]
    path = out / f"{key}.json"
    args = [sys.executable, "-u", str(HERE / script), *(small if quick else full),
            "--json", str(path)]
    if key == "memory":
        args += ["--dir", str(out / "big-silos")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p))
    tail: list[str] = []
    with subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, cwd=ROOT) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log("    │ " + line.rstrip())
            tail = (tail + [line])[-40:]
    if proc.returncode:
        raise RuntimeError(f"{script} exited with {proc.returncode}:\n" + "".join(tail))
    return json.loads(path.read_text())


def _row(what: str, ours: float, theirs: float, unit: str, cmp: str, ratio: float,
         target: str, met: bool) -> dict:
    return {"what": what, "silofl": ours, "comparison": theirs, "unit": unit,
            "compared_with": cmp, "ratio": ratio, "target": target, "met": met}


def engine_row(f: dict) -> dict:
    """The GLM row from bench_engine --paired figures (this tree only)."""
    p = f["paired"]
    ratio = p["ratios"]["new secure DP (foreground) / new non-private (CPU)"]
    sec = p["seconds"]
    return _row(f"GLM engine, Vehicle-like 23 silos, {p['rounds']} rounds MR-MTL, secure DP "
                f"(CPU s, median of {p['pairs']} processes)",
                sec["new DP-SGD, secure, foreground"]["cpu"], sec["new non-private"]["cpu"],
                "s", "non-private", ratio["median"], "≤ 1.15×", ratio["median"] <= 1.15)


def opacus_row(f: dict) -> dict:
    """The torch row: the case with the lowest silofl / Opacus throughput ratio."""
    rows = [r for r in f["rows"] if "ratio" in r]
    if not rows:
        raise RuntimeError("no Opacus comparison (is opacus installed?)")
    worst = min(rows, key=lambda r: r["ratio"][0])
    return _row(f"torch DP-SGD examples/s, {worst['case']} (lowest of {len(rows)} cases; "
                f"batch {worst['batch']}, {worst['threads']} threads)", worst["ours"],
                worst["opacus"], "ex/s", "Opacus 1.6", worst["ratio"][0], "≥ 1.5× (all)",
                all(r["ratio"][0] >= 1.5 for r in rows))


def memory_row(f: dict) -> dict:
    """The memory row: peak RSS of a lazy silo against the same rows in memory; the largest
    lazy case (the 8 GB target) is named in `what`."""
    cases = f["cases"]
    lazy = {k: c for k, c in cases.items() if "lazy" in k}
    mem = next(c for k, c in cases.items() if "in memory" in k)
    same = next((c for k, c in lazy.items() if "(cmp)" in k), None)
    if same is None:
        raise RuntimeError("no lazy run of the in-memory comparison's rows")
    big = max(lazy, key=lambda k: (lazy[k]["rows"], lazy[k]["peak_bytes"]))
    return _row(f"peak RSS, lazy Parquet silo, {same['rows']:,} rows × {f['d']} (largest: "
                f"{big}, {lazy[big]['rows']:,} rows, {lazy[big]['peak_bytes'] / GB:.2f} GB)",
                same["peak_bytes"] / GB, mem["peak_bytes"] / GB, "GB", "in memory",
                same["peak_bytes"] / mem["peak_bytes"], "≤ 8 GB (all lazy)",
                all(c["peak_bytes"] <= 8 * GB for c in lazy.values()))


def sweep_row(f: dict) -> dict:
    """The sweep row: Ray's wall seconds against one local process."""
    eng = {(e["engine"], e["workers"]): e for e in f["engines"]}
    ray, local = eng[("ray", f["workers"])], eng[("local", 1)]
    store = "lifetime store" if f["lifetime_store"] else "scratch stores: charges not compared"
    return _row(f"sweep wall s, {f['runs']} runs of {f['config']}, Ray {f['workers']} workers "
                f"({store})", ray["seconds"], local["seconds"], "s", "local engine, 1 process",
                ray["seconds"] / local["seconds"], "same results, charges",
                all(e["same_results"] and e["same_charges"] for e in f["engines"]))


ROWS: dict[str, Callable[[dict], dict]] = {
    "engine": engine_row, "opacus": opacus_row, "memory": memory_row, "sweep": sweep_row}


def _fig(x: float, unit: str) -> str:
    return f"{x:,.0f} {unit}" if x >= 100 else f"{x:.3g} {unit}"


def table(rows: dict[str, dict]) -> str:
    """The printed table: one line per figure (a failed script: its row says so)."""
    head = ("what", "silofl", "comparison", "ratio", "target", "met?")
    lines = []
    for key, r in rows.items():
        if "error" in r:
            lines.append((f"{key}: {STEPS[key][0]}", "failed", "–", "–", "–", "no"))
            continue
        lines.append((r["what"], _fig(r["silofl"], r["unit"]), f"{r['compared_with']}: "
                      f"{_fig(r['comparison'], r['unit'])}", f"{r['ratio']:.2f}×", r["target"],
                      "yes" if r["met"] else "NO"))
    w = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]
    out = [" | ".join(c.ljust(w[i]) for i, c in enumerate(x)) for x in [head, *lines]]
    out.insert(1, "-+-".join("-" * n for n in w))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run (about a minute)")
    ap.add_argument("--only", default=",".join(STEPS),
                    help=f"comma-separated subset of {','.join(STEPS)}")
    ap.add_argument("--json", type=Path, default=ROOT / "runs" / "benchmarks" /
                    "performance.json", help="the combined figures (default: %(default)s)")
    a = ap.parse_args(argv)
    keys = [k.strip() for k in a.only.split(",") if k.strip()]
    if bad := [k for k in keys if k not in STEPS]:
        ap.error(f"--only: unknown {', '.join(bad)}; choose from {', '.join(STEPS)}")
    rows: dict[str, dict] = {}
    raw: dict[str, dict] = {}
    load0, t_all = os.getloadavg()[0], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="silofl-perf-") as tmp:
        for i, key in enumerate(keys, 1):
            print(f"[{i}/{len(keys)}] {key}: {STEPS[key][0]} "
                  f"({'quick' if a.quick else 'full'}) …", flush=True)
            t0 = time.perf_counter()
            try:
                raw[key] = run_step(key, a.quick, Path(tmp), lambda s: print(s, flush=True))
                rows[key] = ROWS[key](raw[key])
            except (RuntimeError, OSError, KeyError, ValueError, StopIteration) as e:
                rows[key] = {"error": f"{type(e).__name__}: {e}"}
            rows[key]["seconds"] = time.perf_counter() - t0
            print(f"[{i}/{len(keys)}] {key}: {'failed' if 'error' in rows[key] else 'done'} "
                  f"in {rows[key]['seconds']:.0f} s", flush=True)
    machine = {"cpus": os.cpu_count(), "load_before": load0, "load_after": os.getloadavg()[0],
               "seconds": time.perf_counter() - t_all, "quick": a.quick}
    print(f"\nIssue 25's figures ({'--quick: tiny sizes, not the figures' if a.quick else 'full'}"
          f"; {machine['cpus']} CPUs, load average {load0:.1f} → "
          f"{machine['load_after']:.1f}, {machine['seconds']:.0f} s in all)")
    print(table(rows))
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"machine": machine, "rows": rows, "figures": raw},
                                 indent=1, default=str))
    print(f"(written: {a.json})")
    return 1 if any("error" in r for r in rows.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
