"""The legacy FAST PATH of the silo and server programs (gRPC, TLS, Flower's `Server` loop).

The default deployment is Flower's SuperLink/SuperNode route (`flower_app`, `clientapp`);
this module keeps the same programs (`silo.SiloProgram`, `server.ServerProgram`, the one
`clientapp.SiloClient` and `SiloflStrategy`) on Flower's deprecated long-running entry
points only while flwr ships them (`LEGACY_FLWR_BELOW`), because it has no per-message
process start (about 10 ms against seconds per silo-round, `benchmarks/bench_network.py`).

The silo is a Flower client (`flwr.client.start_client`), the server a Flower `Strategy`
driven by Flower's `Server` over its gRPC fleet service (`start_grpc_server`, TLS with the
consortium's certificates). These are Flower's legacy long-running entry points (deprecated
since flwr 1.13 in favour of SuperLink/SuperNode, still shipped in 1.41): they keep one
process per silo under the silo's own control, which is what a silo-enforced budget needs.
Node authentication is by signature: each silo signs its join and every reply with its
ECDSA key and the server accepts only registered keys (`messages`). All logic is in
`silo.SiloProgram` / `server.ServerProgram`; this module only moves their messages.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import flwr as fl
import grpc
from flwr.common import (
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    Parameters,
    ReconnectIns,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import Server, SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from silofl.errors import ConfigError, SiloflError
from silofl.runtime.network import messages as W
from silofl.runtime.network.clientapp import SiloClient
from silofl.runtime.network.server import ServerConfig, ServerProgram
from silofl.runtime.network.silo import SiloProgram, new_nonce, open_program
from silofl.runtime.network.silo_config import SiloConfig

log = logging.getLogger("flwr.silofl")  # through Flower's handlers


def _drop_flower_deprecation(record: logging.LogRecord) -> bool:
    """Flower warns at every start that `start_client`/`start_server` are deprecated, with
    a `flower-supernode --insecure` example: noise for a silo's operator (it runs with TLS
    and cannot act on it; README "How the transport is built" says so once)."""
    return not str(record.msg).lstrip().startswith(("DEPRECATED FEATURE", "FEATURE UPDATE"))


def _quiet_deprecations() -> None:
    """Drop the banner on Flower's own logger, where it is logged (filters of a logger see
    only records logged through it, so a filter on the root or a handler would miss it)."""
    flower = logging.getLogger("flwr")
    if _drop_flower_deprecation not in flower.filters:
        flower.addFilter(_drop_flower_deprecation)


_quiet_deprecations()  # at the source: before any caller can reach start_client


#: The last flwr minor series this legacy fast path is tested on. `tests/
#: test_network_legacy.py` fails once the installed flwr passes it or drops
#: `start_client`/`start_grpc_server`: then this module and `silofl silo`/`silofl server`'s
#: legacy path go, and the SuperLink/SuperNode route (`flower_app`) is the only one.
LEGACY_FLWR_BELOW = (1, 42)


# --- silo (legacy fast path) ---------------------------------------------------------

def run_silo(cfg: SiloConfig, *, max_wait: float = 120.0) -> SiloProgram:
    """Connect to the server and serve rounds until it disconnects (or `max_wait` seconds
    pass without a connection). Returns the program (its state is also on disk)."""
    _quiet_deprecations()
    program = open_program(cfg)
    root = None if cfg.root_certificate is None else Path(cfg.root_certificate).read_bytes()
    client = SiloClient(program).to_client()
    # reconnecting after a lost connection is bounded like the first connection: `max_wait`
    # seconds since the last round this silo served (a server gone for good ends the silo)
    seen, deadline = program.done, time.monotonic() + max_wait
    while True:
        try:
            fl.client.start_client(server_address=cfg.server_address, client=client,
                                   root_certificates=root, insecure=root is None,
                                   grpc_max_message_length=W.GRPC_MAX_MESSAGE,
                                   max_retries=None, max_wait_time=max_wait)
            return program  # the server ended the job (or could not be reached)
        except grpc.RpcError as e:  # the server went away mid-job: wait for it to return
            if program.done != seen:
                seen, deadline = program.done, time.monotonic() + max_wait
            if time.monotonic() >= deadline:
                log.warning("silo %s: the server has not come back within %g s; stopping "
                            "(state kept: round %d)", cfg.name, max_wait, program.done)
                return program
            log.warning("silo %s: connection to the server lost (%s); reconnecting "
                        "(state kept: round %d)", cfg.name, e.code(), program.done)
            time.sleep(0.5)  # back-off before the next attempt, not a synchronisation


# --- server --------------------------------------------------------------------------

class FitOnlyStrategy(fl.server.strategy.Strategy):
    """A strategy whose rounds only fit: no evaluation round, no server-side evaluation
    (silos keep their metrics)."""

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


class SiloflStrategy(FitOnlyStrategy):
    """Joins silos (authenticated), sends each round's requests, runs the server step."""

    def __init__(self, program: ServerProgram):
        super().__init__()
        self.p = program
        self.names: dict[str, str] = {}   # Flower connection id → silo name
        self.rejected: set[str] = set()
        self.declined: set[str] = set()
        self.started = False
        self.lock = threading.Lock()

    def initialize_parameters(self, client_manager):
        return Parameters(tensors=[], tensor_type="numpy.ndarray")

    def _join(self, proxy) -> None:
        """One connection's join: the round trip runs in parallel with the others' (a
        thread each, `_join_all`); what it changes is changed under the lock."""
        job = W.canonical(self.p.job).decode()
        nonce = new_nonce()
        ins = GetPropertiesIns({"protocol": W.PROTOCOL, "kind": "join", "job": job,
                                "nonce": nonce})
        try:
            res = proxy.get_properties(ins, timeout=self.p.cfg.join_timeout, group_id=None)
            props = dict(res.properties)
            if props.get("nonce") != nonce:
                raise W.ProtocolError("join reply does not answer this server's nonce")
            with self.lock:
                reg = self.p.accept_join(props)
        except Exception as e:  # an unauthenticated or broken client does not join
            log.warning("connection %s rejected at join: %s", proxy.cid, e)
            with self.lock:
                self.rejected.add(proxy.cid)
            self._drop(proxy)
            return
        if reg.status != "ok":
            log.warning("silo %s declined the job: %s", reg.name, reg.reason)
            with self.lock:
                self.declined.add(proxy.cid)
            self._drop(proxy)
            return
        with self.lock:
            for cid, name in list(self.names.items()):
                if name == reg.name:      # the silo reconnected: its old connection is stale
                    del self.names[cid]
            self.names[proxy.cid] = reg.name
        log.info("silo %s joined (n = %d, q = %.4g, steps = %d, sigma = %.4g)", reg.name,
                 reg.n_train, reg.q, reg.steps, reg.sigma)

    def _join_all(self, proxies: list) -> None:
        """Join these connections at once: on the SuperLink route every join is a message
        round trip (a SuperNode poll and a fresh ClientApp), so one after another the
        start-up grew with the number of silos."""
        if len(proxies) <= 1:
            for proxy in proxies:
                self._join(proxy)
            return
        with ThreadPoolExecutor(max_workers=min(32, len(proxies))) as pool:
            list(pool.map(self._join, proxies))

    def _drop(self, proxy) -> None:
        """Ask a connection to leave (the silo's client returns)."""
        try:
            proxy.reconnect(ReconnectIns(seconds=None), timeout=5.0, group_id=None)
        except Exception:  # already gone
            pass

    def _active(self, client_manager) -> list:
        conns = client_manager.all()
        return [(conns[c], n) for c, n in sorted(self.names.items(), key=lambda kv: kv[1])
                if c in conns and self.p.silos[n].status == "ok"]

    def configure_fit(self, server_round, parameters, client_manager):
        t = self.p.done + 1
        first = not self.p.silos
        need = self.p.cfg.expected_silos if first else self.p.cfg.min_silos
        now = time.monotonic()
        deadline, grace = now + self.p.cfg.join_timeout, now + self.p.cfg.rejoin_wait
        if not self.started:  # first round of this process (fresh or resumed): wait for all
            grace, self.started = deadline, True
        self.declined = set()  # connections that answered this round's join with a no
        while True:
            conns = client_manager.all()
            self._join_all([proxy for cid, proxy in sorted(conns.items())
                            if cid not in self.names and cid not in self.rejected | self.declined])
            active = self._active(client_manager)
            # every silo still in the job, or enough of them once the grace period is over;
            # or every expected silo is connected and has answered (waiting changes nothing)
            everyone = sum(r.status == "ok" for r in self.p.silos.values())
            answered = len(conns) >= self.p.cfg.expected_silos and all(
                c in self.names or c in self.rejected | self.declined for c in conns)
            if len(active) >= max(need, everyone) or len(active) >= need and \
                    time.monotonic() > grace or time.monotonic() > deadline or answered \
                    and len(active) < need:
                break
            time.sleep(0.05)
        if len(active) < self.p.cfg.min_silos:
            raise SiloflError(
                f"round {t}: {len(active)} silo(s) available within {self.p.cfg.join_timeout:g}"
                f" s, fewer than min_silos = {self.p.cfg.min_silos}; stopping after round "
                f"{self.p.done} (checkpointed; restart the server to resume)")
        params = ndarrays_to_parameters([self.p.message])
        asked = set(self.p.selected(t, [name for _, name in active]))  # local-DP: a sample
        return [(proxy, FitIns(params, self.p.request(name, t))) for proxy, name in active
                if name in asked]

    def aggregate_fit(self, server_round, results, failures):
        t = self.p.done + 1
        updates = {}
        for proxy, res in results:
            name = self.names.get(proxy.cid)
            if name is None:
                continue
            try:
                status, update = self.p.accept_update(name, t, dict(res.metrics),
                                                      parameters_to_ndarrays(res.parameters))
            except W.ProtocolError as e:
                log.warning("round %d: rejected the reply of %s: %s", t, name, e)
                continue
            if status == "ok":
                updates[name] = update
            else:
                log.warning("round %d: silo %s %s: %s", t, name, status,
                            self.p.silos[name].reason)
                self._drop(proxy)
        for f in failures:
            proxy = f[0] if isinstance(f, tuple) else None
            cid = getattr(proxy, "cid", None)
            name = None if cid is None else self.names.pop(cid, None)
            log.warning("round %d: silo %s failed (%s); the round goes on without it", t,
                        name, f[1] if isinstance(f, tuple) else f)
        self.p.step(t, updates)
        log.info("round %d done with %d silo(s): %s", t, len(updates), ", ".join(sorted(updates)))
        return None, {}


# --- in process (no network) -----------------------------------------------------------

class InProcessClientProxy(ClientProxy):
    """Forwards each request to a fresh client from ``client_fn(cid)`` in this process:
    Flower's `Server` loop without gRPC or a simulation engine. A fresh client per request
    is what SuperNode and the PETs challenge's runtime do, so a client must keep what it
    remembers on disk (the silo programs do: `SiloProgram.resume`)."""

    def __init__(self, cid: str, client_fn: Callable[[str], fl.client.NumPyClient]):
        super().__init__(cid)
        self.client_fn = client_fn

    #: in-process clients answer one request at a time (the server's parallel joins queue
    #: here): one process, and the clients' files are not written by two requests at once
    lock = threading.Lock()

    def _client(self):
        return self.client_fn(self.cid).to_client()

    def get_properties(self, ins, timeout, group_id) -> GetPropertiesRes:
        with self.lock:
            return self._client().get_properties(ins)

    def get_parameters(self, ins, timeout, group_id) -> GetParametersRes:
        return self._client().get_parameters(ins)

    def fit(self, ins: FitIns, timeout, group_id) -> FitRes:
        with self.lock:
            return self._client().fit(ins)

    def evaluate(self, ins: EvaluateIns, timeout, group_id) -> EvaluateRes:
        with self.lock:
            return self._client().evaluate(ins)

    def reconnect(self, ins, timeout, group_id) -> DisconnectRes:
        return DisconnectRes("")


def run_in_process(strategy, num_rounds: int,
                   client_fns: dict[str, Callable[[str], fl.client.NumPyClient]],
                   max_workers: int | None = 1):
    """Run Flower's `Server` loop with ``strategy`` for ``num_rounds`` over in-process
    clients (one factory per cid, `InProcessClientProxy`); returns Flower's History.
    The clients answer one request at a time (`InProcessClientProxy.lock`), whatever
    ``max_workers`` Flower's loop is given."""
    manager = SimpleClientManager()
    for cid in sorted(client_fns):
        manager.register(InProcessClientProxy(cid, client_fns[cid]))
    server = Server(client_manager=manager, strategy=strategy)
    server.set_max_workers(max_workers)
    history, _ = server.fit(num_rounds=num_rounds, timeout=None)
    return history


def run_server(cfg: ServerConfig) -> ServerProgram:
    """Serve the job's remaining rounds (resuming from the checkpoint); returns the program."""
    from flwr.server.superlink.fleet.grpc_bidi.grpc_server import start_grpc_server
    if cfg.secagg:
        raise ConfigError("secagg = true runs on Flower's SuperLink/SuperNode route "
                          "(`flwr run`, see README 'SecAgg+'), not with `silofl server`; "
                          "remove it here or use that route")
    _quiet_deprecations()
    program = ServerProgram(cfg)
    remaining = program.rounds - program.done
    if remaining <= 0:
        return program
    strategy = SiloflStrategy(program)
    manager = SimpleClientManager()
    server = Server(client_manager=manager, strategy=strategy)
    certs = None if cfg.certificates is None else (
        Path(cfg.certificates[0]).read_bytes(), Path(cfg.certificates[1]).read_bytes(),
        Path(cfg.certificates[2]).read_bytes())
    try:
        grpc_server = start_grpc_server(client_manager=manager, server_address=cfg.address,
                                        max_message_length=W.GRPC_MAX_MESSAGE,
                                        certificates=certs)
    except SystemExit as e:  # Flower exits (code 1, its own text) when the port is taken
        raise ConfigError(f"the server cannot listen on {cfg.address} ({e.code}): is another "
                          "`silofl server` (or another program) using that port? Stop it, or "
                          "choose another port in [server] address (and in every silo's "
                          "[server] address; `deploy init --address`)") from None
    log.info("silofl server on %s, TLS %s, rounds %d..%d", cfg.address,
             "on" if certs else "OFF", program.done + 1, program.rounds)
    try:
        server.fit(num_rounds=remaining, timeout=cfg.round_timeout)
        server.disconnect_all_clients(timeout=10.0)
    finally:
        grpc_server.stop(grace=1)
    return program
