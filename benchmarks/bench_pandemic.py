"""End-to-end scaling benchmark of the pandemic pipeline (figures printed, not asserted).

    .venv/bin/python benchmarks/bench_pandemic.py [--persons 250000 500000 1000000]
        [--regions 10] [--workdir /tmp/silofl-bench] [--format parquet]

For every size a synthetic outbreak is generated into ``WORKDIR/p{persons}-r{regions}-s{seed}``
(``synthesize`` is a no-op when that directory already holds the same dataset), then a
**fresh subprocess per size** (so the peak memory is that size's own) runs and times the
stages one after another:

* ``load``     — ``read_dataset(dir, with_target=True)``;
* ``features`` — ``build_regions`` (per-region dedupe, pruning, node/location tables);
* ``train``    — ``train`` with ``PandemicConfig(rounds=2, epsilon=5, batch_size=512)``,
                 federated by region, on the core engine: ``plan_regions`` (σ calibration
                 by ``runtime.plan.plan_job``, ledger preflight)
                 plus 2 rounds of MR-MTL with node-level DP-SGD;
* ``predict``  — ``predict`` over all persons;
* ``evaluate`` — ``evaluate`` (AUPRC, SIR baseline, per-region AUPRC).

`train` and `predict` each build the regions' features themselves
(`regions.build_features`, after `train` has reserved its budget); here they are handed
the features built in the ``features`` stage (``pipeline.build_features`` is patched for
the duration of the call to reuse them; with the default declared constants the features
are a deterministic function of the data and the seed, so they are the ones the calls
would build), so that every stage is timed on its own.  The public API therefore builds
the features twice (once in `train`, once in `predict`); the table's "API total" adds
the second build.  ``--rebuild-features`` runs `train` and `predict` unpatched instead
(the ``features`` stage is then measured and freed before).  Training uses the defaults
that matter for privacy: secure (OS-entropy) noise, node+edges adjacency, declared
preprocessing, an in-memory scratch budget store.

Memory per stage (Linux): before every stage the process's peak-RSS mark is reset
(``echo 5 > /proc/self/clear_refs``), so ``stage peak`` is the highest RSS *during* that
stage (VmHWM) and ``+peak`` its rise over the RSS at the stage's start; ``rss after`` is
VmRSS when the stage ends; ``cum. peak`` is the running maximum over the stages.  (The
reset also lowers ``ru_maxrss``, which reports the stage peak here; where the reset is not
allowed, ``stage peak`` falls back to the cumulative ``ru_maxrss``.)

Generation runs in its own subprocess and is not part of the end-to-end figure.
Targets (issue): 1M persons end-to-end ≤ 10 min and ≤ 3 GB peak; time near-linear in
persons.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

STAGES = ("load", "features", "train", "predict", "evaluate")
TARGET_SECONDS = 600.0
TARGET_MIB = 3 * 1024.0


# --- memory probes ----------------------------------------------------------------------

def _status_mib() -> dict[str, float]:
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    out[k] = int(v.split()[0]) / 1024.0  # kB
    except OSError:
        pass
    return out


def _ru_maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class StageMeter:
    def __init__(self, quiet: bool = False):
        self.results: dict[str, dict] = {}
        self.cum_peak = 0.0
        self.quiet = quiet

    @contextlib.contextmanager
    def stage(self, name: str):
        gc.collect()
        reset = _reset_peak()
        rss0 = _status_mib().get("VmRSS", float("nan"))
        t0 = time.perf_counter()
        yield
        dt = time.perf_counter() - t0
        st = _status_mib()
        ru = _ru_maxrss_mib()
        peak = st.get("VmHWM", ru) if reset else ru
        self.cum_peak = max(self.cum_peak, peak, ru if not reset else 0.0)
        r = {"seconds": dt, "rss_start_mib": rss0, "stage_peak_mib": peak,
             "peak_rise_mib": peak - rss0, "rss_after_mib": st.get("VmRSS", float("nan")),
             "ru_maxrss_mib": ru, "cum_peak_mib": self.cum_peak, "peak_reset": reset}
        self.results[name] = r
        if not self.quiet:
            print(f"  {name:<9} {dt:8.1f} s   stage peak {peak:7.0f} MiB (+{peak - rss0:6.0f})   "
                  f"rss after {r['rss_after_mib']:7.0f} MiB   cum. peak {self.cum_peak:7.0f} MiB   "
                  f"ru_maxrss {ru:7.0f} MiB", flush=True)


@contextlib.contextmanager
def _regions_given(regions):
    """Make `pipeline.train`/`predict` reuse the prebuilt regions' features."""
    from silofl.pandemic import pipeline

    built = {r.name: r for r in regions}
    orig = pipeline.build_features

    def reuse(data, r, cfg, constants=None):
        r.features, r.constants = built[r.name].features, built[r.name].constants
    pipeline.build_features = reuse
    try:
        yield
    finally:
        pipeline.build_features = orig


# --- subprocess phases ------------------------------------------------------------------

def _phase_generate(args) -> dict:
    from silofl.pandemic import synthesize

    t0 = time.perf_counter()
    s = synthesize(args.data, persons=args.persons, regions=args.regions, seed=args.seed,
                   format=args.format)
    st = s.get("stats", {})
    return {"seconds": time.perf_counter() - t0, "written": bool(s.get("written")),
            "generate_seconds": s.get("generate_seconds"), "rows": s.get("rows"),
            "contacts": st.get("contacts"), "peak_rss_mib": _ru_maxrss_mib(),
            "bytes": sum(f.get("bytes", 0) for f in s.get("files", {}).values())}


def _phase_pipeline(args) -> dict:
    import numpy as np

    from silofl.pandemic import pipeline as P
    from silofl.pandemic.inputs import input_dim
    from silofl.pandemic.readers import read_dataset
    from silofl.pandemic.regions import build_regions

    cfg = P.PandemicConfig(federated=True, rounds=2, epsilon=5.0, batch_size=512,
                           seed=args.seed)
    m = StageMeter()
    base = _status_mib().get("VmRSS", float("nan"))
    print(f"persons={args.persons:,} regions={args.regions} (rss after imports {base:.0f} MiB)",
          flush=True)
    with m.stage("load"):
        data = read_dataset(args.data, with_target=True)
    info = {"contacts": data.num_contacts, "days": data.num_days}
    with m.stage("features"):
        regions = build_regions(data, cfg)
    F = regions[0].features
    info.update(dim=input_dim(F, cfg.pooling), S=F.node_dp_S,
                features_mib=sum(r.features.nbytes() for r in regions) / 2**20,
                region_sizes=[r.n for r in regions])
    if args.rebuild_features:
        del regions, F
        patch = contextlib.nullcontext
    else:
        patch = lambda: _regions_given(regions)  # noqa: E731
    with m.stage("train"), patch():
        model = P.train(data, cfg)
    with m.stage("predict"), patch():
        scores = P.predict(data, model)
    with m.stage("evaluate"):
        ev = P.evaluate(data, scores)
    steps = [p["steps"] for p in model.privacy]
    eps = [p.get("epsilon_spent") for p in model.privacy]
    sig = [p["noise_multiplier"] for p in model.privacy]
    info.update(train_timings=model.timings, steps_total=int(sum(steps)),
                epsilon_spent_max=max(e for e in eps if e is not None),
                sigma_range=[min(sig), max(sig)], finite_scores=bool(np.isfinite(scores).all()))
    ev = {k: v for k, v in ev.items() if k != "per_region_auprc"} | {
        "per_region_auprc_range": [min(ev["per_region_auprc"].values()),
                                   max(ev["per_region_auprc"].values())]}
    return {"stages": m.results, "peak_mib": m.cum_peak, "eval": ev, "info": info,
            "rebuild_features": bool(args.rebuild_features)}


# --- driver -----------------------------------------------------------------------------

def _child(args, phase: str, data: Path, persons: int) -> dict:
    cmd = [sys.executable, __file__, "--phase", phase, "--data", str(data),
           "--persons", str(persons), "--regions", str(args.regions), "--seed", str(args.seed),
           "--format", args.format]
    if args.rebuild_features:
        cmd.append("--rebuild-features")
    res = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    lines = res.stdout.strip().splitlines()
    ok = res.returncode == 0 and lines and lines[-1].startswith("{")
    for line in lines[:-1] if ok else lines:
        print(line, flush=True)
    if not ok:
        raise SystemExit(f"{phase} for {persons:,} persons failed (exit {res.returncode})")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--persons", type=int, nargs="+", default=[250_000, 500_000, 1_000_000])
    ap.add_argument("--regions", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", default="parquet", choices=["csv", "csv.gz", "parquet"])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/silofl-bench"))
    ap.add_argument("--rebuild-features", action="store_true",
                    help="let train and predict build the features themselves (public API)")
    ap.add_argument("--json", type=Path, default=None, help="also write all results here")
    ap.add_argument("--phase", choices=["generate", "pipeline"], help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        args.persons = args.persons[0]
        out = _phase_generate(args) if args.phase == "generate" else _phase_pipeline(args)
        print(json.dumps(out, default=float))
        return

    results = {}
    for n in args.persons:
        data = args.workdir / f"p{n}-r{args.regions}-s{args.seed}-{args.format}"
        g = _child(args, "generate", data, n)
        print(f"generate {n:,} persons ({args.format}): "
              + (f"{g['seconds']:.1f} s (generate {g['generate_seconds']:.1f} s), peak RSS "
                 f"{g['peak_rss_mib']:.0f} MiB" if g["written"] else "reused existing dataset")
              + f", {g['contacts']:,} contacts, files {g['bytes'] / 2**20:.0f} MiB -> {data}",
              flush=True)
        r = _child(args, "pipeline", data, n)
        r["generate"] = g
        s = r["stages"]
        total = sum(s[k]["seconds"] for k in STAGES)
        r["total_seconds"] = total
        # the API (train, then predict) builds the features twice: once in each call
        r["api_total_seconds"] = total + (-1.0 if args.rebuild_features else 1.0) \
            * s["features"]["seconds"]
        i, e = r["info"], r["eval"]
        print(f"  total {total:.1f} s, peak {r['peak_mib']:.0f} MiB; D={i['dim']} S={i['S']}, "
              f"feature tables {i['features_mib']:.0f} MiB, {i['steps_total']} DP-SGD steps, "
              f"σ {i['sigma_range'][0]:.3f}..{i['sigma_range'][1]:.3f}, max ε spent "
              f"{i['epsilon_spent_max']:.3f}")
        print(f"  AUPRC {e['auprc']:.4f} (SIR baseline {e['auprc_sir_baseline']:.4f}, positive "
              f"rate {e['positive_rate']:.4f}, per-region {e['per_region_auprc_range'][0]:.4f}.."
              f"{e['per_region_auprc_range'][1]:.4f}), recall@#pos "
              f"{e['recall_at_num_positives']:.4f}\n", flush=True)
        results[n] = r

    n0 = min(results)
    per0 = results[n0]["total_seconds"] / n0
    print(f"summary (regions={args.regions}, format={args.format}"
          + (", train/predict rebuild features" if args.rebuild_features else "") + ")")
    hdr = (f"{'persons':>9} {'contacts':>11} {'gen s':>7} " + " ".join(f"{k:>8}" for k in STAGES)
           + f" {'total s':>8} {'API tot':>8} {'peak MiB':>9} {'µs/pers':>8} {'ratio':>6}"
           f" {'AUPRC':>7} {'pos rate':>8} {'lift':>6}")
    print(hdr)
    for n, r in sorted(results.items()):
        s, e, g = r["stages"], r["eval"], r["generate"]
        gen = f"{g['seconds']:7.1f}" if g["written"] else f"{'reuse':>7}"
        print(f"{n:>9,} {r['info']['contacts']:>11,} {gen} "
              + " ".join(f"{s[k]['seconds']:8.1f}" for k in STAGES)
              + f" {r['total_seconds']:8.1f} {r['api_total_seconds']:8.1f} {r['peak_mib']:9.0f}"
              f" {r['total_seconds'] / n * 1e6:8.1f} {r['total_seconds'] / n / per0:6.2f}"
              f" {e['auprc']:7.4f} {e['positive_rate']:8.4f} {e['auprc'] / e['positive_rate']:6.1f}")
    big = results[max(results)]
    ok_t = big["total_seconds"] <= TARGET_SECONDS
    ok_m = big["peak_mib"] <= TARGET_MIB
    print(f"ratio = (seconds per person) / (seconds per person at {n0:,}); 1.00 = linear.")
    print(f"targets at {max(results):,} persons: end-to-end {big['total_seconds']:.0f} s "
          f"(API {big['api_total_seconds']:.0f} s) ≤ {TARGET_SECONDS:.0f} s: "
          f"{'met' if ok_t else 'MISSED'}; peak {big['peak_mib']:.0f} MiB ≤ {TARGET_MIB:.0f} MiB: "
          f"{'met' if ok_m else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    main()
