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


def test_superlink_clientapp_replayed_messages_train_nothing_uncharged(tmp_path):
    """The ClientApp builds a fresh silo program per message (as flwr's per-message process
    does): a train message the server replays after the job (an old round, the last round,
    or any round to a SuperNode whose Context lost the join) runs nothing and charges
    nothing; the store and the saved card say the same rounds before and after."""
    pytest.importorskip("flwr")
    import copy
    import json

    from flwr.app import Context, RecordDict

    from silofl.privacy import events
    from silofl.privacy.budget import BudgetStore
    from silofl.runtime.network import flower_app
    from silofl.runtime.network.clientapp import client_app
    from silofl.runtime.network.silo_config import load_silo_config
    from test_network_flower import consortium  # tests/ is on the import path

    sent: list = []

    class Recording(flower_app.LoopbackGrid):
        def _deliver(self, messages):
            sent.extend((m.metadata.dst_node_id, copy.deepcopy(m)) for m in messages
                        if m.metadata.message_type == "train")
            return super()._deliver(messages)

    w = consortium(tmp_path, "mrmtl", secagg=False, rounds=2)
    nodes = {100 + i: {"silo-config": str(p)} for i, p in enumerate(sorted(w["silos"].values()))}
    grid = Recording(nodes)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                  run_config={"server-config": str(tmp_path / "server.toml")})
    assert flower_app.run_server_app(grid, ctx).done == 2 and len(sent) == 2 * len(nodes)

    def ledger():
        out = {}
        for cfg in nodes.values():
            c = load_silo_config(cfg["silo-config"])
            with BudgetStore(c.budget_store) as st:
                out[c.name] = (st.spent(c.name)["epsilon"], sum(
                    n * r["count"] for r in st.charges(c.name)
                    for n in events.flatten(events.from_json(r["event"])).values()))
            out[c.name + "/state"] = json.loads((c.state_dir / "state.json").read_text())["round"]
        return out

    before = ledger()
    for nid, msg in sent:  # every train message again, to the SuperNode's own Context
        reply = client_app(copy.deepcopy(msg), grid.contexts[nid])
        status = reply.content["fitres.metrics"]["status"] if reply.has_content() else "error"
        assert status in ("ok", "refused"), status  # "ok" only as the cached resend
    for nid, msg in sent:  # and to a SuperNode whose Context lost the accepted join
        fresh = Context(run_id=1, node_id=nid, node_config=nodes[nid], state=RecordDict(),
                        run_config={})
        reply = client_app(copy.deepcopy(msg), fresh)
        assert reply.content["fitres.metrics"]["status"] == "refused"
    assert ledger() == before
