"""`silofl deploy init`: the entry point (`init`), and with `--schema` a consortium whose
silos each read their own table (`init_tables`; `--demo`, `--regions` and a Python
federation are written by `deploy`).

Writes (everything checked before the first byte is written; on any failure the folder is
removed, so nothing is left half-written)::

    server.toml, schema.toml          the job (schema hash, feature count …) and its schema
    certs/                            the consortium CA and the server's TLS certificate
    keys/<silo>.pub                   each silo's registered public key (the server's list)
    silos/<silo>/silo.toml            the silo's config: [silo], [data], [server]
    silos/<silo>/schema.toml, ca.pem  the shared schema and the CA that signs the server
    silos/<silo>/keys/<silo>.key      the silo's signing key (stays at the silo)
    silos/<silo>/data.csv             with --split: the silo's own rows of a demo table
    flower_app/, flower_home/         Flower's SuperLink route, as `deploy init` writes it

Each `silos/<silo>/` folder is what that institution keeps: it holds no other silo's rows
and, after a job, its own released model (`models/`), its state and (by default) its
lifetime budget store.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import warnings
from pathlib import Path

from silofl.errors import ConfigError, DataError
from silofl.privacy.ledger import silo_file_id
from silofl.runtime.network import deploy

#: what `deploy init` and the programs it configures import, with the extra to install
EXTRAS = {"flwr": "flower", "cryptography": "flower"}
PLACEHOLDER = "<path of this silo's own table: CSV, CSV.gz or Parquet>"


def _module_available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def check_extras() -> None:
    """ConfigError naming the pip command when a package the network needs is missing."""
    missing = [m for m in EXTRAS if not _module_available(m)]
    if missing:
        extras = sorted({EXTRAS[m] for m in missing})
        raise ConfigError(f"the networked runtime needs {', '.join(missing)}, which is not "
                          f"installed: pip install 'silofl[{','.join(extras)}]' (nothing was "
                          "written)")


def _split_frames(split: Path, silo_column: str | None, names: list[str] | None,
                  read: tuple[str, str] = ("", "")) -> tuple[dict, int]:
    """({silo name: its rows}, the number of rows naming no silo) of the demo table `split`,
    cut by `silo_column` (read with `read` = (sep, encoding), the CLI's --sep/--encoding)."""
    from silofl.data.tabular import read_table
    if not silo_column:
        raise ConfigError("--split needs --silo-column, the column naming each row's silo")
    df = read_table(split, text_columns=[silo_column], sep=read[0], encoding=read[1],
                    settings=("--sep", "--encoding", "--drop"))
    if silo_column not in df.columns:
        raise DataError(f"--silo-column {silo_column!r} is not a column of {str(split)!r}")
    col = df[silo_column].astype("string").str.strip()
    present = list(dict.fromkeys(col.dropna()))
    chosen = names or present
    unknown = [n for n in chosen if n not in present]
    if unknown:
        raise ConfigError(f"--silo {unknown} has no rows in {str(split)!r} (column "
                          f"{silo_column!r} names {present})")
    frames = {n: df[(col == n).fillna(False).to_numpy()] for n in chosen}
    return frames, int(col.isna().sum())


def _tables(items: list[str] | None, names: list[str]) -> dict[str, str]:
    out = {}
    for item in items or []:
        name, eq, path = item.partition("=")
        if not eq or not name.strip() or not path.strip():
            raise ConfigError(f"--table {item!r}: expected NAME=PATH, e.g. A=/data/a.csv")
        if name not in names:
            raise ConfigError(f"--table {item!r}: {name!r} is not one of the silos {names}")
        if name in out:
            raise ConfigError(f"--table names silo {name!r} twice; give one table per silo")
        out[name] = str(Path(path).resolve())
        if not Path(out[name]).is_file():
            # the table may live only on the silo's machine; on one machine this is a typo
            warnings.warn(f"--table {name}: {out[name]!r} is not a file on this machine; "
                          "the silo cannot start until its [data] path names its table "
                          f"(edit its silo.toml, or run deploy init again with the right path)",
                          stacklevel=2)
    return out


def _table_names(items: list[str] | None) -> list[str]:
    """The silo names `--table NAME=PATH` gives, in order: they name the silos when no
    --silo does (the README's `--table A=… --table B=…`)."""
    return list(dict.fromkeys(i.partition("=")[0] for i in items or [] if "=" in i))


def init_tables(out: Path, *, schema: Path, silos: list[str] | None, tables: list[str] | None,
                split: Path | None, silo_column: str | None, address: str,
                hosts: list[str] | None, epsilon: float, delta: float, job: dict,
                min_silos: int | None, noise: str, insecure: bool,
                store_dir: Path | None, split_read: tuple[str, str] = ("", "")) -> dict:
    """Check everything, then write the consortium folder (see the module doc)."""
    from silofl.runtime.network.jobspec import check_job
    from silofl.runtime.network.silo_table import read_schema, schema_sha256
    check_extras()
    sch = read_schema(schema, "--schema")
    if split is not None and tables:
        raise ConfigError("--split writes each silo's table itself; drop --table")
    frames, unnamed = _split_frames(split, silo_column or sch.silo_column, silos, split_read) \
        if split else (None, 0)
    names = list(frames) if frames is not None else list(silos or _table_names(tables))
    deploy.check_names(names, "name the silos (--silo A --silo B …, or --table A=PATH …) "
                       "or give --split")
    paths = _tables(tables, names)
    lab = sch.label
    job = {"method": "mrmtl", **deploy.tables_json(job), "noise": noise,
           "schema_sha256": schema_sha256(sch), "dim": len(sch.feature_names),
           "task": lab.kind,
           "num_classes": max(len(lab.classes), 2) if lab.kind != "regression" else 2}
    job.setdefault("rounds", deploy.default_rounds())
    if job["method"] == "dp_gbdt":  # the bins' bounds, from the schema: public job data
        from silofl.data.bounds import bounds_to_json
        from silofl.runtime.network.silo_table import declared_bounds
        job["bounds"] = bounds_to_json(declared_bounds(sch, {**_defaults(), **job}))
    deploy.check_common(address, noise)
    deploy._check_job({"silos": json.dumps(names), **job}, None)
    from silofl.runtime.network.silo_table import check_preprocessing
    check_preprocessing(sch, check_job({**_defaults(), "silos": json.dumps(names), **job}))
    fresh = not out.exists()
    try:
        return _write(out, sch, schema, names, frames, unnamed, paths, job, address=address,
                      hosts=hosts, epsilon=epsilon, delta=delta, min_silos=min_silos,
                      noise=noise, insecure=insecure, store_dir=store_dir)
    except BaseException:
        if out.exists():
            shutil.rmtree(out, ignore_errors=True)
            if not fresh:
                out.mkdir()
        raise


def _defaults() -> dict:
    from silofl.runtime.network.server import JOB_DEFAULTS
    return JOB_DEFAULTS


def _write(out: Path, sch, schema_file: Path, names, frames, unnamed, paths, job, *, address,
           hosts, epsilon, delta, min_silos, noise, insecure, store_dir) -> dict:
    from silofl.runtime.network import flower_app  # flwr: checked by check_extras first

    write_bytes_atomic = deploy.write_bytes_atomic  # makes the folders it writes into
    text = Path(schema_file).read_bytes()
    deploy._write_certs(out, address, hosts)
    write_bytes_atomic(out / "schema.toml", text)
    written = {"silos": {}, "server": str(out / "server.toml"), "tables": {},
               "unnamed_rows": unnamed}
    for n in names:
        f = silo_file_id(n)
        home = out / "silos" / f
        priv, pub = deploy.write_silo_key(home, f)
        write_bytes_atomic(out / "keys" / f"{f}.pub", pub.read_bytes())
        flower_app.write_node_auth_key(priv)
        write_bytes_atomic(home / "schema.toml", text)
        write_bytes_atomic(home / "ca.pem", (out / "certs" / "ca.pem").read_bytes())
        if frames is not None:
            write_bytes_atomic(home / "data.csv", frames[n].to_csv(index=False).encode())
            data = "data.csv"
        else:
            data = paths.get(n, PLACEHOLDER)
        cfg = deploy._silo_toml(n, data, epsilon, delta, noise, job, address, insecure)
        cfg["silo"].update(state_dir="state", run_dir=".", private_key=f"keys/{f}.key")
        if store_dir:
            cfg["silo"]["budget_store"] = str(Path(store_dir).resolve() / f"{f}.sqlite")
        else:  # the user's lifetime store at the silo (not this folder: a new folder made
            del cfg["silo"]["budget_store"]  # by a new `deploy init` is not a new budget)
            cfg["silo"]["deployment"] = "default"
        cfg["silo"].pop("data")
        if not insecure:
            cfg["server"]["root_certificate"] = "ca.pem"
        cfg = {"silo": cfg["silo"], "data": {"path": data, "schema": "schema.toml"},
               "server": cfg["server"]}
        deploy.write_text_atomic(home / "silo.toml", deploy._toml(cfg))
        written["silos"][n] = str(home / "silo.toml")
        written["tables"][n] = data if data == PLACEHOLDER else str(home / data) \
            if frames is not None else data
    srv = {"address": address, "state_dir": "state/server", "run_dir": "server",
           "schema": "schema.toml", **deploy.quorum(names, job, min_silos)}
    srv.update({"insecure": True} if insecure else
               {"root_certificate": "certs/ca.pem", "certificate": "certs/server.pem",
                "private_key": "certs/server.key"})
    deploy.write_text_atomic(out / "server.toml", deploy._toml({
        "server": srv, "job": job,
        "silos": {n: f"keys/{silo_file_id(n)}.pub" for n in names}}))
    written["flower"] = flower_app.write_app(out, out / "server.toml", address, insecure)
    return written


def init(out: Path, *, silos: list[str] | None = None, demo: str | None = None,
         address: str = "127.0.0.1:9092", hosts: list[str] | None = None,
         epsilon: float = 1.0, delta: float | None = None, job: dict | None = None,
         min_silos: int | None = None, noise: str = "secure", insecure: bool = False,
         overwrite: bool = False, federation=None, regions: Path | None = None,
         schema: Path | None = None, tables: list[str] | None = None,
         split: Path | None = None, silo_column: str | None = None,
         store_dir: Path | None = None, split_sep: str = "", split_encoding: str = "") -> dict:
    """Write a consortium folder (see the module doc). Returns what was written.
    `federation` (Python API) writes each of its silos' data like `demo`; `regions` (a
    pandemic dataset folder) gives each region its own folder and a graph job; `schema`
    (the consortium's declared schema) gives each silo its own folder reading its own
    table (`tables` NAME=PATH, or the demo table `split` cut by `silo_column`; see
    `init_tables`; `split_sep`/`split_encoding` read a `split` table that is not UTF-8 or
    comma-separated). `delta` defaults to the simulator's [privacy] delta."""
    out = Path(out)
    delta = deploy.default_delta() if delta is None else delta
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file; choose a new folder")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{out} exists and is not empty; choose a new folder (key "
                          "material is never overwritten silently) or pass --overwrite")
    if (split_sep or split_encoding) and split is None:
        raise ConfigError("--sep/--encoding read the --split table; a silo's own table "
                          "(--table) takes [data] sep / encoding in its silo.toml")
    if schema is None and (tables or split or silo_column or store_dir):
        raise ConfigError("--table, --split, --silo-column and --store-dir go with --schema "
                          "(the consortium's declared schema)")
    if schema is not None:
        if demo or regions or federation is not None:
            raise ConfigError("--schema deploys silos that read their own tables; drop "
                              "--demo/--regions (or --schema)")
        return init_tables(out, schema=Path(schema), silos=silos, tables=tables,
                           split=None if split is None else Path(split),
                           silo_column=silo_column, address=address, hosts=hosts,
                           epsilon=epsilon, delta=delta, job=job or {},
                           min_silos=min_silos, noise=noise, insecure=insecure,
                           store_dir=store_dir, split_read=(split_sep, split_encoding))
    check_extras()
    if regions is not None:
        return deploy._init_regions(out, Path(regions), address=address, hosts=hosts,
                             epsilon=epsilon, delta=delta, job=job, min_silos=min_silos,
                             noise=noise, insecure=insecure, silos=silos or demo)
    fed = deploy.demo_data(demo) if demo else federation
    names = list(silos or (fed.names if fed is not None else []))
    if fed is None:  # no data to write and no schema: the silos could not start
        raise ConfigError("give --schema (the consortium's declared schema; each silo then "
                          "reads its own table: --table NAME=PATH, or --split TABLE "
                          "--silo-column COL for a one-machine demo) or --demo heart")
    deploy.check_names(names, "name the silos (--silo A --silo B …) or use --demo heart")
    if fed is not None and set(names) - set(fed.names):
        raise ConfigError(f"--demo {demo} has silos {fed.names}; unknown: "
                          f"{sorted(set(names) - set(fed.names))}")
    if noise not in ("secure", "seeded"):
        raise ConfigError(f"noise must be 'secure' or 'seeded' (experiments), got {noise!r}")
    deploy.check_address(address)
    from silofl.runtime.network.jobspec import tables_as_json
    job = tables_as_json(job or {})  # Weight Erosion's join/leave tables: JSON strings
    deploy._check_job({"silos": json.dumps(names), **job, "noise": noise}, fed)
    fresh = not out.exists()
    try:
        return deploy._write_legacy(out, names, fed, dict(job or {}), address=address, hosts=hosts,
                             epsilon=epsilon, delta=delta, min_silos=min_silos, noise=noise,
                             insecure=insecure, folder_store=bool(demo))
    except BaseException:  # nothing half-written: remove what this call wrote
        if fresh and out.exists():
            import shutil
            shutil.rmtree(out, ignore_errors=True)
        raise
