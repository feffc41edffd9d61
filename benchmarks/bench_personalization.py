"""Personalization benchmark tables (issue 22): every method at ε ∈ {1, 2, 4, 6, 8}, seeds,
on School, heart, the Vehicle-like synthetic task and a Rotated & Masked MNIST slice.

Each job is one (dataset, ε, seed, method) run through the config → run path
(`silofl.run`, one method per job, so each method gets the whole ε), charged to a
*scratch* budget store, with seeded noise: experiments, not releases. A method is written
``name[:key=value]...``; a bare key overrides [training] (``mrmtl:lam=auto``,
``ditto:clip=auto``), ``section.key`` any other section (``mrmtl:tuning.mode=private``:
MR-MTL privately tuned over the thesis λ grid, its cost counted). A job that fails (a
method or key this version does not know) becomes an "n/a" cell; the run goes on.

Tables: rows = methods, columns = ε, mean ± sd over seeds; * marks the best untuned
baseline (the better of FedAvg and Local at that ε) and (r×) is each method's ratio to
it. ``--uncounted-best-lambda`` adds MR-MTL over the thesis λ grid and a row with the best
λ per ε chosen on the test metric after the fact: NOT counted, an upper reference only.
Outputs under --out: tables.md (for the README), results.json (every job), records.jsonl
(each job as it finishes), <dataset>.png. ``--time-limit`` stops the pool at a deadline
and reports what finished (the rest n/a); ``--from-records`` rebuilds the tables from a
records.jsonl. Jobs of a GLM dataset run grouped per (ε, seed), σ calibrated once a group.
A worker killed by the OS (memory) stalls its task until --time-limit.

Full run (1275 jobs: 360 each on School, heart, Vehicle with the uncounted λ grid, 195 on
MNIST; ≈ 5600 CPU s, ≈ 350 s on 16 cores; the uncounted λ grid is on by default,
--no-uncounted-best-lambda drops it). On the lent 16-core machine, `benchmarks/run_device.sh`
(wheels, threads, preflight, ≤ 8 files back); by hand:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_personalization.py --workers 16 \\
        --time-limit 470 --out runs/bench-personalization

Reduced run (2 cores, ≈ 1.5 min):

    .venv/bin/python benchmarks/bench_personalization.py --datasets heart,school --seeds 1 \\
        --set school.training.rounds=20 --workers 2 \\
        --methods local,fedavg,mrmtl:lam=0.1,mrmtl:lam=1,ditto:lam=1,finetune
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import multiprocessing
import os
import re
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # personalization_tables, workers too
from personalization_tables import (  # noqa: E402
    SEEDED,
    UNCOUNTED,
    add_uncounted,
    aggregate,
    caption,
    higher_is_better,
    make_table,
    markdown,
    mean_by,
    plot,
    print_table,
)

LAMS = [0.0001, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10]  # thesis appendix B.4
#: issue 22's rows for the GLM datasets: the baselines, fixed and auto λ, auto clipping, the
#: peers' methods, MR-MTL tuned privately over LAMS by the full-rate RepeatAndSelect route
#: (select = "random", TNB η = 1, E[h] = 10) and by the default subsample route (random h on a
#: γ = 0.1 subsample, then one full run; η = 0, score ratio 4), both counted
METHODS = ("local,fedavg,finetune,mrmtl:lam=1,mrmtl:lam=auto,ditto:lam=auto,"
           "mrmtl:lam=auto:clip=auto,fedavg:clip=auto,fedprox,scaffold,apfl,fedper,fedrep,"
           "mrmtl:tuning.mode=private:tuning.select=random:tuning.eta=1,"
           "mrmtl:tuning.mode=private:tuning.select=subsample")
#: the torch rows (MNIST): no private tuning (≈ 11 trainings per job); FedBN on mlp_norm
TORCH_METHODS = ("local,fedavg,finetune,mrmtl:lam=1,mrmtl:lam=auto,ditto:lam=auto,"
                 "mrmtl:lam=auto:clip=auto,fedprox,scaffold,apfl,fedper,fedrep,fedbn")
TORCH_DATASETS = ("mnist",)
TWO_MODELS = ("ditto", "apfl", "fedrep")  # about twice a FedAvg job's compute
_TUNING = {"method": "mrmtl", "lam": LAMS, "pivot_lam": 0.1, "mean_trials": 10}
_KEY = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$")


def _base(data: dict, model: dict, training: dict, delta: float) -> dict:
    return {"data": data, "model": model, "training": {"local_epochs": 1, **training},
            "privacy": {"delta": delta, "accountant": "rdp", "noise": "seeded"},
            "budget": {"scratch": True}, "output": {"dir": "", "checkpoint_every": 0},
            "tuning": dict(_TUNING)}


#: dataset -> (title, base config); rounds are the full run's (override with --set)
DATASETS = {
    "school": ("School (139 schools, linear, test MSE)", _base(
        {"source": "school", "test_fraction": 0.2, "standardize": True, "seed": 0},
        {"name": "linear", "metric": "mse"},
        {"rounds": 200, "batch_size": 32, "lr": 0.03, "clip": 1.0}, 1e-3)),
    "heart": ("heart (4 hospitals, logistic, test accuracy)", _base(
        {"source": "heart", "test_fraction": 0.2, "seed": 0},
        {"name": "logistic", "metric": "accuracy"},
        {"rounds": 30, "batch_size": 8, "lr": 0.1, "clip": 1.0}, 1e-4)),
    "vehicle": ("Vehicle-like (23 silos, d = 100, logistic, test accuracy)", _base(
        {"source": "synthetic", "generator": "vehicle", "test_fraction": 0.2, "seed": 0},
        {"name": "logistic", "metric": "accuracy"},
        {"rounds": 100, "batch_size": 64, "lr": 0.1, "clip": 1.0}, 1e-4)),
    # The slice is sized to ≈ 22 s of CPU per job (8 silos × 600 flattened images, a
    # LayerNorm MLP of 32 hidden units, so FedBN has its personal normalization layers).
    # batch 100, lr 1, clip 1 are a benchmark-level public choice, the same for every row:
    # lr ∈ {0.5, 1, 2} compared on FedAvg and Local at ε = 8, seed 0 only (Local 0.72 /
    # 0.76 / 0.78, FedAvg 0.46 / 0.51 / 0.54), then capped at lr·λ ≤ 1 for the fixed λ = 1
    # row (a public stability bound: at lr 2 the prox step overshoots, MR-MTL λ=1 got 0.08).
    "mnist": ("Rotated & Masked MNIST slice (8 silos × 600 images, flattened, LayerNorm MLP "
              "32 units, test accuracy)",
              _base({"source": "mnist", "num_silos": 8, "train_per_silo": 600,
                     "test_per_silo": 100, "mask_prob": 0.1, "flatten": True,
                     "standardize": "none", "seed": 0},
                    {"name": "mlp_norm", "hidden": [32], "metric": "accuracy"},
                    {"rounds": 20, "batch_size": 100, "lr": 1.0, "clip": 1.0}, 1e-4)),
}


# --- method specs ------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    """One table row: a method and its config overrides.

    Attributes
    ----------
    label : str
        The row label, the spec as written (``mrmtl:lam=auto``).
    method : str
        The method name (training.methods = [method]).
    overrides : tuple of (section, key, value)
        Config keys set for this row, in the order written.
    """

    label: str
    method: str
    overrides: tuple = ()


def parse_value(text: str):
    """``true``/``false`` → bool, an int, a float, ``a;b`` → list, else the string."""
    if ";" in text:
        return [parse_value(t) for t in text.split(";") if t]
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_spec(text: str) -> Spec:
    """Parse ``name[:key=value]...`` (a bare key is a [training] key).

    Parameters
    ----------
    text : str
        E.g. ``mrmtl:lam=auto:clip=auto`` or ``mrmtl:tuning.mode=private``.

    Returns
    -------
    Spec
        Raises ValueError naming the malformed part.
    """
    parts = text.strip().split(":")
    name = parts[0]
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"method spec {text!r}: {name!r} is not a method name "
                         "(write name[:key=value]..., e.g. mrmtl:lam=auto)")
    overrides = []
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        if not eq or not value or not _KEY.fullmatch(key):
            raise ValueError(f"method spec {text!r}: {part!r} is not key=value (a [training] "
                             "key, or section.key for another section)")
        section, _, k = key.rpartition(".")
        overrides.append((section or "training", k, parse_value(value)))
    return Spec(text.strip(), name, tuple(overrides))


def parse_methods(text: str) -> list[Spec]:
    """Comma-separated specs, duplicates dropped (first kept)."""
    out: dict[str, Spec] = {}
    for t in text.split(","):
        if t.strip():
            s = parse_spec(t)
            out.setdefault(s.label, s)
    return list(out.values())


def parse_sets(items: list[str]) -> dict[str, list[tuple[str, str, object]]]:
    """``--set dataset.section.key=value`` → dataset -> [(section, key, value)]."""
    out: dict[str, list] = {}
    for item in items:
        path, eq, value = item.partition("=")
        bits = path.split(".")
        if not eq or len(bits) != 3 or bits[0] not in DATASETS:
            raise ValueError(f"--set {item!r}: write dataset.section.key=value with dataset "
                             f"one of {', '.join(DATASETS)}")
        out.setdefault(bits[0], []).append((bits[1], bits[2], parse_value(value)))
    return out


def job_config(base: dict, spec: Spec, epsilon: float, seed: int) -> dict:
    """The raw config of one job: `base` with the spec's method and overrides."""
    raw = copy.deepcopy(base)
    raw["training"].update(methods=[spec.method], seed=seed)
    raw["privacy"]["epsilon"] = epsilon
    for section, key, value in spec.overrides:
        raw.setdefault(section, {})[key] = value
    raw["training"].setdefault("eval_every", raw["training"]["rounds"])  # the final model only
    return raw


# --- one job (in a worker process) ----------------------------------------------------------

def run_job(dataset: str, raw: dict, spec: Spec, epsilon: float, seed: int) -> dict:
    """Train one job; a failure is returned as ``error`` (never raised)."""
    t0, c0 = time.perf_counter(), time.process_time()
    rec = {"dataset": dataset, "method": spec.label, "epsilon": epsilon, "seed": seed,
           "value": None, "error": None}
    try:
        import silofl
        from silofl.config import config_from_dict
        from silofl.io import json_safe
        rep = silofl.run(config_from_dict(raw))
        r = rep.results[0]
        value = float(r.final_pooled)
        rec.update(value=value if math.isfinite(value) else None, metric=r.metric,
                   algorithm=json_safe(r.method), train_seconds=r.seconds,
                   epsilon_spent=max((c["epsilon"] for c in rep.combined_privacy),
                                     default=None),
                   within_target=all(c["within_target"] for c in rep.combined_privacy),
                   scratch=rep.scratch, notes=rep.notes())
        if rec["value"] is None:
            rec["error"] = "diverged (non-finite test metric)"
    except Exception as e:  # noqa: BLE001 — one row's failure must not stop the run
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        rec["traceback"] = traceback.format_exc(limit=3)
    # CPU seconds size a run on other machines (wall seconds here include waiting for cores)
    rec["seconds"], rec["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
    return rec


def _init_worker() -> None:
    logging.getLogger("absl").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")


# --- running -----------------------------------------------------------------------------

def plan_jobs(datasets: list[str], methods: dict[str, list[Spec]],
              eps_by: dict[str, list[float]], seeds: int
              ) -> list[list[tuple[str, Spec, float, int]]]:
    """Every (dataset, spec, ε, seed), in tasks for the pool, costliest first.

    A GLM dataset's jobs are grouped by (dataset, ε, seed): σ calibration is memoized per
    process and costs more than a GLM training (139 schools ≈ 10 s per ε), so one worker
    calibrates once per group. Torch jobs (tens of seconds each) are tasks of their own.
    """
    tasks: dict[tuple, list] = {}
    for d in datasets:
        for e in eps_by[d]:
            for k in range(seeds):
                for s in methods[d]:
                    key = (d, e, k, s.label) if d in TORCH_DATASETS else (d, e, k)
                    tasks.setdefault(key, []).append((d, s, e, k))

    def cost(task):  # a rough relative cost, for largest-first scheduling; measured CPU:
        # a torch job ≈ 17-22 s (Ditto, APFL, FedRep train two models: ≈ 35-45 s), a GLM
        # group ≈ 4 (heart) to 50 s (School), private tuning ≈ 10× a training
        return sum(1 + (j[0] in TORCH_DATASETS) * 30 * (2 if j[1].method in TWO_MODELS else 1)
                   + ("tuning.mode" in j[1].label) * 10 for j in task)
    return sorted(tasks.values(), key=cost, reverse=True)


def run_task(items: list[tuple[str, dict, Spec, float, int]]) -> list[dict]:
    """Run one task's jobs in turn (in a worker)."""
    return [run_job(*item) for item in items]


def run_all(tasks, bases: dict[str, dict], workers: int, say, sink: Path,
            limit: float = 0) -> list[dict]:
    """Run the tasks on a spawned process pool (one BLAS thread each); `say(i, n, record)`
    for each finished job, each record appended to `sink` (JSON lines) as it arrives.
    With `limit` > 0 (seconds) the pool is terminated then and the jobs not finished are
    recorded as such, so a run in a fixed window still gives its tables."""
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[k] = "1"  # spawned workers inherit it: `workers` processes, no oversubscription
    records: list[dict] = []
    n = sum(len(t) for t in tasks)
    end = time.monotonic() + limit if limit > 0 else math.inf
    payloads = [[(d, job_config(bases[d], s, e, k), s, e, k) for d, s, e, k in t]
                for t in tasks]
    pool = multiprocessing.get_context("spawn").Pool(workers, initializer=_init_worker)
    try:
        results = pool.imap_unordered(run_task, payloads)
        with sink.open("a") as f:
            for _ in tasks:
                try:
                    recs = results.next(timeout=max(0.0, min(end - time.monotonic(), 1e6)))
                except multiprocessing.TimeoutError:
                    break
                for rec in recs:
                    records.append(rec)
                    f.write(json.dumps(rec, default=str) + "\n")
                    f.flush()
                    say(len(records), n, rec)
    finally:
        pool.terminate()  # a time limit (or Ctrl-C) leaves no worker behind
        pool.join()
    done = {(r["dataset"], r["method"], r["epsilon"], r["seed"]) for r in records}
    return records + [{"dataset": d, "method": s.label, "epsilon": e, "seed": k, "value": None,
                       "error": f"not finished within --time-limit {limit:g} s"}
                      for t in tasks for d, s, e, k in t if (d, s.label, e, k) not in done]


def _args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", default="school,heart,vehicle,mnist")
    ap.add_argument("--methods", default=METHODS, help="GLM datasets' rows (name[:k=v]...)")
    ap.add_argument("--torch-methods", default=TORCH_METHODS, help="MNIST's rows")
    ap.add_argument("--epsilon", default="1,2,4,6,8", help="the GLM datasets' ε columns")
    ap.add_argument("--torch-epsilon", default="1,2,4,8",
                    help="MNIST's ε columns (fewer: torch jobs cost ≈ 20× a GLM group's)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--uncounted-best-lambda", action=argparse.BooleanOptionalAction,
                    default=True, help="also MR-MTL over the thesis λ grid (GLM datasets); "
                    "report the best λ per ε, uncounted (default on)")
    ap.add_argument("--set", action="append", default=[], metavar="DATASET.SECTION.KEY=V",
                    help="override a dataset's base config, e.g. school.training.rounds=20")
    ap.add_argument("--out", default="runs/bench-personalization")
    ap.add_argument("--time-limit", type=float, default=0, metavar="SECONDS",
                    help="stop the pool then; unfinished jobs become n/a cells (0 = none)")
    ap.add_argument("--from-records", default="", metavar="JSONL",
                    help="build the tables from an earlier run's records.jsonl, run nothing")
    ap.add_argument("--dry-run", action="store_true", help="print the job counts only")
    a = ap.parse_args(argv)
    try:
        eps = [float(e) for e in a.epsilon.split(",")]
        torch_eps = [float(e) for e in a.torch_epsilon.split(",")]
        a.names = [d for d in a.datasets.split(",") if d]
        bad = [d for d in a.names if d not in DATASETS]
        if bad:
            raise ValueError(f"unknown dataset(s) {bad}; choose from {', '.join(DATASETS)}")
        a.specs = {d: parse_methods(a.torch_methods if d in TORCH_DATASETS else a.methods)
                   for d in a.names}
        a.sets = parse_sets(a.set)
        a.eps = {d: torch_eps if d in TORCH_DATASETS else eps for d in a.names}
    except ValueError as e:
        ap.error(str(e))
    return a


def main(argv=None) -> int:
    a = _args(argv)
    from rich.console import Console
    con = Console(width=200)
    bases = {}
    for d in a.names:
        bases[d] = copy.deepcopy(DATASETS[d][1])
        for section, key, value in a.sets.get(d, []):
            bases[d].setdefault(section, {})[key] = value
    run_specs = {d: list(a.specs[d]) for d in a.names}
    grid = [parse_spec(f"mrmtl:lam={lam:g}") for lam in LAMS]
    if a.uncounted_best_lambda:  # GLM datasets only: the grid costs 10 trainings per cell
        for d in (d for d in a.names if d not in TORCH_DATASETS):
            run_specs[d] += [g for g in grid if g.label not in {s.label for s in a.specs[d]}]
    tasks = plan_jobs(a.names, run_specs, a.eps, a.seeds)
    counts = {d: sum(j[0] == d for t in tasks for j in t) for d in a.names}
    per = ", ".join(f"{d}: {c}" for d, c in counts.items())
    con.print(f"{sum(counts.values())} jobs ({per})"
              f" in {len(tasks)} tasks on {a.workers} workers; {SEEDED}", highlight=False)
    if a.dry_run:
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    def say(i, n, r):
        v = f"{r['value']:.4g}" if r["value"] is not None else f"n/a: {r['error'][:80]}"
        s = f"{r['seconds']:.1f} s" if r.get("seconds") is not None else "?"
        con.print(f"[{i:>4}/{n}] {r['dataset']} ε={r['epsilon']:g} seed {r['seed']} "
                  f"{r['method']}: {v} ({s})", highlight=False, markup=False)

    t0 = time.perf_counter()
    if a.from_records:
        records = [json.loads(line) for line in Path(a.from_records).read_text().splitlines()
                   if line.strip()]
    else:
        sink = out / "records.jsonl"
        sink.write_text("")
        records = run_all(tasks, bases, a.workers, say, sink, a.time_limit)
    wall = time.perf_counter() - t0
    report(a, argv, con, out, bases, records, wall)
    return 0


def report(a, argv, con, out: Path, bases: dict, records: list[dict], wall: float) -> None:
    """Print and write the tables (tables.md), every record (results.json) and figures."""
    agg = aggregate(records)
    md = [f"<!-- bench_personalization.py {' '.join(sys.argv[1:] if argv is None else argv)}"
          f" -->", f"_{SEEDED}._", ""]
    tables = {}
    for d in a.names:
        metric = next((r["metric"] for r in records if r["dataset"] == d and r.get("metric")),
                      bases[d]["model"]["metric"])
        higher = higher_is_better(metric)
        cells = agg.get(d, {})
        if a.uncounted_best_lambda and d not in TORCH_DATASETS:
            add_uncounted(cells, LAMS, higher)
        rows = [s.label for s in a.specs[d]] + ([UNCOUNTED] if UNCOUNTED in cells else [])
        header, body, notes = make_table(cells, rows, a.eps[d], a.seeds, higher)
        cap = caption(bases[d], a.seeds, higher, UNCOUNTED in cells)
        if d in TORCH_DATASETS:  # the torch jobs' ε grid is sized to the run's window
            cap += (f" ε ∈ {{{', '.join(f'{e:g}' for e in a.eps[d])}}} (torch jobs cost ≈ 20 "
                    "s of CPU each); no private tuning or uncounted λ grid on this slice.")
        md.append(markdown(DATASETS[d][0], cap, header, body, notes))
        tables[d] = {"title": DATASETS[d][0], "caption": cap, "header": header, "rows": body,
                     "notes": notes, "config": bases[d]}
        print_table(con, DATASETS[d][0], cap, header, body, notes)
        plot(out / f"{d}.png", DATASETS[d][0], cells, rows, metric)
    secs = [r["seconds"] for r in records if r.get("seconds") is not None]
    cpu = sum(r["cpu_seconds"] for r in records if r.get("cpu_seconds") is not None)
    timing = {"wall_seconds": wall, "workers": a.workers, "jobs": len(records),
              "job_seconds_sum": sum(secs), "job_cpu_seconds_sum": cpu,
              "per_job_mean": mean_by(records)}
    (out / "tables.md").write_text("\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps(
        {"note": SEEDED, "argv": sys.argv[1:] if argv is None else argv, "timing": timing,
         "tables": tables, "records": records}, indent=1, default=str))
    con.print(f"wall {wall:.1f} s on {a.workers} workers; job seconds summed "
              f"{sum(secs):.1f} s wall, {cpu:.1f} s CPU; files: {out}/tables.md, results.json, "
              f"{'' if a.from_records else 'records.jsonl, '}"
              f"{', '.join(d + '.png' for d in a.names)}")
    for key, v in sorted(timing["per_job_mean"].items()):
        con.print(f"  {key}: {v['mean']:.2f} s wall, {v['cpu']:.2f} s CPU per job × {v['n']}",
                  highlight=False)


if __name__ == "__main__":
    sys.exit(main())
