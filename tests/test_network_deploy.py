"""A consortium deploys its own table from the command line (issue 19, part 3).

Three hospitals each hold their own CSV (a messy export of the built-in UCI heart table:
text codes, blanks, a silo column) in their own folder; the consortium shares only the
declared schema. Everything runs through the `silofl` CLI as separate processes over TLS
on loopback, then `silofl predict` scores rows with each silo's saved model and with the
server's shared model. The other tests break `deploy init` and the silo's schema check the
way a newcomer (bad options, missing extras) and an attacker (another schema) would.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("flwr")

from silofl import cli  # noqa: E402
from silofl.data.heart import heart_disease_frame  # noqa: E402
from silofl.errors import ConfigError, DataError  # noqa: E402
from silofl.experiments.artifacts import load_run  # noqa: E402
from silofl.privacy.store_paths import default_store_path  # noqa: E402
from silofl.runtime.network import consortium, deploy  # noqa: E402
from silofl.runtime.network import messages as W  # noqa: E402
from silofl.runtime.network.server import JOB_DEFAULTS, ServerProgram, load_server_config  # noqa: E402
from silofl.runtime.network.silo import SiloProgram, new_nonce  # noqa: E402
from silofl.runtime.network.silo_config import load_silo_config

SCHEMA = Path(cli.__file__).parents[1] / "data" / "builtin" / "heart_schema.toml"
HOSPITALS = ["Cleveland", "Hungary", "VA Long Beach"]
TIMEOUT = 300.0  # s: generous bound for a loaded 2-core machine; fails with the logs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def messy_table(path: Path) -> pd.DataFrame:
    """The three hospitals' rows as a newcomer's export: label derived, id dropped, blanks
    where the source has none, the hospital column kept."""
    df = heart_disease_frame()
    df = df[df["dataset"].isin(HOSPITALS)].copy()
    df["disease"] = (df["num"] > 0).astype("int64")
    df = df.drop(columns=["id", "num"]).sample(frac=1.0, random_state=3)
    df.loc[df.index[::17], "chol"] = np.nan          # gaps in nullable columns
    df.loc[df.index[::23], "cp"] = np.nan
    df.to_csv(path, index=False)
    return df


def silofl(*args: str, cwd: Path, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "silofl.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=_env())


def _env() -> dict:
    env = dict(os.environ)
    src = str(Path(cli.__file__).resolve().parents[2])  # src/silofl/cli/__init__.py
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    return env


def auroc(score: np.ndarray, y: np.ndarray) -> float:
    """Mann-Whitney AUROC (ties count half): P(score of a positive > score of a negative)."""
    pos, neg = score[y == 1], score[y == 0]
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def wait_listening(port: int, proc: subprocess.Popen, log: Path) -> None:
    """Readiness: the server's port accepts connections (no sleep-as-synchronisation:
    polled, bounded, failing with the server's log)."""
    end = time.monotonic() + TIMEOUT
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited ({proc.returncode}):\n"
                                 + log.read_text()[-3000:])
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"the server did not listen within {TIMEOUT:g} s:\n"
                         + log.read_text()[-3000:])


@pytest.mark.network
@pytest.mark.slow
def test_three_hospitals_deploy_from_the_cli_over_tls_and_predict(tmp_path):
    table = tmp_path / "hospitals.csv"
    df = messy_table(table)
    port = free_port()
    rounds = 4
    t0 = time.monotonic()
    res = silofl("deploy", "init", "--out", "c", "--schema", str(SCHEMA), "--split",
                 str(table), "--silo-column", "dataset", "--address", f"127.0.0.1:{port}",
                 "--rounds", str(rounds), "--set", "lr=0.1", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    c = tmp_path / "c"
    server_toml = tomllib.loads((c / "server.toml").read_text())
    assert server_toml["job"]["dim"] == 34 and len(server_toml["job"]["schema_sha256"]) == 64
    homes = {}
    for name in HOSPITALS:  # each hospital's folder holds its own rows only, and its schema
        cfg = tomllib.loads(next((c / "silos").glob(f"{name.replace(' ', '_')}-*/silo.toml"))
                            .read_text())
        home = next((c / "silos").glob(f"{name.replace(' ', '_')}-*"))
        homes[name] = home
        own = pd.read_csv(home / cfg["data"]["path"])
        assert set(own["dataset"]) == {name} and len(own) == int((df["dataset"] == name).sum())
        assert (home / "schema.toml").read_bytes() == SCHEMA.read_bytes()
        # no store path in the folder: the silo charges its user's lifetime store, so a new
        # `deploy init` folder is not a new budget
        assert "budget_store" not in cfg["silo"] and cfg["silo"]["deployment"] == "default"
    logs = {n: tmp_path / f"{n}.log" for n in ["server", *HOSPITALS]}
    files = {n: open(p, "w") for n, p in logs.items()}
    procs = {"server": subprocess.Popen(
        [sys.executable, "-m", "silofl.cli", "server", "--config", "c/server.toml"],
        cwd=tmp_path, stdout=files["server"], stderr=subprocess.STDOUT, env=_env())}
    try:
        wait_listening(port, procs["server"], logs["server"])
        for name in HOSPITALS:  # each silo from its own folder: only its files are read
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "silofl.cli", "silo", "--config", "silo.toml",
                 "--wait", str(TIMEOUT)], cwd=homes[name], stdout=files[name],
                stderr=subprocess.STDOUT, env=_env())
        end = time.monotonic() + TIMEOUT
        for name, p in procs.items():
            try:
                p.wait(timeout=max(1.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{name} did not finish within {TIMEOUT:g} s:\n"
                                     + logs[name].read_text()[-3000:]) from None
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in files.values():
            f.close()
    wall = time.monotonic() - t0
    for name, p in procs.items():
        assert p.returncode == 0, f"{name}:\n" + logs[name].read_text()[-3000:]
    assert "TLS on" in logs["server"].read_text()
    print(f"\n3-silo CLI run over TLS: {rounds} rounds, {wall:.1f} s wall (deploy init to "
          "last exit)")

    # predict with each silo's own model, and with the server's shared model
    rows = tmp_path / "rows.csv"
    df.drop(columns=["disease"]).to_csv(rows, index=False)
    y = df["disease"].to_numpy()
    majority = max(y.mean(), 1 - y.mean())
    for name, run in [*((n, homes[n]) for n in HOSPITALS), ("shared", c / "server")]:
        out = tmp_path / f"pred-{name.replace(' ', '_')}.csv"
        res = silofl("predict", "--run", str(run), "--silo", name, "--data", str(rows),
                     "--out", str(out), cwd=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
        pred = pd.read_csv(out)
        assert len(pred) == len(df) and set(pred.columns) == {"score", "class"}
        # the CLI's predictions are the Python loader's (same files, same process-free math)
        saved = load_run(run)
        py = saved.predictor(name).predict(df.drop(columns=["disease"]))
        np.testing.assert_allclose(pred["score"].to_numpy(), py, rtol=1e-9, atol=1e-12)
        # a useful model: it ranks the pooled rows far better than a constant score (AUROC
        # 0.5; a hospital's personal model is calibrated to its own prevalence, so its
        # accuracy on the others' rows is not the measure), and the shared model beats the
        # majority-class rate
        auc, acc = auroc(pred["score"].to_numpy(), y), float((pred["class"] == y).mean())
        print(f"{name}: AUROC {auc:.3f}, accuracy {acc:.3f} (majority {majority:.3f})")
        assert auc > 0.7, (name, auc)
        if name == "shared":
            assert acc > majority + 0.1, (acc, majority)
        card = saved.model_card(name)
        assert card["networked"] and card["privacy"]["private"]
    card = load_run(homes["Hungary"]).model_card("Hungary")
    p = card["privacy"]
    # the card states the silo's own guarantee: its (ε, δ), the rounds it ran, its store
    assert p["delta"] == deploy.default_delta() and p["rounds_run"] == rounds
    assert 0 < p["epsilon"] <= p["target_epsilon"] * (1 + 1e-6)
    assert p["budget_store"] == str(default_store_path().resolve())
    assert abs(p["lifetime"]["epsilon"] - p["epsilon"]) < 1e-6 * p["epsilon"]
    assert "add/remove one record" in p["adjacency"] and p["noise"] == "secure"
    shared_card = load_run(c / "server").model_card("shared")
    assert "that silo's own model card" in shared_card["privacy"]["statement"]


def _deploy(tmp_path, *args):
    from typer.testing import CliRunner
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CliRunner().invoke(cli.app, ["deploy", "init", "--out", str(tmp_path / "c"),
                                            *args])


def test_deploy_init_refuses_bad_options_before_writing_anything(tmp_path, monkeypatch):
    table = tmp_path / "t.csv"
    messy_table(table)
    cases = [
        (["--silo", "A", "--silo", "B"], "give --schema"),
        (["--schema", str(tmp_path / "nope.toml"), "--silo", "A"], "not found"),
        (["--schema", str(SCHEMA), "--split", str(table), "--silo-column", "nope"],
         "not a column"),
        (["--schema", str(SCHEMA), "--split", str(table), "--silo-column", "dataset",
          "--silo", "Mars"], "has no rows"),
        (["--schema", str(SCHEMA), "--silo", "A", "--table", "B=x.csv"], "not one of"),
        (["--schema", str(SCHEMA), "--silo", "A", "--table", "A"], "NAME=PATH"),
        (["--schema", str(SCHEMA), "--silo", "A", "--silo", "B", "--set",
          "standardize='uncharged'"], "without a charge are never computed"),
        (["--schema", str(SCHEMA), "--silo", "A", "--method", "magic"],
         "does not run over the network"),
        (["--table", "A=x.csv", "--demo", "heart"], "go with --schema"),
    ]
    for args, msg in cases:
        res = _deploy(tmp_path, *args)
        text = " ".join(res.output.split())
        assert res.exit_code == 2 and msg in text, (args, text)
        assert not (tmp_path / "c").exists(), args
    # the extras are checked first: without flwr nothing is written, the fix is named
    monkeypatch.setattr(consortium, "_module_available", lambda m: m != "flwr")
    for args in (["--schema", str(SCHEMA), "--silo", "A"], ["--demo", "heart"]):
        res = _deploy(tmp_path, *args)
        text = " ".join(res.output.split())
        assert res.exit_code == 2 and "pip install 'silofl[flower]'" in text, text
        assert not (tmp_path / "c").exists()


def test_a_failure_while_writing_leaves_no_folder(tmp_path, monkeypatch):
    """A crash half-way (here: the fifth file) removes everything deploy init wrote."""
    calls = {"n": 0}
    real = deploy.write_bytes_atomic

    def failing(path, data):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError("disk full")
        real(path, data)
    monkeypatch.setattr(deploy, "write_bytes_atomic", failing)
    with pytest.raises(OSError):
        consortium.init(tmp_path / "c", schema=SCHEMA, silos=["A", "B"])
    assert not (tmp_path / "c").exists()


def test_placeholder_table_and_defaults_from_the_simulators_config(tmp_path):
    """Without --table each silo.toml names a placeholder the operator must fill in (a
    clear refusal until then); the job's defaults are the simulator's."""
    from silofl.config import Config
    w = consortium.init(tmp_path / "c", schema=SCHEMA, silos=["A", "B"])
    with pytest.raises(ConfigError, match="placeholder"):
        load_silo_config(w["silos"]["A"])
    cfg = load_server_config(w["server"])
    t, p = Config().training, Config().privacy
    assert (cfg.job["batch_size"], cfg.job["lr"], cfg.job["rounds"]) == \
        (t.batch_size, t.lr, t.rounds)
    assert JOB_DEFAULTS["accountant"] == p.accountant
    assert tomllib.loads(Path(w["silos"]["A"]).read_text())["silo"]["delta"] == p.delta
    # --store-dir: each silo's lifetime store at a path the operator chose, outside the folder
    w2 = consortium.init(tmp_path / "c2", schema=SCHEMA, silos=["A", "B"],
                     tables=["A=a.csv", "B=b.csv"], store_dir=tmp_path / "stores")
    cfg = load_silo_config(w2["silos"]["B"])
    from silofl.privacy.ledger import silo_file_id
    assert cfg.budget_store == (tmp_path / "stores" / f"{silo_file_id('B')}.sqlite").resolve()
    assert cfg.data == Path("b.csv").resolve() and cfg.release_dir == Path(w2["silos"]["B"]).parent


def _silo_with_own_table(tmp_path, name: str, schema_text: str | None = None):
    table = tmp_path / "t.csv"
    df = messy_table(table)
    (tmp_path / f"{name}.csv").write_text(df[df["dataset"] == name].to_csv(index=False))
    w = consortium.init(tmp_path / "c", schema=SCHEMA, silos=[name, "Hungary"],
                    tables=[f"{name}={tmp_path / f'{name}.csv'}",
                            f"Hungary={tmp_path / 'Hungary.csv'}"], noise="seeded")
    if schema_text is not None:  # this silo's copy of the schema was changed
        (Path(w["silos"][name]).parent / "schema.toml").write_text(schema_text)
    return w


def test_a_silo_whose_schema_differs_refuses_the_job(tmp_path):
    text = SCHEMA.read_text().replace("upper = 100", "upper = 110", 1)
    assert text != SCHEMA.read_text()
    w = _silo_with_own_table(tmp_path, "Cleveland", text)
    srv = ServerProgram(load_server_config(w["server"]))
    prog = SiloProgram(load_silo_config(w["silos"]["Cleveland"]))
    rep = prog.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
                     "job": W.canonical(srv.job).decode()})
    assert rep["status"] == "refused"
    assert "its schema" in rep["reason"] and "differs from the job's" in rep["reason"]
    assert prog.plan is None  # nothing planned, nothing reserved
    with prog.store as st:
        assert "Cleveland" not in st.silos() or not st.charges("Cleveland")


def test_silo_encodes_its_own_table_like_silofl_run(tmp_path):
    """One reader, one schema: the silo's rows, encoded and split by the same code as
    `silofl run` reads a table with a declared schema, on its own rows alone."""
    from silofl.data.preprocess import PreprocessSpec, preprocess_without_budget
    from silofl.data.schema import load_schema
    from silofl.data.tabular import federation_from_frame_raw
    w = _silo_with_own_table(tmp_path, "Cleveland")
    srv = ServerProgram(load_server_config(w["server"]))
    prog = SiloProgram(load_silo_config(w["silos"]["Cleveland"]))
    rep = prog.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
                     "job": W.canonical(srv.job).decode()})
    assert rep["status"] == "ok", rep["reason"]
    own = pd.read_csv(tmp_path / "Cleveland.csv")
    ref = preprocess_without_budget(federation_from_frame_raw(
        own, "dataset", "disease", schema=load_schema(SCHEMA)), PreprocessSpec())
    np.testing.assert_allclose(prog.silo.X_train, ref.silos[0].X_train, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(prog.silo.y_test, ref.silos[0].y_test)
    assert prog.dim == srv.job["dim"] == len(load_schema(SCHEMA).feature_names)
    json.dumps(prog.constants)  # what the card will carry is plain data


def test_saved_models_reproduce_what_the_silo_and_server_computed(tmp_path):
    """The card's preprocessing applied to a silo's raw rows gives exactly the features it
    trained on: its saved model predicts what its own model gives on its own preprocessed
    test rows, and the server's shared model likewise (declared constants, from the
    schema alone, equal the silos')."""
    from silofl.runtime.network import release
    from silofl.runtime.network.jobspec import job_model
    table = tmp_path / "t.csv"
    df = messy_table(table)
    for n in HOSPITALS:
        df[df["dataset"] == n].to_csv(tmp_path / f"{n}.csv", index=False)
    w = consortium.init(tmp_path / "c", schema=SCHEMA, silos=HOSPITALS, noise="seeded",
                    tables=[f"{n}={tmp_path / f'{n}.csv'}" for n in HOSPITALS],
                    job={"rounds": 2, "method": "fedavg"})
    for p in w["silos"].values():
        raw = tomllib.loads(Path(p).read_text())
        raw["silo"]["methods"] = ["fedavg"]
        Path(p).write_text(deploy._toml(raw))
    srv = ServerProgram(load_server_config(w["server"]))
    silos = {n: SiloProgram(load_silo_config(p)) for n, p in w["silos"].items()}
    job = W.canonical(srv.job).decode()
    for s in silos.values():
        rep = s.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(), "job": job})
        assert rep["status"] == "ok", rep["reason"]
        srv.accept_join(rep)
    for t in (1, 2):
        updates = {}
        for n, s in silos.items():
            rep, upd = s.round(srv.request(n, t), [srv.message])
            updates[n] = srv.accept_update(n, t, rep, [] if upd is None else [upd])[1]
        srv.step(t, updates)
    model = job_model(srv.job)
    shared_dir = release.save_server_release(srv)
    for n, s in silos.items():
        run = release.save_silo_release(s)
        raw_test = s.raw.silos[0].X_test  # encoded, before preprocessing (NaN = missing)
        assert np.isnan(raw_test).any()  # the messy table's gaps reach the card's fills
        mine = load_run(run).predictor(n).predict(raw_test)
        np.testing.assert_allclose(mine, model.predict(s.final_model(), s.silo.X_test),
                                   rtol=1e-12, atol=1e-12)
        shared = load_run(shared_dir).predictor(release.SHARED).predict(raw_test)
        np.testing.assert_allclose(shared, model.predict(srv.server.params, s.silo.X_test),
                                   rtol=1e-12, atol=1e-12)
        # FedAvg's personal model is the shared model one round behind (its last broadcast)
        assert not np.allclose(mine, shared)
    # the manifests carry hashes, as `silofl run`'s do: a silo's model file replaced by
    # another valid model (the server's, which differs by a round) is refused on load
    a = Path(release.save_silo_release(silos[HOSPITALS[0]]))
    fa = next((a / "models" / "fedavg").glob("model-*.npz"))
    fa.write_bytes((Path(shared_dir) / "models" / "fedavg" / "shared.npz").read_bytes())
    with pytest.raises(DataError, match="SHA-256"):
        load_run(a).predictor(HOSPITALS[0])
    (Path(shared_dir) / "models" / "fedavg" / "shared.npz").write_bytes(b"truncated")
    with pytest.raises(DataError, match="SHA-256"):
        load_run(shared_dir).predictor(release.SHARED)


def test_silo_cli_names_the_missing_table_and_exits_2(tmp_path):
    """A newcomer starts a silo before writing its table's path, then with a wrong path:
    a specific error and exit code 2 each time, no traceback, nothing charged."""
    from typer.testing import CliRunner
    w = consortium.init(tmp_path / "c", schema=SCHEMA, silos=["A", "B"])
    res = CliRunner().invoke(cli.app, ["silo", "--config", w["silos"]["A"], "--wait", "1"])
    assert res.exit_code == 2 and "placeholder" in " ".join(res.output.split())
    raw = tomllib.loads(Path(w["silos"]["A"]).read_text())
    raw["data"]["path"] = "missing.csv"
    Path(w["silos"]["A"]).write_text(deploy._toml(raw))
    res = CliRunner().invoke(cli.app, ["silo", "--config", w["silos"]["A"], "--wait", "1"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "data file not found" in text and "missing.csv" in text
    assert not (Path(w["silos"]["A"]).parent / "budget.sqlite").exists()
    assert not default_store_path().exists()  # the data is read before the store opens


def test_a_failure_while_writing_the_demo_leaves_no_folder(tmp_path, monkeypatch):
    real, calls = deploy.write_bytes_atomic, {"n": 0}

    def failing(path, data):
        calls["n"] += 1
        if calls["n"] == 7:
            raise OSError("disk full")
        real(path, data)
    monkeypatch.setattr(deploy, "write_bytes_atomic", failing)
    with pytest.raises(OSError):
        consortium.init(tmp_path / "c", demo="heart")
    assert calls["n"] == 7 and not (tmp_path / "c").exists()


def _drive(srv, silos: dict, rounds) -> None:
    for t in rounds:
        updates = {}
        for n, s in silos.items():
            rep, upd = s.round(srv.request(n, t), [srv.message])
            assert rep["status"] == "ok", rep["reason"]
            updates[n] = srv.accept_update(n, t, rep, [] if upd is None else [upd])[1]
        srv.step(t, updates)


def test_private_preprocessing_is_charged_at_the_silo_once_and_survives_a_restart(tmp_path):
    """standardize/impute = 'private': each silo's Gaussian release is composed into its σ,
    reserved with its first round and spent before it reads a row; a restarted silo applies
    the released constants from its state (no second release, no second charge); its card's
    ε covers the release and equals what its store counts; the server keeps no shared
    model, which would have no single preprocessing."""
    from silofl.privacy.budget import BudgetStore
    from silofl.runtime.network import release
    from silofl.runtime.network.jobspec import job_model
    df = messy_table(tmp_path / "t.csv")
    for n in HOSPITALS:
        df[df["dataset"] == n].to_csv(tmp_path / f"{n}.csv", index=False)
    w = consortium.init(tmp_path / "c", schema=SCHEMA, silos=HOSPITALS, noise="seeded",
                    tables=[f"{n}={tmp_path / f'{n}.csv'}" for n in HOSPITALS],
                    job={"rounds": 2, "standardize": "private", "impute": "private"})
    srv = ServerProgram(load_server_config(w["server"]))
    silos = {n: SiloProgram(load_silo_config(p)) for n, p in w["silos"].items()}
    job = W.canonical(srv.job).decode()
    for s in silos.values():
        rep = s.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(), "job": job})
        assert rep["status"] == "ok", rep["reason"]
        assert s.table_release_due and s.plan.calibrated_for.endswith("preprocessing")
        srv.accept_join(rep)
    name = "Hungary"
    store = Path(load_silo_config(w["silos"][name]).budget_store)
    with BudgetStore(store) as st:
        assert not st.charges(name)  # joined and planned: nothing spent, nothing read
    _drive(srv, silos, [1])
    first = silos[name]
    X1, constants = first.silo.X_train.copy(), first.constants
    assert not first.table_release_due and not np.isnan(X1).any()
    # the private constants differ from the declared ones (a release, not the schema's)
    from silofl.runtime.network.silo_table import declared_constants
    declared = declared_constants(first.schema, {**srv.job, "standardize": "declared",
                                                 "impute": "declared"})
    assert constants["silos"][name]["standardize"] != declared["standardize"]
    # a restart: a fresh program re-accepts the job from its state dir, no new release
    silos[name] = again = SiloProgram(load_silo_config(w["silos"][name]))
    assert again.resume() and not again.table_release_due
    np.testing.assert_array_equal(again.silo.X_train, X1)
    _drive(srv, silos, [2])
    with BudgetStore(store) as st:
        labels = [r["label"] for r in st.charges(name)]
        spent = st.spent(name)
    assert labels.count("preprocess") == 1 and len(labels) == 3, labels  # + 2 rounds
    assert 0.9 * again.cfg.epsilon < spent["epsilon"] <= again.cfg.epsilon * (1 + 1e-6)
    run = release.save_silo_release(again)
    card = load_run(run).model_card(name)
    assert abs(card["privacy"]["epsilon"] - spent["epsilon"]) < 1e-6 * spent["epsilon"]
    assert "private preprocessing release" in card["privacy"]["statement"]
    raw_test = again.raw.silos[0].X_test
    np.testing.assert_allclose(load_run(run).predictor(name).predict(raw_test),
                               job_model(srv.job).predict(again.final_model(),
                                                          again.silo.X_test),
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(ConfigError, match="no single preprocessing"):
        release.save_server_release(srv)
