"""Benchmark the synthetic pandemic generator and the dataset reader.

    python benchmarks/bench_pandemic_synth.py --persons 250000 [--regions 10] [--format csv]

Each phase runs in a fresh subprocess so its peak RSS (resource.getrusage) is its own:

* generate: ``synthesize`` (build the population, contacts and outbreak in memory, then
  write the files; the split is reported),
* read: ``read_dataset(..., with_target=True)``.

The dataset goes to a temporary directory (removed afterwards) unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _phase(args) -> None:
    if args.phase == "generate":
        from silofl.pandemic import synthesize

        t0 = time.perf_counter()
        s = synthesize(args.out, persons=args.persons, regions=args.regions, seed=args.seed,
                       format=args.format, overwrite=True)
        out = {"seconds": time.perf_counter() - t0, "generate_seconds": s.get("generate_seconds"),
               "rows": s["rows"], "stats": s["stats"],
               "bytes": sum(f["bytes"] for f in s["files"].values())}
    else:
        from silofl.pandemic import read_dataset

        t0 = time.perf_counter()
        d = read_dataset(args.out, with_target=True)
        out = {"seconds": time.perf_counter() - t0, "summary": d.summary(),
               "in_memory_mib": (d.network.nbytes + d.states.nbytes
                                 + int(d.assignment.memory_usage(index=False).sum())) / 2**20}
    out["peak_rss_mib"] = _peak_rss_mib()
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--persons", type=int, default=250_000)
    ap.add_argument("--regions", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", default="csv", choices=["csv", "csv.gz", "parquet"])
    ap.add_argument("--out", type=Path, default=None, help="keep the dataset here (default: temp dir)")
    ap.add_argument("--phase", choices=["generate", "read"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        _phase(args)
        return
    tmp = None
    if args.out is None:
        tmp = Path(tempfile.mkdtemp(prefix="bench_pandemic_"))
        args.out = tmp / "data"
    try:
        results = {}
        for phase in ("generate", "read"):
            cmd = [sys.executable, __file__, "--phase", phase, "--persons", str(args.persons),
                   "--regions", str(args.regions), "--seed", str(args.seed), "--format", args.format,
                   "--out", str(args.out)]
            res = subprocess.run(cmd, check=True, capture_output=True, text=True)
            results[phase] = json.loads(res.stdout.strip().splitlines()[-1])
        g, r = results["generate"], results["read"]
        st = g["stats"]
        print(f"persons={args.persons:,} regions={args.regions} format={args.format}")
        print(f"  generate+write: {g['seconds']:.1f} s (generate {g['generate_seconds']:.1f} s, "
              f"write {g['seconds'] - g['generate_seconds']:.1f} s), peak RSS {g['peak_rss_mib']:.0f} MiB, "
              f"files {g['bytes'] / 2**20:.0f} MiB")
        print(f"  read:           {r['seconds']:.1f} s, peak RSS {r['peak_rss_mib']:.0f} MiB "
              f"(network+states+assignment {r['in_memory_mib']:.0f} MiB)")
        print(f"  contacts {st['contacts']:,} (mean {st['mean_contacts_per_person']:.1f}, "
              f"max {st['max_contacts_per_person']} per person), "
              f"ever infected {st['ever_infected_fraction']:.2%} "
              f"(recorded {st['ever_infected_recorded_fraction']:.2%}), label rate "
              f"{st['final_window_new_infection_fraction']:.3%}")
        print(json.dumps(results))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
