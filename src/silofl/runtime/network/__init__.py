"""Networked runtime: each silo a separate process that holds only its own data, budget
store and ledger, and a server that only aggregates (Flower gRPC transport, TLS, signed
messages). The silo and the server run the same `Algorithm.silo_step` / `server_step` as
the in-process simulator (`runtime.simulator`).

Modules: `messages` (strict, versioned, size-limited wire schema and signatures), `hosting`
(one silo's slice of an algorithm's state, its own random stream), `silo` (the silo
program), `server` (the server program and its checkpoint), `deploy` (consortium configs
and TLS/authentication material), `flower` (the Flower client and strategy, and the
in-process driver `run_in_process` that the pandemic track's entry points share),
`flower_app` (the same as a Flower App for SuperLink/SuperNode, with SecAgg+), `secagg`
(SecAgg+ settings from public quantities and their error).
"""
