"""Networked runtime: each silo a separate process that holds only its own data, budget
store and ledger, and a server that only aggregates (Flower gRPC transport, TLS, signed
messages). The silo and the server run the same `Algorithm.silo_step` / `server_step` as
the in-process simulator (`runtime.simulator`).

Modules: `messages` (strict, versioned, size-limited wire schema and signatures), `jobspec`
(the public job description and what server and silos build from it), `hosting` (one
silo's slice of an algorithm's state, its own random stream), `silo` (the silo program),
`server` (the server program and its checkpoint), `clientapp` (the one Flower client of
the silo program and the ClientApp, cheap to start), `flower_app` (the ServerApp: the
default deployment on SuperLink/SuperNode, with SecAgg+ and its poll interval), `flower`
(the labelled legacy fast path on `start_client`/`start_grpc_server` while flwr ships them,
and the in-process driver `run_in_process` the pandemic preset uses), `deploy` (consortium
configs and TLS/authentication material), `secagg` (SecAgg+ settings from public
quantities and their error).
"""
