"""Weight Erosion's participation schedule over the network (runtime/network): the server
asks only the silos of each round's public schedule, each silo checks the schedule itself
and charges only the rounds it runs. Silo and server programs in this process (no gRPC),
as in test_network.py."""

from __future__ import annotations

import json
import socket
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from silofl.data.heart import load_heart_disease  # noqa: E402
from silofl.errors import ConfigError  # noqa: E402
from silofl.privacy.budget import BudgetStore  # noqa: E402
from silofl.privacy.targets import PrivacyTarget  # noqa: E402
from silofl.runtime.network import consortium as network_init  # noqa: E402
from silofl.runtime.network import deploy
from silofl.runtime.network import messages as W

DELTA = deploy.default_delta()  # each silo's δ as `deploy init` writes it
from silofl.runtime.network.jobspec import check_job, job_algorithm, job_config, job_model  # noqa: E402
from silofl.runtime.network.server import ServerProgram, load_server_config  # noqa: E402
from silofl.runtime.network.silo import SiloProgram, new_nonce  # noqa: E402
from silofl.runtime.network.silo_config import load_silo_config  # noqa: E402
from silofl.runtime.simulator import simulate  # noqa: E402
from test_network import _drive, _store_events  # noqa: E402  (tests/ is on the import path)

ROUNDS = 6
# heart: Cleveland, Hungary (the user u_0), Switzerland (joins at 3), VA Long Beach (leaves
# at 5); every silo but the user takes part in a round with probability 1/2
SCHEDULE = {"method": "weight_erosion", "rounds": ROUNDS, "we_user": "Hungary",
            "we_p_d": 0.5, "we_participation": 0.5, "seed": 3, "batch_size": 16,
            "lr": 0.1, "local_epochs": 0.5,
            "we_join_round": json.dumps({"Switzerland": 3}),
            "we_leave_round": {"VA Long Beach": 5}}  # a table: deploy writes its JSON


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def consortium(tmp: Path, **job) -> dict:
    """A seeded heart consortium whose silos consent to Weight Erosion."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = network_init.init(tmp / "c", demo="heart", noise="seeded", min_silos=2,
                        address=f"127.0.0.1:{free_port()}", job={**SCHEDULE, **job})
    for p in w["silos"].values():
        raw = tomllib.loads(Path(p).read_text())
        raw["silo"]["methods"] = ["weight_erosion"]
        Path(p).write_text(deploy._toml(raw))
    return w


def store_rows(store, name) -> tuple[list[int], dict, set]:
    """From a silo's charges in a store: the rounds charged (each networked charge's run
    command ends with its round), the multiset of base DP events, and the statuses."""
    got, statuses = _store_events(store, name)
    with BudgetStore(store) as s:
        rows = s.charges(name)
    rounds = sorted(int(r["command"].rsplit(" ", 1)[1]) for r in rows
                    if r["command"].startswith("silo "))
    return rounds, got, set(statuses)


def drive(program: ServerProgram, silos: dict) -> None:
    """Join every silo, then each round ask the server's selection, as `silofl server`'s
    strategy does (`SiloflStrategy.configure_fit`), and run the server step."""
    _drive(program, silos, ROUNDS)


def scheduled(job: dict) -> np.ndarray:
    """(rounds, K) bool: the job's public participation schedule."""
    alg = job_algorithm(job)
    alg.init(job_model(job).init_params(), len(json.loads(job["silos"])), rounds=ROUNDS)
    return np.array([alg.present(t) for t in range(1, ROUNDS + 1)])


def check_schedule_kept(w: dict, program: ServerProgram, names: list[str]) -> np.ndarray:
    """The server asked each round exactly the scheduled silos, and each silo's store holds
    a charge for exactly its scheduled rounds (all charged); returns the schedule."""
    schedule = scheduled(program.job)
    assert schedule[:, 1].all() and not schedule[:2, 2].any() and schedule[2:, 2].any()
    if program.job["we_participation"] < 1:  # some silos miss rounds (VA leaves at 5)
        assert not schedule[4:, 3].any()
        assert 0 < schedule[:, [0, 2, 3]].sum() < 3 * ROUNDS - 4
    else:  # all but the late joiner take part in every round: present is still a mask
        assert schedule[:, [0, 1, 3]].all() and schedule[2:].all()
    assert program.done == ROUNDS
    asked = [sorted(r["silos"], key=names.index) for r in program.log]
    assert asked == [[n for k, n in enumerate(names) if row[k]] for row in schedule]
    for k, n in enumerate(names):
        rounds, _, status = store_rows(load_silo_config(w["silos"][n]).budget_store, n)
        assert rounds == [t + 1 for t in np.flatnonzero(schedule[:, k])]
        assert status == {"charged"} and program.silos[n].rounds == rounds
    return schedule


@pytest.mark.parametrize("options", [
    {},
    {"we_update": "local_sgd", "we_count": "participated", "we_newcomer": "mean"},
    {"we_participation": 1.0, "we_leave_round": {}, "we_newcomer": "median"}])
def test_scheduled_erosion_over_the_network_equals_the_per_silo_simulator(tmp_path, options):
    """With participation 1/2, a join and a leave round (or only a join round): the server
    asks each round exactly the silos of the public schedule (and they accept); α after
    every round and the final model equal the simulator's per-silo mode (seeded noise),
    and each silo's store holds exactly the rounds it was scheduled for, with the
    simulator's events for that silo."""
    w = consortium(tmp_path, **options)
    cfg = load_server_config(w["server"])
    program = ServerProgram(cfg)
    drive(program, {n: SiloProgram(load_silo_config(p)) for n, p in w["silos"].items()})
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(1.0, DELTA))
    check_schedule_kept(w, program, fed.names)
    alg = job_algorithm(cfg.job)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(fed, job_model(cfg.job), alg, job_config(cfg.job), hosting="per_silo",
                       store=BudgetStore(tmp_path / "sim.sqlite"))
    np.testing.assert_array_equal(np.array(program.algorithm.alpha_history),
                                  np.array(alg.alpha_history))  # NaN: not joined yet
    assert np.isnan(alg.alpha_history[0][2]) and np.isfinite(alg.alpha_history[-1]).all()
    np.testing.assert_array_equal(program.server.params, res.params[0])
    for n in fed.names:
        got = store_rows(load_silo_config(w["silos"][n]).budget_store, n)[1]
        assert got == store_rows(tmp_path / "sim.sqlite", n)[1]


def test_scheduled_erosion_over_flowers_superlink_route(tmp_path):
    """The same schedule through Flower's ServerApp/ClientApp (in process, `LoopbackGrid`;
    a fresh ClientApp per message, so its seeded stream differs from the simulator's): the
    server loop asks only the scheduled silos and each store holds exactly their rounds."""
    from flwr.app import Context, RecordDict

    from silofl.runtime.network import flower_app
    w = consortium(tmp_path, we_count="participated", we_newcomer="median")
    grid = flower_app.LoopbackGrid({100 + i: {"silo-config": str(w["silos"][n])}
                                    for i, n in enumerate(sorted(w["silos"]))})
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                  run_config={"server-config": str(w["server"])})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = flower_app.run_server_app(grid, ctx)
    check_schedule_kept(w, program, load_heart_disease(seed=0).names)
    alpha = np.array(program.algorithm.alpha_history)
    assert np.isnan(alpha[:2, 2]).all() and np.isfinite(alpha[2:]).all()
    assert np.isfinite(program.server.params).all()


def test_a_silo_refuses_a_round_it_is_not_scheduled_for(tmp_path):
    """A server that asks a silo outside the public schedule (before its join round) is
    refused by the silo, which computes the schedule itself: nothing run, nothing charged;
    the honest server's selection leaves that silo out."""
    w = consortium(tmp_path)
    program = ServerProgram(load_server_config(w["server"]))
    name = "Switzerland"  # joins at round 3
    silo = SiloProgram(load_silo_config(w["silos"][name]))
    program.accept_join(silo.join({"protocol": W.PROTOCOL, "kind": "join",
                                   "nonce": new_nonce(),
                                   "job": W.canonical(program.job).decode()}))
    assert name not in program.selected(1, [name])
    rep, update = silo.round(program.request(name, 1), [program.message])
    assert rep["status"] == "refused" and update is None
    assert "absent from round 1" in rep["reason"] and "nothing was charged" in rep["reason"]
    W.verify(W.load_public_key(program.cfg.silos[name]), rep, None)  # signed by the silo
    with BudgetStore(silo.cfg.budget_store) as s:
        assert s.charges(name) == []
    assert silo.done == 0


@pytest.mark.parametrize("job,key", [
    ({"we_participation": 0.0}, "we_participation"),
    ({"we_participation": 1.5}, "we_participation"),
    ({"we_join_round": "Switzerland=3"}, "we_join_round"),
    ({"we_join_round": '{"Geneva": 3}'}, "we_join_round"),
    ({"we_join_round": '{"Switzerland": 0}'}, "we_join_round"),
    ({"we_join_round": '{"Switzerland": 9}'}, "we_join_round"),
    ({"we_leave_round": '{"Hungary": 2}'}, "we_leave_round"),
    ({"we_leave_round": '["VA Long Beach"]'}, "we_leave_round"),
    ({"we_join_round": '{"Switzerland": 4}', "we_leave_round": '{"Switzerland": 4}'},
     "we_leave_round"),
    ({"we_count": "epochs"}, "we_count"),
    ({"we_newcomer": "max"}, "we_newcomer")])
def test_bad_schedule_options_are_config_errors_naming_the_key(tmp_path, job, key):
    """Each bad value is refused when the server config is loaded, naming the [job] key."""
    w = consortium(tmp_path)
    server = Path(w["server"])
    text = server.read_text()
    lines = [f"{k} = {json.dumps(v)}" for k, v in job.items()]
    kept = [ln for ln in text.splitlines() if ln.split(" = ")[0] not in job]
    server.write_text("\n".join(kept).replace("[job]", "[job]\n" + "\n".join(lines)) + "\n")
    with pytest.raises(ConfigError, match=key):
        load_server_config(server)


def test_schedule_from_the_cli_defaults_and_the_silos_check(tmp_path):
    """`silofl deploy init --set` takes join rounds as a TOML table (carried as the canonical
    JSON string) and refuses a bad option before writing anything, naming the key; a [job]
    without the schedule keys gets the defaults (every silo, every round); a silo refuses a
    job whose join rounds are not a JSON object, naming the key."""
    from typer.testing import CliRunner

    from silofl import cli
    args = ["deploy", "init", "--demo", "heart", "--method", "weight_erosion", "--rounds",
            "6", "--noise", "seeded", "--address", f"127.0.0.1:{free_port()}",
            "--set", 'we_user="Hungary"', "--set", "we_participation=0.5"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad = CliRunner().invoke(cli.app, [*args, "--out", str(tmp_path / "bad"),
                                           "--set", 'we_count="epochs"'])
        ok = CliRunner().invoke(cli.app, [*args, "--out", str(tmp_path / "ok"),
                                          "--set", "we_join_round={Switzerland=3}"])
    assert bad.exit_code != 0 and "we_count" in bad.output
    assert not (tmp_path / "bad").exists()
    assert ok.exit_code == 0, ok.output
    job = load_server_config(tmp_path / "ok" / "server.toml").job
    assert job["we_join_round"] == '{"Switzerland": 3}' and job["we_participation"] == 0.5
    assert job_algorithm(job).join_round == {"Switzerland": 3}
    w = consortium(tmp_path / "defaults")
    raw = Path(w["server"]).read_text()
    kept = [ln for ln in raw.splitlines() if not ln.startswith(
        ("we_participation", "we_join_round", "we_leave_round"))]
    Path(w["server"]).write_text("\n".join(kept) + "\n")
    job = load_server_config(w["server"]).job
    assert (job["we_participation"], job["we_join_round"], job["we_leave_round"],
            job["we_count"], job["we_newcomer"]) == (1.0, "{}", "{}", "rounds", "one")
    assert not job_algorithm(job).scheduled
    bad = {**job, "we_join_round": "[3]"}
    with pytest.raises(W.ProtocolError, match="we_join_round"):
        check_job(bad)
    silo = SiloProgram(load_silo_config(w["silos"]["Hungary"]))
    rep = silo.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
                     "job": W.canonical(bad).decode()})
    assert rep["status"] == "refused" and "we_join_round" in rep["reason"]
