"""The ClientApp of the SuperLink/SuperNode route, kept cheap to start.

flwr 1.41's SuperNode starts a fresh ClientApp process for every message (no isolation
mode avoids it), so this module is what each message pays for at start-up: it imports
Flower's ClientApp and silofl's wire schema only. The silo program (data, plan,
accounting, trainer) is imported when a message is handled, and the SecAgg+ mod only for
a masked round. Measure with ``python -X importtime -c "import
silofl.runtime.network.clientapp"`` (`benchmarks/bench_network.py` prints the start of a
bare ClientApp beside this one).

`SiloClient` is the one Flower client of the silo program: the legacy fast path
(`flower.run_silo`) and this App both forward the server's requests through it; the silo's
checks and its lifetime store are the same on both.

* The ClientApp reads its silo.toml from the SuperNode's `--node-config
  'silo-config="/path/silo.toml"'`. The accepted (public) job description is kept in the
  run's `Context.state` and re-accepted from the silo's own state on disk before each
  round. `require-secagg=true` in the node config makes the silo refuse any round that is
  not SecAgg+-masked.
"""

from __future__ import annotations

import logging
import zlib

from flwr.app import ConfigRecord, Context
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp

from silofl.errors import ConfigError, SiloflError
from silofl.runtime.network import messages as W

log = logging.getLogger("flwr.silofl")
STATE_KEY = "silofl"      # Context.state record holding the accepted join request


class SiloClient(NumPyClient):
    """Forwards the server's join and round requests to a `silo.SiloProgram`."""

    def __init__(self, program):
        super().__init__()
        self.program = program

    def get_properties(self, config):
        try:
            if config.get("kind") == "hello":
                return self.program.hello(dict(config))
            return self.program.join(dict(config))
        except W.ProtocolError as e:
            log.warning("silo %s: rejected a malformed join request: %s",
                        self.program.cfg.name, e)
            return {"protocol": W.PROTOCOL, "kind": "error", "reason": str(e)[:4000]}

    def get_parameters(self, config):
        return []

    def fit(self, parameters, config):
        try:
            rep, update = self.program.round(dict(config), list(parameters))
        except W.ProtocolError as e:
            log.warning("silo %s: rejected a malformed round request: %s",
                        self.program.cfg.name, e)
            rep, update = self.program._reply({"round": -1}, "refused", str(e)[:4000], None)
        return ([] if update is None else [update]), 0, rep

    def evaluate(self, parameters, config):
        return 0.0, 0, {}


class AppSiloClient(SiloClient):
    """`SiloClient` for a per-message ClientApp process: remembers the accepted job in the
    run's Context.state; reports its public weight to SecAgg+ (n_k, or 1 unweighted)."""

    def __init__(self, program, context: Context, secagg: bool):
        super().__init__(program)
        self.context, self.secagg = context, secagg

    def get_properties(self, config):
        reply = super().get_properties(config)
        if reply.get("status") == "ok":   # keep only the public join request
            self.context.state.config_records[STATE_KEY] = ConfigRecord(
                {k: str(v) for k, v in config.items()})
        return reply

    def fit(self, parameters, config):
        from silofl.privacy.randomness import Randomness
        c = self.program.cfg
        if c.noise == "seeded" and self.program.plan is not None and self.program.gbdt is None:
            # (dp_gbdt keeps its seeded stream's position in its state on disk)
            # a fresh process per message would restart the seeded stream every round (the
            # same noise each round): key the experiment stream by the round as well
            self.program.trainer.rng = Randomness.for_mode("seeded", [
                int(self.program.job["seed"]), zlib.crc32(c.name.encode()),
                int(config.get("round", 0))])
        self.program.masked = self.secagg  # uldp: the silo refuses an unmasked round
        arrays, _, rep = super().fit(parameters, config)
        _save_when_done(self.program)
        if not self.secagg:
            return arrays, 0, rep
        if rep["status"] != "ok":
            # nothing may enter a masked sum: fail this message (SecAgg+ treats the silo
            # as dropped out; the server re-joins it next round and learns its status)
            raise SiloflError(f"silo {self.program.cfg.name}: {rep['status']}: "
                              f"{rep['reason'][:500]}")
        weighted = self.program.job["weighted"] and getattr(self.program.algorithm,
                                                             "weighted", True)
        weight = self.program.plan.n if weighted else 1  # uldp: 1 (the sum, unweighted)
        # sign the reply's fields without the update: a signature over the update's hash
        # would let the server confirm a guessed update, which SecAgg+ is meant to hide
        rep = {**rep, "signature": ""}
        rep["signature"] = W.sign(self.program.key, rep, None)
        return arrays, int(weight), rep


def _save_when_done(program) -> None:
    """After the job's last round (or when the store refused more), save the silo's model
    and card as `silofl silo` does on the fast path (`release.save_silo_release`): there
    is no end-of-run hook in a per-message process, so the last round's process saves."""
    job = program.job
    if job is None or not (program.exhausted or program.done >= program.rounds):
        return
    from silofl.runtime.network import release
    try:
        where = release.save_silo_release(program)
        log.info("silo %s: saved the model to %s", program.cfg.name, where)
    except ConfigError as e:  # nothing to save (no round run, a graph region)
        log.warning("silo %s: no model saved: %s", program.cfg.name, e)


def _is_secagg(msg) -> bool:
    from flwr.common.secure_aggregation.secaggplus_constants import (
        RECORD_KEY_CONFIGS,
        Key,
    )
    rec = msg.content.config_records.get(RECORD_KEY_CONFIGS)
    return rec is not None and Key.STAGE in rec


def _client_fn(context: Context):
    from silofl.runtime.network.silo import open_program  # per message
    from silofl.runtime.network.silo_config import load_silo_config
    path = context.node_config.get("silo-config")
    if not path:
        raise ConfigError("this SuperNode has no silo config: start it with --node-config "
                          "'silo-config=\"/path/to/silo_<name>.toml\"'")
    program = open_program(load_silo_config(str(path)))
    joined = context.state.config_records.get(STATE_KEY)
    if joined is not None:   # re-accept the job from the silo's own state on disk
        program.join(dict(joined))
    flag = context.state.config_records.get("silofl_secagg")
    secagg = bool(flag is not None and flag.get("on", False))
    return AppSiloClient(program, context, secagg).to_client()


def _silofl_mod(msg, ctxt, call_next):
    """Route masked rounds through `secaggplus_mod`; refuse plain rounds when the node
    config says `require-secagg=true` (the silo, not the server, decides)."""
    secagg = _is_secagg(msg)
    ctxt.state.config_records["silofl_secagg"] = ConfigRecord({"on": secagg})
    if msg.metadata.message_type == "train" and not secagg and \
            bool(ctxt.node_config.get("require-secagg", False)):
        raise SiloflError("this silo requires SecAgg+ (node config require-secagg=true) "
                          "and the server sent an unmasked round; refused, nothing was run")
    if secagg:
        why = _uldp_setup_refusal(msg, ctxt)
        if why:
            raise SiloflError(why)
        from flwr.client.mod import secaggplus_mod
        return secaggplus_mod(msg, ctxt, call_next)
    return call_next(msg, ctxt)


def _uldp_setup_refusal(msg, ctxt) -> str | None:
    """Why a silo of a uldp job refuses a SecAgg+ setup (None: it takes part): a sum of
    fewer than all K silos, or a reconstruction threshold below K, could be unmasked
    without every silo's share of the noise. Checked by the silo at the setup stage,
    before its round is run or charged."""
    import json

    from flwr.common.secure_aggregation.secaggplus_constants import (
        RECORD_KEY_CONFIGS,
        Key,
        Stage,
    )
    rec = msg.content.config_records.get(RECORD_KEY_CONFIGS)
    joined = ctxt.state.config_records.get(STATE_KEY)
    if rec is None or rec.get(Key.STAGE) != Stage.SETUP or joined is None:
        return None
    job = json.loads(str(joined.get("job", "{}")))
    if job.get("method") != "uldp":
        return None
    K = len(json.loads(job["silos"]))
    got = {k: int(rec.get(k, 0)) for k in (Key.SAMPLE_NUMBER, Key.THRESHOLD)}
    if min(got.values()) >= K:
        return None
    return (f"uldp: this silo takes part only in a SecAgg+ sum of all {K} silos with "
            f"reconstruction threshold {K}; the server's setup has {got}; refused, nothing "
            "was run or charged")


def _worker_mod(msg, ctxt, call_next):
    """Hand the message to this silo's long-lived worker (`silo_worker`) when its socket
    answers; otherwise handle it here, exactly as without a worker."""
    path = ctxt.node_config.get("silo-config")
    if path:
        from silofl.runtime.network import worker_link
        try:
            sock = worker_link.socket_path(str(path))
        except (OSError, KeyError, ValueError):   # the in-process path reports it
            sock = None
        got = worker_link.forward(sock, msg, ctxt) if sock is not None else None
        if got is not None:
            reply, after = got
            ctxt.state = after.state   # what the worker kept (the accepted join)
            return reply
    return call_next(msg, ctxt)


#: the in-process handler: what a worker runs, and what the ClientApp runs without one
local_app = ClientApp(client_fn=_client_fn, mods=[_silofl_mod])
client_app = ClientApp(client_fn=_client_fn, mods=[_worker_mod, _silofl_mod])
