"""Silos larger than memory (issue 25 item 3): peak resident memory and time per epoch of
`silofl run` on lazy Parquet silos (`[data] lazy = true`, `silofl.data.lazy`).

Targets: one silo of 20M rows × 100 features and 100 silos × 200k rows, each trained with
peak memory ≤ 8 GB; a 1M-row silo is also run in memory for the comparison. Every case runs
in a fresh subprocess that reports its own peak resident set (VmHWM; the OS page
cache that keeps the row files warm is not the process's) and its resident bytes after the
imports. The Parquet data (float32, one file of `ROWS_PER_FILE` rows per part, ~8 GB) is
generated once under --dir and removed at the end (kept, and reused, with --keep); both
layouts share its files by hard links: one silo (``one/big/part-*.parquet``, a directory
dataset) and 100 silos (``many/sNN.parquet``). Needs ~17 GB of free disk (data and row
files) and ~15 minutes.

Usage: python benchmarks/bench_big_silos.py [--quick] [--cases one,many,memory]
[--dir /tmp/silofl-big] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

D = 100
ROWS_PER_FILE = 200_000
FILES = 100
#: small sizes (seconds, for the test); the in-memory comparison takes `memory_files` parts
QUICK = {"rows_per_file": 20_000, "files": 20, "d": 100, "memory_files": 20}
SEED = 0


def generate(root: Path, rows_per_file: int, files: int, d: int) -> list[Path]:
    """`files` Parquet files of `rows_per_file` rows: features f0..f{d-1} (float32, N(0, 1)),
    label y = 1{x·w + noise > 0} (int8); one row group per file."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    root.mkdir(parents=True, exist_ok=True)
    done = root / f"done-{rows_per_file}x{files}x{d}"
    if done.exists():  # an earlier --keep run's parts
        return sorted(root.glob("part-*.parquet"))
    rng = np.random.default_rng(SEED)
    w = rng.standard_normal(d) / np.sqrt(d)
    paths = []
    for i in range(files):
        X = rng.standard_normal((rows_per_file, d), dtype=np.float32)
        y = (X @ w + 0.5 * rng.standard_normal(rows_per_file) > 0).astype(np.int8)
        cols = {f"f{j}": X[:, j] for j in range(d)}
        cols["y"] = y
        path = root / f"part-{i:03d}.parquet"
        pq.write_table(pa.table(cols), path, compression="none", row_group_size=rows_per_file,
                       use_dictionary=False, write_statistics=False)
        paths.append(path)
    done.touch()
    return paths


def layouts(root: Path, parts: list[Path]) -> dict[str, Path]:
    """Hard links of the parts: one silo (a directory dataset) and one file per silo."""
    one, many = root / "one" / "big", root / "many"
    one.mkdir(parents=True, exist_ok=True)
    many.mkdir(parents=True, exist_ok=True)
    for i, p in enumerate(parts):
        for link in (one / p.name, many / f"s{i:03d}.parquet"):
            if not link.exists():
                os.link(p, link)
    return {"one": root / "one", "many": many}


def schema_file(root: Path, d: int) -> Path:
    """A declared schema: every feature numeric in [-4, 4] (standardized from the bounds,
    no cost), a binary label."""
    lines = ['source = "bench_big_silos: generated N(0, 1) features"', "",
             "[label]", 'name = "y"', 'kind = "binary"', "classes = [0, 1]", ""]
    for j in range(d):
        lines += ["[[columns]]", f'name = "f{j}"', 'kind = "numeric"', "lower = -4",
                  "upper = 4", ""]
    path = root / "schema.toml"
    path.write_text("\n".join(lines))
    return path


def with_silo_column(root: Path, parts: list[Path]) -> tuple[Path, int]:
    """One Parquet file of `parts` with a silo column ("site" = "mid"): what the in-memory
    reader takes. Returns (path, rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    path, n = root / "memory.parquet", 0
    writer = None
    for p in parts:
        t = pq.read_table(p)
        t = t.append_column("site", pa.array(["mid"] * t.num_rows))
        writer = writer or pq.ParquetWriter(path, t.schema, compression="none")
        writer.write_table(t)
        n += t.num_rows
    if writer is not None:
        writer.close()
    return path, n


def config(path: Path, schema: Path, lazy: bool, cache: Path, batch: int, rounds: int,
           test_fraction: float, silo_column: str = "") -> dict:
    return {
        "data": {"source": "table", "path": str(path), "label_column": "y",
                 "silo_column": silo_column,
                 "schema": str(schema), "lazy": lazy, "cache_dir": str(cache) if lazy else "",
                 "test_fraction": test_fraction, "standardize": "declared"},
        "model": {"name": "logistic"},
        "training": {"methods": ["local"], "rounds": rounds, "batch_size": batch,
                     "lr": 0.5, "local_epochs": 1.0},
        "privacy": {"epsilon": 4.0, "delta": 1e-9, "noise": "seeded"},
        "output": {"dir": ""}, "budget": {"scratch": True}}


def child(cfg_json: str) -> None:
    """Run one case in this process; print its JSON figures on the last line."""
    from silofl.config import config_from_dict
    from silofl.data.lazy import LazyRows
    from silofl.experiments.run import run
    raw = json.loads(cfg_json)
    cfg = config_from_dict(raw)
    base = _rss()  # the interpreter and its imports, before any data
    t0 = time.perf_counter()
    ticks: list[float] = []
    rep = run(cfg, on_progress=lambda m, r, R, v: ticks.append(time.perf_counter() - t0))
    peak = _peak()
    epochs = np.diff(ticks) if len(ticks) > 1 else np.array(ticks)
    print(json.dumps({"peak_bytes": peak, "base_bytes": base,
                      "total_s": time.perf_counter() - t0,
                      "ticks": ticks, "epoch_s": float(np.mean(epochs)),
                      "materialised": LazyRows.materialised,
                      "metric": float(rep.results[0].final_pooled)}))


def _peak() -> int:
    """This process's peak resident bytes since its exec: /proc's VmHWM (the address space's
    high-water mark). Not ``ru_maxrss``: Linux carries that over from before exec, so a
    child forked from a big process (a pytest-xdist worker) reports the parent's size."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _rss() -> int:
    """This process's resident bytes now (Linux /proc)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_case(cfg: dict, timeout: float) -> dict:
    """One case in a fresh interpreter: its figures (peak resident bytes, seconds)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], env=env,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"case failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    ap.add_argument("--cases", default="one,many,memory")
    ap.add_argument("--dir", default="/tmp/silofl-big")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--child", default="")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--files", type=int, default=0, help=f"parts of {ROWS_PER_FILE:,} rows "
                    f"(--quick: {QUICK['rows_per_file']:,}); default {FILES} (quick "
                    f"{QUICK['files']}); the in-memory comparison takes up to 5 (quick 20)")
    ap.add_argument("--json", metavar="PATH", help="also write the table's figures to PATH")
    a = ap.parse_args(argv)
    if a.child:
        child(a.child)
        return {}
    size = QUICK if a.quick else {"rows_per_file": ROWS_PER_FILE, "files": FILES, "d": D,
                                  "memory_files": 5}  # 1M rows, issue 25's measured case
    if a.files:  # fewer (or more) parts; the in-memory comparison takes at most all of them
        size = dict(size, files=a.files, memory_files=min(size["memory_files"], a.files))
    root = Path(a.dir)
    t0 = time.perf_counter()
    parts = generate(root / "parts", size["rows_per_file"], size["files"], size["d"])
    print(f"generated {size['files']} × {size['rows_per_file']} rows × {size['d']} features "
          f"in {time.perf_counter() - t0:.1f} s", flush=True)
    where = layouts(root, parts)
    schema = schema_file(root, size["d"])
    n = size["rows_per_file"] * size["files"]
    tf = 0.01 if not a.quick else 0.1  # the test part is in memory: keep it small
    rows: dict = {}
    try:
        for case in a.cases.split(","):
            cache = root / "cache"
            if case == "memory":  # the comparison: 1/20 of the rows, one table file
                path, m = with_silo_column(root, parts[: size["memory_files"]])
                for lazy in (True, False):
                    cfg = config(path, schema, lazy, cache, 512, 2, tf, "site")
                    rows[f"1 silo, {'lazy' if lazy else 'in memory'} (cmp)"] = (
                        m, run_case(cfg, a.timeout))
                    shutil.rmtree(cache, ignore_errors=True)
                continue
            cfg = config(where[case], schema, True, cache, 512, 2, tf)
            name = "1 silo, lazy" if case == "one" else f"{size['files']} silos, lazy"
            rows[name] = (n, run_case(cfg, a.timeout))
            shutil.rmtree(cache, ignore_errors=True)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    report(rows, size["d"])
    if a.json:
        Path(a.json).write_text(json.dumps(
            {"d": size["d"], "cases": {k: dict(r, rows=n) for k, (n, r) in rows.items()}},
            indent=1))
    return rows


def report(rows: dict, d: int) -> None:
    print(f"{'case':<24}{'rows':>12}{'peak RSS':>11}{'(imports)':>11}{'load':>9}"
          f"{'per epoch':>11}{'accuracy':>10}")
    for name, (n, r) in rows.items():
        load = r["ticks"][0] - r["epoch_s"] if r["ticks"] else float("nan")
        print(f"{name:<24}{n:>12,}{r['peak_bytes'] / 2**30:>9.2f} G"
              f"{r['base_bytes'] / 2**30:>9.2f} G{load:>8.1f}s{r['epoch_s']:>10.2f}s"
              f"{r['metric']:>10.3f}")
    print(f"(× {d} float32 features; load = Parquet → row files + preprocessing; one epoch "
          "= one local pass, q = b/n, b = 512, DP-SGD seeded, logistic regression)")
    lazy = {k: r["peak_bytes"] / 2**30 for k, (_, r) in rows.items() if "lazy" in k}
    if lazy:
        print("target peak ≤ 8 GB: " + ", ".join(
            f"{k}: {'met' if v <= 8 else 'MISSED'}" for k, v in lazy.items()))


if __name__ == "__main__":
    main()
