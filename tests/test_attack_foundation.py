"""Attacks on the privacy guarantee after the structural redesign (issue 20): keys of the
one configuration model that could weaken a silo's accounting are refused like the run's."""

from __future__ import annotations

import pytest

from silofl.config.network import read_silo_file
from silofl.errors import ConfigError

SILO = {"silo": {"name": "A", "data": "a.npz", "epsilon": 1.0, "delta": 1e-5,
                 "state_dir": "state", "private_key": "a.key"},
        "server": {"address": "127.0.0.1:9092", "root_certificate": "ca.pem"}}


@pytest.mark.parametrize("key,value,words", [
    # δ ≥ 0.5 composes every charge to ε ≈ 0: [privacy]/[budget] refuse it, silo.toml must too
    ("delta", 0.6, ["silo.delta", "(0, 0.5)"]),
    ("epsilon", 1e6, ["silo.epsilon", "(0, 100]"]),
    ("lifetime_epsilon", 1e6, ["silo.lifetime_epsilon", "(0, 100]"]),
    ("lifetime_epsilon", 0.0, ["silo.lifetime_epsilon", "positive"]),
])
def test_silo_file_target_is_range_checked_like_the_run(key, value, words):
    raw = {k: dict(v) for k, v in SILO.items()}
    raw["silo"][key] = value
    with pytest.raises(ConfigError) as e:
        read_silo_file(raw, "silo.toml")
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_silo_file_in_range_target_is_accepted():
    f = read_silo_file({k: dict(v) for k, v in SILO.items()}, "silo.toml")
    assert (f.silo.epsilon, f.silo.delta) == (1.0, 1e-5)


@pytest.mark.parametrize("delta", [0.5, 0.9])
def test_pandemic_config_refuses_a_weak_delta(delta):
    """The pandemic section of the configuration model: a region's δ ≥ 0.5 is refused (the
    node-level ε reported would be ≈ 0 whatever was released)."""
    from silofl.pandemic.config import PandemicConfig
    with pytest.raises(ConfigError, match="delta must be in"):
        PandemicConfig(delta=delta).validate()
    PandemicConfig(delta=1e-5).validate()
    PandemicConfig(delta=0.9, private=False).validate()  # nothing is claimed
