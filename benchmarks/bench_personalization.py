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
Outputs under --out: tables.md (for the README), results.json (every job), <dataset>.png.

    .venv/bin/python benchmarks/bench_personalization.py --workers 16 --uncounted-best-lambda
    .venv/bin/python benchmarks/bench_personalization.py --datasets heart,school \\
        --epsilon 1,8 --seeds 1 --set school.training.rounds=20 --workers 2 \\
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
import statistics
import sys
import time
import traceback
import warnings
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

LAMS = [0.0001, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10]  # thesis appendix B.4
SEEDED = "seeded noise: experiments, not releases (scratch budget stores)"
UNCOUNTED = "mrmtl best λ (uncounted)"
BASELINES = ("fedavg", "local")
#: issue 22's rows for the GLM datasets (methods not merged yet become n/a rows)
METHODS = ("local,fedavg,finetune,mrmtl:lam=1,mrmtl:lam=auto,ditto:lam=1,ditto:lam=auto,"
           "mrmtl:lam=auto:clip=auto,fedprox,scaffold,apfl,fedper,fedrep,"
           "mrmtl:tuning.mode=private,ditto:tuning.mode=private:tuning.method=ditto")
#: the torch rows (MNIST): no private tuning (≈ 11 trainings per job)
TORCH_METHODS = ("local,fedavg,finetune,mrmtl:lam=1,mrmtl:lam=auto,ditto:lam=auto,"
                 "mrmtl:lam=auto:clip=auto,fedprox,scaffold,apfl,fedper,fedrep,fedbn")
TORCH_DATASETS = ("mnist",)
_TUNING = {"method": "mrmtl", "lam": LAMS, "pivot_lam": 0.1, "eta": 1.0, "mean_trials": 10}
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
        {"rounds": 200, "batch_size": 32, "lr": 0.03, "clip": 1.0, "eval_every": 200}, 1e-3)),
    "heart": ("heart (4 hospitals, logistic, test accuracy)", _base(
        {"source": "heart", "test_fraction": 0.2, "seed": 0},
        {"name": "logistic", "metric": "accuracy"},
        {"rounds": 30, "batch_size": 8, "lr": 0.1, "clip": 1.0, "eval_every": 30}, 1e-4)),
    "vehicle": ("Vehicle-like (23 silos, d = 100, logistic, test accuracy)", _base(
        {"source": "synthetic", "generator": "vehicle", "test_fraction": 0.2, "seed": 0},
        {"name": "logistic", "metric": "accuracy"},
        {"rounds": 100, "batch_size": 64, "lr": 0.1, "clip": 1.0, "eval_every": 100}, 1e-4)),
    # the slice fits ~1 min of CPU per (method, ε, seed); lr 0.5 beat 0.1 for Local and
    # FedAvg at ε = 4, seed 0 (a benchmark-level choice on test, the same for every row)
    "mnist": ("Rotated & Masked MNIST slice (8 silos × 300 images, convnet, test accuracy)",
              _base({"source": "mnist", "num_silos": 8, "train_per_silo": 300,
                     "test_per_silo": 100, "mask_prob": 0.1, "seed": 0},
                    {"name": "convnet", "metric": "accuracy"},
                    {"rounds": 20, "batch_size": 50, "lr": 0.5, "clip": 1.0,
                     "eval_every": 20}, 1e-4)),
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


# --- aggregation and tables ----------------------------------------------------------------

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
            body.append([label, f"n/a: {errs[0][:70]}"] + [""] * (len(eps_list) - 1))
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
            f"(r×) = ratio to it; ':tuning.mode=private' = λ tuned privately "
            f"(RepeatAndSelect, E[h] = 10), its cost counted. {SEEDED}.")
    if uncounted:
        text += (f" '{UNCOUNTED}': MR-MTL's best λ of the thesis grid per ε, chosen on the "
                 "test metric after the fact — its choice is NOT counted (reference only).")
    return text


# --- running -----------------------------------------------------------------------------

def plan_jobs(datasets: list[str], methods: dict[str, list[Spec]], eps_list: list[float],
              seeds: int) -> list[list[tuple[str, Spec, float, int]]]:
    """Every (dataset, spec, ε, seed), in tasks for the pool, costliest first.

    A GLM dataset's jobs are grouped by (dataset, ε, seed): σ calibration is memoized per
    process and costs more than a GLM training (139 schools ≈ 10 s per ε), so one worker
    calibrates once per group. Torch jobs (tens of seconds each) are tasks of their own.
    """
    tasks: dict[tuple, list] = {}
    for d in datasets:
        for e in eps_list:
            for k in range(seeds):
                for s in methods[d]:
                    key = (d, e, k, s.label) if d in TORCH_DATASETS else (d, e, k)
                    tasks.setdefault(key, []).append((d, s, e, k))

    def cost(task):  # a rough relative cost, for largest-first scheduling
        return sum(1 + (j[0] in TORCH_DATASETS) * 30 + ("tuning.mode" in j[1].label) * 10
                   for j in task)
    return sorted(tasks.values(), key=cost, reverse=True)


def run_task(items: list[tuple[str, dict, Spec, float, int]]) -> list[dict]:
    """Run one task's jobs in turn (in a worker)."""
    return [run_job(*item) for item in items]


def run_all(tasks, bases: dict[str, dict], workers: int, say) -> list[dict]:
    """Run the tasks on a process pool (one BLAS thread each); `say(i, n, record)` for
    each finished job. A crashed worker marks its task's jobs as failed."""
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[k] = "1"  # spawned workers inherit it: `workers` processes, no oversubscription
    records: list[dict] = []
    n = sum(len(t) for t in tasks)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker) as ex:
        futs = {ex.submit(run_task, [(d, job_config(bases[d], s, e, k), s, e, k)
                                     for d, s, e, k in task]): task for task in tasks}
        pending = set(futs)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                try:
                    recs = f.result()
                except Exception as e:  # noqa: BLE001 — the worker died (memory, signal)
                    recs = [{"dataset": d, "method": s.label, "epsilon": eps, "seed": k,
                             "value": None, "seconds": None,
                             "error": f"worker failed: {type(e).__name__}: {e}"}
                            for d, s, eps, k in futs[f]]
                for rec in recs:
                    records.append(rec)
                    say(len(records), n, rec)
    return records


def plot(path: Path, title: str, cells: dict[str, dict[float, Cell]], rows: list[str],
         metric: str) -> None:
    """metric vs ε, one line per method (error bars: sd over seeds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.get_cmap("tab20").colors  # up to 20 rows without repeating a colour
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
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", default="school,heart,vehicle,mnist")
    ap.add_argument("--methods", default=METHODS, help="GLM datasets' rows (name[:k=v]...)")
    ap.add_argument("--torch-methods", default=TORCH_METHODS, help="MNIST's rows")
    ap.add_argument("--epsilon", default="1,2,4,6,8")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--uncounted-best-lambda", action="store_true",
                    help="also MR-MTL over the thesis λ grid; report the best λ (uncounted)")
    ap.add_argument("--set", action="append", default=[], metavar="DATASET.SECTION.KEY=V",
                    help="override a dataset's base config, e.g. school.training.rounds=20")
    ap.add_argument("--out", default="runs/bench-personalization")
    ap.add_argument("--dry-run", action="store_true", help="print the job counts only")
    a = ap.parse_args(argv)
    try:
        a.eps = [float(e) for e in a.epsilon.split(",")]
        a.names = [d for d in a.datasets.split(",") if d]
        bad = [d for d in a.names if d not in DATASETS]
        if bad:
            raise ValueError(f"unknown dataset(s) {bad}; choose from {', '.join(DATASETS)}")
        a.specs = {d: parse_methods(a.torch_methods if d in TORCH_DATASETS else a.methods)
                   for d in a.names}
        a.sets = parse_sets(a.set)
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
    records = run_all(tasks, bases, a.workers, say)
    wall = time.perf_counter() - t0
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
        header, body, notes = make_table(cells, rows, a.eps, a.seeds, higher)
        cap = caption(bases[d], a.seeds, higher, UNCOUNTED in cells)
        md.append(markdown(DATASETS[d][0], cap, header, body, notes))
        tables[d] = {"title": DATASETS[d][0], "caption": cap, "header": header, "rows": body,
                     "notes": notes, "config": bases[d]}
        _print_table(con, DATASETS[d][0], cap, header, body, notes)
        plot(out / f"{d}.png", DATASETS[d][0], cells, rows, metric)
    secs = [r["seconds"] for r in records if r.get("seconds") is not None]
    cpu = sum(r["cpu_seconds"] for r in records if r.get("cpu_seconds") is not None)
    timing = {"wall_seconds": wall, "workers": a.workers, "jobs": len(records),
              "job_seconds_sum": sum(secs), "job_cpu_seconds_sum": cpu,
              "per_job_mean": _mean_by(records)}
    (out / "tables.md").write_text("\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps(
        {"note": SEEDED, "argv": sys.argv[1:] if argv is None else argv, "timing": timing,
         "tables": tables, "records": records}, indent=1, default=str))
    con.print(f"wall {wall:.1f} s on {a.workers} workers; job seconds summed "
              f"{sum(secs):.1f} s wall, {cpu:.1f} s CPU; files: {out}/tables.md, results.json, "
              f"{', '.join(d + '.png' for d in a.names)}")
    for key, v in sorted(timing["per_job_mean"].items()):
        con.print(f"  {key}: {v['mean']:.2f} s wall, {v['cpu']:.2f} s CPU per job × {v['n']}",
                  highlight=False)
    return 0


def _mean_by(records: list[dict]) -> dict[str, dict]:
    """Mean job wall and CPU seconds per dataset and method (for sizing a run)."""
    by: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        if r.get("seconds") is not None:
            by.setdefault(f"{r['dataset']} {r['method']}", []).append(
                (r["seconds"], r["cpu_seconds"]))
    return {k: {"mean": statistics.fmean(w for w, _ in v),
                "cpu": statistics.fmean(c for _, c in v), "n": len(v)} for k, v in by.items()}


def _print_table(con, title, cap, header, body, notes) -> None:
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


if __name__ == "__main__":
    sys.exit(main())
