"""Sweep engines side by side (figures printed, not asserted): the same grid of
examples/school-quick.toml (or --config) with the local engine (1 and N processes) and the
Ray engine (a local cluster of N worker CPUs, its start included), each into a fresh results
file charged to a fresh lifetime store (--scratch: none); then checks that the three results files agree
(metrics within 1e-9) and that the stores hold the same charges.

    .venv/bin/python benchmarks/bench_sweep_engines.py               # school-quick, N = 2
    .venv/bin/python benchmarks/bench_sweep_engines.py --workers 4 --runs 24
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
import time
import tomllib
from pathlib import Path

from silofl.experiments.sweep import expand, run_sweep
from silofl.experiments.sweep_config import sweep_config_from_dict
from silofl.experiments.sweep_results import read_results
from silofl.privacy.budget import BudgetStore

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "school-quick.toml"


def _sweep(raw: dict, root: Path, engine: str, workers: int, scratch: bool
           ) -> tuple[float, list, dict]:
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    raw["sweep"] = dict(raw["sweep"], engine=engine, workers=workers, results="results.jsonl")
    if not scratch:
        raw["budget"] = {"store": "budget.sqlite", "epsilon": 100.0}
    root.mkdir()
    sc = sweep_config_from_dict(raw, root)
    t0 = time.perf_counter()
    run_sweep(sc)
    seconds = time.perf_counter() - t0
    _, records = read_results(root / "results.jsonl")
    if scratch:
        return seconds, records, {}
    with BudgetStore(root / "budget.sqlite") as st:
        spent = {n: st.spent(n)["epsilon"] for n in st.silos()}
    return seconds, records, spent


def _same(a: list, b: list) -> bool:
    by = {r["key"]: r for r in a}
    return len(a) == len(b) and all(
        all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
            for x, y in zip(r["test"] + r["validation"],
                            by[r["key"]]["test"] + by[r["key"]]["validation"])) for r in b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=18, help="keep the first N runs of the grid "
                    "(by trimming seeds, lr, ε, λ and methods; 0 = the whole grid)")
    ap.add_argument("--rounds", type=int, default=0, help="override [training] rounds")
    ap.add_argument("--no-local-n", action="store_true",
                    help="skip the local engine with N processes (local ×1 and Ray only)")
    ap.add_argument("--json", type=Path, metavar="PATH",
                    help="also write the printed figures to PATH (JSON)")
    ap.add_argument("--scratch", action="store_true", help="no lifetime store (each run on "
                    "its own scratch store)")
    args = ap.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)
    raw = tomllib.loads(args.config.read_text())
    raw.setdefault("data", {})
    if raw["data"].get("path"):
        raw["data"]["path"] = str((args.config.parent / raw["data"]["path"]).resolve())
    raw["privacy"] = dict(raw.get("privacy", {}), noise="seeded")  # comparable across engines
    if args.rounds:
        raw["training"] = dict(raw.get("training", {}), rounds=args.rounds)
    if args.runs:
        sw = raw["sweep"]
        sw["seeds"] = sw.get("seeds", [0])[:1]
        for key in ("lr", "epsilon", "lam", "methods"):  # trim each to one value, in order
            while len(expand(sweep_config_from_dict(raw, args.config.parent))) > args.runs \
                    and len(sw.get(key, [0])) > 1:
                sw[key] = sw[key][:-1]
    n = len(expand(sweep_config_from_dict(raw, args.config.parent)))
    print(f"{args.config.name}: {n} runs, workers = {args.workers}, "
          f"{'scratch stores' if args.scratch else 'a lifetime store'}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [("local", 1)] + [("local", args.workers)] * (not args.no_local_n) + [
            ("ray", args.workers)]
        out = {}
        for engine, w in rows:
            out[(engine, w)] = _sweep(raw, Path(tmp) / f"{engine}-{w}", engine, w,
                                       args.scratch)
            print(f"  {engine:5s} workers={w}: {out[(engine, w)][0]:6.1f} s")
        base = out[("local", 1)]
        figures: dict = {"config": args.config.name, "runs": n, "workers": args.workers,
                         "lifetime_store": not args.scratch, "engines": []}
        for key in rows:
            secs, recs, spent = out[key]
            same = _same(base[1], recs)
            charges = all(math.isclose(spent[s], base[2][s], rel_tol=1e-12) for s in base[2])
            figures["engines"].append({"engine": key[0], "workers": key[1], "seconds": secs,
                                       "speed_vs_local1": base[0] / secs,
                                       "same_results": same, "same_charges": charges})
            if key != rows[0]:
                print(f"  {key[0]} ×{key[1]} vs local ×1: {base[0] / secs:.2f}× speed, "
                      f"results {'equal' if same else 'DIFFER'}, charges "
                      f"{'equal' if charges else 'DIFFER'}")
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
