"""`silofl deploy init`: a consortium folder with per-silo configs and TLS/auth material.

Writes (library `cryptography`, no hand-made crypto):

    certs/ca.pem, certs/ca.key        the consortium CA (keep ca.key offline in production)
    certs/server.pem, certs/server.key  the server's TLS certificate (SANs: the hosts given)
    keys/<silo>.key, keys/<silo>.pub  each silo's ECDSA P-256 signing key (node identity)
    data/<silo>.npz                   with `--demo heart`: each hospital's own split
    silo_<silo>.toml                  one per silo (its data, ε, δ, store, server, keys)
    server.toml                       method, rounds, hyperparameters, silos' public keys
    keys/<silo>.ssh, .ssh.pub         the same key in OpenSSH form (SuperNode authentication)
    flower_app/, flower_home/         the Flower App and `flwr` connection (SuperLink route)

With `--schema` (the consortium's declared schema) each silo instead gets its own folder
`silos/<silo>/` and reads its own table (`consortium`); the job's defaults are the
simulator's (`server.JOB_DEFAULTS`, `default_rounds`, `default_delta`). Every route checks
its extras (flwr) and its settings before writing, and removes what it wrote on a failure.

In a real deployment each silo generates its key itself and sends only the .pub file to
the coordinator (`silofl deploy key`); the folder layout is the same.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import silofl.io as io
from silofl.config import PrivacyConfig, TrainingSection
from silofl.errors import ConfigError
from silofl.privacy.ledger import silo_file_id
from silofl.runtime.network import messages as W

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """`silofl.io.write_bytes_atomic` into folders it creates (a seam the tests fail on)."""
    io.write_bytes_atomic(path, data, mkdir=True)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(days: int = 365):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "silofl consortium CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_server_cert(ca_key, ca_cert, hosts: list[str], days: int = 365):
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def write_silo_key(folder: Path, name: str) -> tuple[Path, Path]:
    """A silo's signing key pair: keys/<name>.key (stays at the silo), keys/<name>.pub."""
    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = folder / "keys" / f"{name}.key", folder / "keys" / f"{name}.pub"
    write_bytes_atomic(priv, _pem_key(key))
    priv.chmod(0o600)
    write_bytes_atomic(pub, W.public_pem(key).encode())
    return priv, pub


def demo_data(name: str, seed: int = 0):
    """The builtin heart federation (4 hospitals), one split per silo."""
    if name != "heart":
        raise ConfigError(f"unknown demo data {name!r}; available: heart")
    from silofl.data.heart import load_heart_disease
    return load_heart_disease(seed=seed)


def write_silo_data(path: Path, silo, feature_names: list[str]) -> None:
    """A silo's .npz (what `silo_table.load_silo_data` reads), with its person ids if any."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    persons: dict[str, Any] = {f"person_{p}": _ids(getattr(silo, f"person_{p}"))
                               for p in ("train", "test")
                               if getattr(silo, f"person_{p}", None) is not None}
    io.write_npz_atomic(path, X_train=silo.X_train, y_train=silo.y_train, X_test=silo.X_test,
                     y_test=silo.y_test, feature_names=np.array(feature_names, dtype=str),
                     **persons)


def _ids(ids) -> np.ndarray:
    """Person ids as an array an .npz holds without pickle (text ids as str)."""
    a = np.asarray(ids)
    return a.astype(str) if a.dtype == object else a


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return repr(v)


def _toml(sections: dict) -> str:
    out = []
    for sec, kv in sections.items():
        out.append(f"[{sec}]")
        out += [f"{k if _NAME.match(k) else _toml_value(k)} = {_toml_value(v)}"
                for k, v in kv.items()]
        out.append("")
    return "\n".join(out)


def _check_job(job: dict, fed) -> None:
    """Validate the [job] that will be written (before anything is)."""
    from silofl.runtime.network import messages
    from silofl.runtime.network.jobspec import (
        JOB_KEYS,
        auto_clip_job,
        check_job,
        job_algorithm,
        job_config,
    )
    from silofl.runtime.network.server import JOB_DEFAULTS
    full = auto_clip_job({**JOB_DEFAULTS, "method": "mrmtl", "rounds": default_rounds(),
                          "dim": 1, **job})
    public = None if fed is None else fed.meta.get("public_X")
    if fed is not None:
        full.update(dim=fed.dim, task=fed.task)
        if public is not None:  # PrivateKT's public set: written as data/public.npz
            from silofl.runtime.network.jobspec import public_sha256
            full["public_sha256"] = public_sha256(public)
    bad = set(full) - set(JOB_KEYS)
    if bad:
        import difflib
        hints = [f"{k!r} (did you mean {near[0]!r}?)" if near else repr(k) for k in sorted(bad)
                 for near in [difflib.get_close_matches(k, JOB_KEYS, n=1)]]
        raise ConfigError(f"unknown job setting(s) {', '.join(hints)}; --set takes the [job] "
                          f"keys: {', '.join(sorted(JOB_KEYS))}")
    try:
        full = check_job(full)
        job_algorithm(full, public)
        job_config(full).validate()
    except messages.ProtocolError as e:
        raise ConfigError(str(e)) from None
    if fed is not None and full["privacy_unit"] == "person" and not fed.has_persons:
        raise ConfigError("privacy_unit = 'person' protects all rows of one person, and this "
                          "data names no person of its rows (the heart demo has no person "
                          "ids); give silos whose data names each row's person, or use "
                          "privacy_unit = 'example'. Nothing was written")


def _write_certs(out: Path, address: str, hosts: list[str] | None) -> None:
    """The consortium CA and the server's TLS certificate for `address` and `hosts`."""
    host = address.rsplit(":", 1)[0].strip("[]")
    hosts = list(dict.fromkeys([host, *(hosts or []), "127.0.0.1", "localhost"]))
    out.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = make_ca()
    srv_key, srv_cert = make_server_cert(ca_key, ca_cert, hosts)
    pem = serialization.Encoding.PEM
    write_bytes_atomic(out / "certs" / "ca.pem", ca_cert.public_bytes(pem))
    write_bytes_atomic(out / "certs" / "ca.key", _pem_key(ca_key))
    write_bytes_atomic(out / "certs" / "server.pem", srv_cert.public_bytes(pem))
    write_bytes_atomic(out / "certs" / "server.key", _pem_key(srv_key))
    for p in ("ca.key", "server.key"):
        (out / "certs" / p).chmod(0o600)


def quorum(names: list[str], job: dict, min_silos) -> dict:
    """[server] expected_silos, min_silos (default: half the silos) and, for uldp (whose
    sum must hold every silo's share, masked), min_silos = all and secagg = true."""
    if job.get("method") == "uldp":
        return {"expected_silos": len(names), "min_silos": int(min_silos or len(names)),
                "secagg": True}
    return {"expected_silos": len(names),
            "min_silos": int(min_silos or max(1, len(names) // 2))}


def _write_server(out: Path, names: list[str], job: dict, address: str, min_silos,
                  insecure: bool, extra: dict | None = None, tables: dict | None = None):
    srv = {"address": address, "state_dir": "state/server", **quorum(names, job, min_silos),
           **(extra or {})}
    srv.update({"insecure": True} if insecure else
               {"root_certificate": "certs/ca.pem", "certificate": "certs/server.pem",
                "private_key": "certs/server.key"})
    write_text_atomic(out / "server.toml", _toml({
        "server": srv, "job": job, **(tables or {}),
        "silos": {n: f"keys/{silo_file_id(n)}.pub" for n in names}}))
    # Flower's SuperLink/SuperNode route: the Flower App, the flwr CLI's connection, and
    # each silo's key as OpenSSH files for SuperNode authentication (runtime/network/flower_app)
    from silofl.runtime.network import flower_app
    written = flower_app.write_app(out, out / "server.toml", address, insecure)
    for n in names:
        flower_app.write_node_auth_key(out / "keys" / f"{silo_file_id(n)}.key")
    return written


def _silo_toml(n: str, data: str, epsilon: float, delta: float, noise: str, job: dict,
               address: str, insecure: bool, *, folder_store: bool = True,
               **extra) -> dict:
    """A silo's config. `folder_store`: its budget store is a file in the deploy folder
    (the built-in public demo only); otherwise the silo charges its user's lifetime store
    ([silo] deployment "default"), so deploying the same data again into another folder
    is not a new budget."""
    f = silo_file_id(n)
    tls = {"insecure": True} if insecure else {"root_certificate": "certs/ca.pem"}
    store = ({"budget_store": f"stores/{f}.sqlite"} if folder_store
             else {"deployment": "default"})
    return {"silo": {"name": n, "data": data, "epsilon": float(epsilon),
                     "delta": float(delta), "lifetime_epsilon": float(epsilon),
                     **store, "state_dir": f"state/{f}",
                     "private_key": f"keys/{f}.key", "noise": noise,
                     "max_rounds": _max_rounds(job), "methods": [job["method"]], **extra},
            "server": {"address": address, **tls}}


def _init_regions(out: Path, dataset: Path, *, address, hosts, epsilon, delta, job,
                  min_silos, noise, insecure, silos) -> dict:
    """`init` for graph data: one silo per region of a pandemic dataset."""
    from silofl.runtime.network.jobspec import data_module
    if silos:
        raise ConfigError("--regions names the silos itself (one per region of the data); "
                          "drop --silo/--demo")
    if noise not in ("secure", "seeded"):
        raise ConfigError(f"noise must be 'secure' or 'seeded' (experiments), got {noise!r}")
    check_address(address)
    if not dataset.is_dir():
        raise ConfigError(f"--regions must be a folder of the seven pandemic files, got "
                          f"{str(dataset)!r}")
    settings = {"method": "mrmtl", "rounds": default_rounds(), **(job or {}), "noise": noise}
    fresh = not out.exists()
    try:  # settings are checked before anything is written; a failure leaves no folder
        parts, full = data_module("graph").deploy_regions(dataset, out / "data", settings)
    except BaseException:
        if fresh and out.exists():
            import shutil
            shutil.rmtree(out)
        raise
    _write_certs(out, address, hosts)
    names = list(parts)
    configs: dict[str, str] = {}  # silo → its config file
    written: dict[str, object] = {"silos": configs, "server": str(out / "server.toml")}
    for n in names:
        write_silo_key(out, silo_file_id(n))
        cfg = _silo_toml(n, str(parts[n].relative_to(out)), epsilon, delta, noise, full,
                         address, insecure, folder_store=False, data_kind="graph")
        write_text_atomic(out / f"silo_{silo_file_id(n)}.toml", _toml(cfg))
        configs[n] = str(out / f"silo_{silo_file_id(n)}.toml")
    graph = {k: v for k, v in json.loads(full["graph"]).items() if v is not None}
    flat = {k: v for k, v in full.items() if k not in ("graph", "silos")}
    written["flower"] = _write_server(out, names, flat, address, min_silos, insecure,
                                      tables={"job.graph": graph})
    return written


def default_rounds() -> int:
    """The simulator's `[training] rounds` default (one configuration model)."""
    return TrainingSection().rounds


def default_delta() -> float:
    """The simulator's `[privacy] delta` default (one configuration model)."""
    return PrivacyConfig().delta


def _max_rounds(job: dict) -> int:
    """The rounds a silo allows: the job's (dp_gbdt: its trees, a tree being a round)."""
    if job.get("method") == "dp_gbdt":
        from silofl.runtime.network.gbdt_host import trees_json
        t = json.loads(trees_json(job.get("trees")))
        trees = t["trees"] if t["trees"] != "auto" else \
            2 * int(job.get("dim", 1)) if t["splits"] == "cyclic" else 20  # as gbdt_settings
        return int(trees + t["local_trees"])
    return int(job["rounds"])


def tables_json(job: dict | None) -> dict:
    from silofl.runtime.network.jobspec import tables_as_json
    return tables_as_json(job or {})


def check_names(names: list[str], empty: str) -> None:
    """ConfigError for no, duplicate or unprintable silo names."""
    if not names:
        raise ConfigError(empty)
    for n in names:
        if not n.strip() or len(n) > 64 or any(c in n for c in "\n\r\t\"\\"):
            raise ConfigError(f"silo name {n!r}: use 1-64 printable characters, no quotes, "
                              "backslashes or line breaks")
    if len(set(names)) != len(names):
        raise ConfigError(f"duplicate silo names in {names}")


def check_address(address: str) -> None:
    """ConfigError unless `address` is host:port with a port a server can listen on."""
    host, colon, port = address.rpartition(":")
    if not colon or not host.strip() or not port.isdigit():
        raise ConfigError(f"address must be host:port, e.g. 127.0.0.1:9092, got {address!r}")
    if not 1 <= int(port) <= 65535:
        raise ConfigError(f"address {address!r}: port {port} is not in 1..65535")


def check_common(address: str, noise: str) -> None:
    if noise not in ("secure", "seeded"):
        raise ConfigError(f"noise must be 'secure' or 'seeded' (experiments), got {noise!r}")
    check_address(address)


def _write_legacy(out: Path, names: list[str], fed, job: dict, *, address, hosts, epsilon,
                  delta, min_silos, noise, insecure, folder_store: bool = False) -> dict:
    """`init`'s writes for pre-encoded data (--demo, or a Python federation: private data,
    charged to each silo's lifetime store, never to a store in this folder)."""
    _write_certs(out, address, hosts)
    public = None if fed is None else fed.meta.get("public_X")
    if public is not None:  # public, unlabeled: the same file for the server and every silo
        (out / "data").mkdir(parents=True, exist_ok=True)
        io.write_npz_atomic(out / "data" / "public.npz", X=np.asarray(public, dtype=np.float64))
    if fed is not None:
        job.setdefault("dim", fed.dim)
        job.setdefault("task", fed.task)
        job.setdefault("num_classes", max(fed.num_classes, 2))
    job.setdefault("method", "mrmtl")
    job.setdefault("rounds", default_rounds())
    job.setdefault("noise", noise)
    configs: dict[str, str] = {}  # silo → its config file
    written: dict[str, object] = {"silos": configs, "server": str(out / "server.toml")}
    for n in names:
        f = silo_file_id(n)
        write_silo_key(out, f)
        data = f"data/{f}.npz"
        if fed is not None:
            write_silo_data(out / data, fed.silo(n), fed.feature_names)
        extra = {"public_data": "data/public.npz"} if public is not None else {}
        cfg = _silo_toml(n, data, epsilon, delta, noise, job, address, insecure,
                         folder_store=folder_store, **extra)
        write_text_atomic(out / f"silo_{f}.toml", _toml(cfg))
        configs[n] = str(out / f"silo_{f}.toml")
    written["flower"] = _write_server(
        out, names, job, address, min_silos, insecure,
        {"public_data": "data/public.npz"} if public is not None else None)
    return written
