"""The one configuration model (silofl.config): the same keys and defaults in a TOML file,
on the command line (--set) and in Python; precise messages for unknown keys and bad
values, naming the file or the --set item; the network files and the engine's value
objects on the same rules."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from silofl.config import Config, DataConfig, config_from_dict, load_config
from silofl.config.network import (
    ServerSection,
    SiloSection,
    read_server_file,
    read_silo_file,
)
from silofl.errors import ConfigError

RAW = {"data": {"source": "heart", "seed": 3, "features": ["age"]},
       "training": {"rounds": 7, "lr": 1, "methods": ["local", "mrmtl"]},
       "privacy": {"epsilon": 2, "silos": {"VA Long Beach": {"epsilon": 0.5}}}}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_toml_set_and_python_give_the_same_config(tmp_path):
    toml = _write(tmp_path / "run.toml", """
[data]
source = "heart"
seed = 3
features = ["age"]
[training]
rounds = 7
lr = 1
methods = ["local", "mrmtl"]
[privacy]
epsilon = 2
[privacy.silos."VA Long Beach"]
epsilon = 0.5
""")
    from_file = load_config(toml)
    from_set = load_config(None, ["data.seed=3", "data.features=['age']", "training.rounds=7",
                                  "training.lr=1", "training.methods=['local','mrmtl']",
                                  "privacy.epsilon=2",
                                  'privacy.silos."VA Long Beach".epsilon=0.5'])
    from_python = Config(**RAW)
    assert from_file == from_set == from_python == Config.model_validate(RAW)
    assert from_file.to_dict() == from_python.to_dict()
    # TOML integers are read as floats where a float is expected (as before the model)
    assert isinstance(from_python.training.lr, float) and from_python.training.lr == 1.0
    assert from_python.privacy.silos["VA Long Beach"].epsilon == 0.5


def test_defaults_are_one_set():
    c = Config()
    assert c == config_from_dict({}) == load_config(None)
    assert (c.training.rounds, c.training.batch_size, c.training.lr) == (30, 16, 0.03)
    assert (c.privacy.epsilon, c.privacy.delta, c.privacy.accountant) == (1.0, 1e-4, "pld")
    # the network's job defaults and the deploy defaults are read from the same model
    from silofl.runtime.network import deploy
    from silofl.runtime.network.server import JOB_DEFAULTS, ServerConfig
    assert JOB_DEFAULTS["lr"] == c.training.lr and JOB_DEFAULTS["noise"] == c.privacy.noise
    assert deploy.default_rounds() == c.training.rounds
    assert deploy.default_delta() == c.privacy.delta
    for key in ("join_timeout", "round_timeout", "rejoin_wait"):
        field = next(f for f in dataclasses.fields(ServerConfig) if f.name == key)
        assert field.default == ServerSection.model_fields[key].default
    # older fingerprints hold: default-valued newer keys are left out of to_dict
    d = c.to_dict()
    assert "tuning" not in d and "sep" not in d["data"]


@pytest.mark.parametrize("raw,words", [
    ({"dat": {}}, ["run.toml", "unknown config section [dat]", "did you mean [data]?"]),
    ({"training": {"rouns": 5}}, ["run.toml", "'training.rouns'",
                                  "did you mean 'training.rounds'?"]),
    ({"training": {"zzzzzz": 5}}, ["'training.zzzzzz'", "valid keys: methods, lam"]),
    ({"privacy": {"silos": {"A": {"epsilo": 1.0}}}},
     ["'privacy.silos.A.epsilo'", "did you mean 'privacy.silos.A.epsilon'?"]),
    ({"training": {"rounds": "ten"}}, ["'training.rounds' must be of type int (like 30)",
                                       "got 'ten'"]),
    ({"training": {"rounds": True}}, ["'training.rounds' must be of type int"]),
    ({"privacy": {"epsilon": True}}, ["'privacy.epsilon' must be of type float"]),
    ({"budget": {"epsilon": "1"}}, ["'budget.epsilon' must be a number, got '1'"]),
    ({"training": {"methods": "local"}}, ["must be of type list", "--set 'training.methods="]),
    ({"data": 3}, ["[data] must be a table of keys, got int"]),
    ({"privacy": {"silos": {"A": 3}}}, ["[privacy.silos.A] must be a table of keys"]),
    ({"data": {"test_fraction": 1.0}}, ["'data.test_fraction' must be in (0, 1)"]),
    ({"privacy": {"epsilon": 1e6}}, ["run.toml", "privacy.epsilon", "(0, 100]"]),
])
def test_bad_keys_and_values_name_file_key_value_and_fix(tmp_path, raw, words):
    from silofl.config.base import validate
    with pytest.raises(ConfigError) as e:
        validate(Config, raw, "", "config file 'run.toml'")
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_a_bad_set_item_is_named_not_the_file(tmp_path):
    toml = _write(tmp_path / "run.toml", "[training]\nrounds = 5\n")
    with pytest.raises(ConfigError, match=r"^--set 'training.rounds=many': 'training.rounds' "
                                          r"must be of type int"):
        load_config(toml, ["training.rounds=many"])
    bad = _write(tmp_path / "bad.toml", "[training]\nrounds = 'x'\n")
    with pytest.raises(ConfigError, match=r"^config file '.*bad.toml': 'training.rounds'"):
        load_config(bad, ["training.lr=0.1"])
    # the --set that fixes the file's value wins (later settings override)
    assert load_config(bad, ["training.rounds=4"]).training.rounds == 4


def test_python_construction_raises_config_errors():
    with pytest.raises(ConfigError, match="unknown config key 'data.sourc'; did you mean "
                                          "'data.source'"):
        DataConfig(sourc="x")
    with pytest.raises(ConfigError, match="'data.seed' must be of type int"):
        Config(data={"seed": "x"})
    assert DataConfig(standardize=False).standardize == "none"  # older configs' booleans


def test_engine_value_objects_follow_the_same_rules():
    from silofl.pandemic.pipeline import PandemicConfig
    from silofl.runtime.plan import TrainingConfig
    t = TrainingConfig(rounds=3, lr=1)
    assert t.lr == 1.0 and dataclasses.replace(t, private=False).private is False
    with pytest.raises(ConfigError, match="'TrainingConfig.rounds' must be of type int"):
        TrainingConfig(rounds=1.5)
    with pytest.raises(ConfigError, match="did you mean 'TrainingConfig.rounds'"):
        TrainingConfig(roundz=3)
    with pytest.raises(ConfigError, match="'TrainingConfig.seed' must be of type int"):
        dataclasses.replace(t, seed="1")  # a copy is checked like a new one
    with pytest.raises(ConfigError, match="did you mean 'pandemic.S'"):
        PandemicConfig(Ss=3)
    assert dataclasses.asdict(PandemicConfig(epsilon=5))["epsilon"] == 5.0


SILO = {"silo": {"name": "A", "data": "a.npz", "epsilon": 1.0, "delta": 1e-5,
                 "state_dir": "state", "private_key": "a.key"},
        "server": {"address": "127.0.0.1:9092", "root_certificate": "ca.pem"}}


def _silo(**change):
    raw = {k: dict(v) for k, v in SILO.items()}
    for key, value in change.items():
        sec, _, k = key.partition("__")
        if value is None:
            raw[sec].pop(k)
        else:
            raw[sec][k] = value
    return raw


@pytest.mark.parametrize("change,words", [
    ({"silo__max_round": 5}, ["silo.toml", "'silo.max_round'", "did you mean 'silo.max_rounds'"]),
    ({"silo__epsilon": "1"}, ["'silo.epsilon' must be a number, got '1'"]),
    ({"silo__epsilon": None}, ["missing key 'silo.epsilon'", "deploy init"]),
    ({"silo__noise": "urandom"}, ["[silo] noise must be 'secure' or 'seeded'"]),
    ({"server__root_certificate": None}, ["root_certificate is missing; TLS is required"]),
    ({"server__insecure": "yes"}, ["'server.insecure' must be of type bool"]),
])
def test_silo_file_keys_are_checked(change, words):
    with pytest.raises(ConfigError) as e:
        read_silo_file(_silo(**change), "silo.toml")
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_silo_and_server_files_defaults():
    f = read_silo_file(_silo(), "silo.toml")
    assert f.silo.max_rounds == SiloSection.model_fields["max_rounds"].default == 1000
    assert f.silo.methods == ["mrmtl", "fedavg", "local", "ditto", "finetune"]
    with pytest.raises(ConfigError, match="'server.join_timout'.*did you mean "
                                          "'server.join_timeout'"):
        read_server_file({"server": {"address": "a:1", "state_dir": "s", "insecure": True,
                                     "join_timout": 5}}, "server.toml")
    with pytest.raises(ConfigError, match="missing key 'server.certificate'"):
        read_server_file({"server": {"address": "a:1", "state_dir": "s",
                                     "root_certificate": "ca.pem"}}, "server.toml")


def test_sweep_set_uses_the_same_keys(tmp_path):
    from silofl.experiments.sweep_config import load_sweep_config
    toml = _write(tmp_path / "sweep.toml", "[sweep]\nmethods = [\"local\"]\nseeds = [0]\n"
                                           "lam = [0.1]\nlr = [0.1]\n")
    sc = load_sweep_config(toml, ["sweep.seeds=[0, 1]", "training.rounds=4"])
    assert sc.sweep.seeds == [0, 1] and sc.base.training.rounds == 4
    with pytest.raises(ConfigError, match="Did you mean 'sweep.seeds'"):
        load_sweep_config(toml, ["sweep.seed=[1]"])
    with pytest.raises(ConfigError, match=r"^--set 'sweep.lr=\[-1\]': 'sweep.lr' must hold "
                                          "positive values"):
        load_sweep_config(toml, ["sweep.lr=[-1]"])


def _capture(monkeypatch, module: str, name: str) -> dict:
    """Replace `module.name` by a stub that records its arguments and stops the command."""
    import importlib
    seen: dict = {}

    def stub(*args, **kw):
        seen.update(kw, args=args)
        raise ConfigError("stopped by the test")
    monkeypatch.setattr(importlib.import_module(module), name, stub)
    return seen


def test_audit_and_erosion_options_come_from_the_file_unless_given(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from silofl.cli import app
    monkeypatch.setenv("SILOFL_HOME", str(tmp_path / "home"))
    toml = _write(tmp_path / "run.toml", '[audit]\nkind = "multi-run"\nruns = 7\n'
                                         'confidence = 0.9\n[erosion]\nusers = ["Hungary"]\n'
                                         'contributions = false\n')
    seen = _capture(monkeypatch, "silofl.audit", "audit")
    res = CliRunner().invoke(app, ["audit", "-c", str(toml), "--scratch", "--runs", "9"])
    assert res.exit_code == 2 and "stopped by the test" in res.output
    assert (seen["kind"], seen["runs"], seen["confidence"]) == ("multi-run", 9, 0.9)
    seen = _capture(monkeypatch, "silofl.experiments.erosion", "erosion_for_users")
    res = CliRunner().invoke(app, ["erosion", "-c", str(toml), "--scratch"])
    assert res.exit_code == 2
    assert seen["args"][1] == ["Hungary"] and seen["contributions"] is False
    res = CliRunner().invoke(app, ["erosion", "-c", str(toml), "--scratch", "--users", "all",
                                   "--contributions"])
    assert seen["args"][1] is None and seen["contributions"] is True
    # defaults: the section's, and a saved run config without them is unchanged
    assert Config().audit.runs is None and "audit" not in Config().to_dict()
    with pytest.raises(ConfigError, match="did you mean 'audit.runs'"):
        config_from_dict({"audit": {"run": 3}})


def test_a_silos_table_section_is_the_runs_data_keys():
    from silofl.config import DataConfig
    from silofl.config.network import SiloDataSection
    raw = {**_silo(silo__data=None), "data": {"path": "t.csv", "schema": "s.toml"}}
    d = read_silo_file(raw, "silo.toml").data
    assert d is not None and (d.test_fraction, d.seed, d.missing) == (
        DataConfig().test_fraction, DataConfig().seed, DataConfig().missing)
    assert set(SiloDataSection.model_fields) <= set(DataConfig.model_fields)
    raw["data"]["encodng"] = "latin-1"
    with pytest.raises(ConfigError, match="silo.toml: unknown config key 'data.encodng'; "
                                          "did you mean 'data.encoding'"):
        read_silo_file(raw, "silo.toml")
    with pytest.raises(ConfigError, match=r"\[silo\] data and \[data\] both"):
        read_silo_file({**_silo(), "data": {"path": "t.csv", "schema": "s.toml"}}, "silo.toml")


def test_audit_and_erosion_take_set(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from silofl.cli import app
    monkeypatch.setenv("SILOFL_HOME", str(tmp_path / "home"))
    seen = _capture(monkeypatch, "silofl.audit", "audit")
    res = CliRunner().invoke(app, ["audit", "--scratch", "--set", "audit.runs=50"])
    assert res.exit_code == 2 and seen["runs"] == 50
    res = CliRunner().invoke(app, ["audit", "--scratch", "--set", "audit.run=50"])
    assert res.exit_code == 2 and "Did you mean 'audit.runs'" in res.output
    seen = _capture(monkeypatch, "silofl.experiments.erosion", "erosion_for_users")
    res = CliRunner().invoke(app, ["erosion", "--scratch", "--set", "erosion.users=['Hungary']"])
    assert res.exit_code == 2 and seen["args"][1] == ["Hungary"]
