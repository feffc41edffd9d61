"""The files of a networked deployment (`silofl deploy init` writes them): a silo's
``silo.toml`` ([silo], [server], [data]) and the coordinator's ``server.toml`` ([server],
[job], [silos]). These models hold their keys, types and defaults; the readers in
`silofl.runtime.network` resolve paths against the file's folder and check what needs the
runtime (the job's method, the data kinds, the schema).

The job's own defaults ([job] in server.toml) are the run model's (`silofl.config.run`):
one set of defaults for `silofl run` and the network.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from silofl.config.base import Section, validate
from silofl.errors import ConfigError

__all__ = ["DEFAULT_METHODS", "NOISE_MODES", "ServerFile", "ServerSection", "SiloFile",
           "SiloSection", "SiloServerSection", "read_server_file", "read_silo_file"]

#: the methods a silo consents to when its [silo] methods is not given
DEFAULT_METHODS = ("mrmtl", "fedavg", "local", "ditto", "finetune")
NOISE_MODES = ("secure", "seeded")
_COMPLETE = "see `silofl deploy init` for a complete silo config"


class SiloSection(Section):
    """[silo] of silo.toml: who the silo is, its target, where it keeps its state."""

    section: ClassVar[str] = "silo"
    missing_hint: ClassVar[str] = _COMPLETE
    name: str
    data: str | None = None        # tabular .npz / the graph folder (or a [data] table)
    epsilon: float                 # this job's target (σ is calibrated for it)
    delta: float
    lifetime_epsilon: float | None = None  # the store's lifetime target (default: epsilon)
    budget_store: str | None = None  # a store file (default: the deployment's store)
    deployment: str = "default"    # names the user's lifetime store when no budget_store
    state_dir: str
    private_key: str
    noise: str = "secure"          # secure | seeded (experiments: not a privacy guarantee)
    max_rounds: int = 1000
    methods: list[str] = Field(default_factory=lambda: list(DEFAULT_METHODS))  # consented
    public_data: str | None = None  # PrivateKT's public set D_p (.npz with X)
    data_kind: str = "tabular"     # tabular | graph
    run_dir: str | None = None     # where the released models go (default: state_dir)

    @field_validator("noise")
    @classmethod
    def _noise(cls, v: str) -> str:
        if v not in NOISE_MODES:
            raise ConfigError(f"[silo] noise must be 'secure' or 'seeded', got {v!r}")
        return v


class SiloServerSection(Section):
    """[server] of silo.toml: where the coordinator is and how to trust it."""

    section: ClassVar[str] = "server"
    missing_hint: ClassVar[str] = _COMPLETE
    address: str
    root_certificate: str | None = None  # the deployment's CA (TLS)
    insecure: bool = False         # plain gRPC: only for a local experiment

    @model_validator(mode="after")
    def _tls(self) -> SiloServerSection:
        if self.root_certificate is None and not self.insecure:
            raise ConfigError("[server] root_certificate is missing; TLS is required "
                              "(set insecure = true only for a local experiment)")
        return self


class SiloFile(Section):
    """silo.toml. [data] (the silo's own table and the consortium's schema) is checked by
    `silofl.runtime.network.silo_table.table_settings` (its defaults: the run's [data])."""

    missing_hint: ClassVar[str] = _COMPLETE
    silo: SiloSection
    server: SiloServerSection
    data: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_data(self) -> SiloFile:
        if self.data and self.silo.data is not None:
            raise ConfigError("[silo] data and [data] both name the silo's data; keep [data] "
                              "(its own table and the consortium's schema)")
        if not self.data and self.silo.data is None:
            raise ConfigError("missing key 'silo.data' (or a [data] table); "
                              f"{_COMPLETE}")
        return self


_TLS_HINT = ("TLS needs root_certificate, certificate and private_key under [server]; "
             "`silofl deploy init` writes a complete config")


class ServerSection(Section):
    """[server] of server.toml: the coordinator's address, state, timeouts and TLS."""

    section: ClassVar[str] = "server"
    missing_hint: ClassVar[str] = _TLS_HINT
    address: str
    state_dir: str
    expected_silos: int | None = None  # default: every registered silo
    min_silos: int | None = None       # fewest updates for a round (default: all)
    root_certificate: str | None = None
    certificate: str | None = None
    private_key: str | None = None
    insecure: bool = False
    join_timeout: float = 60.0     # s to wait for enough silos before a round
    round_timeout: float = 600.0   # s a round may take (a silo slower is left out)
    rejoin_wait: float = 0.0       # s to wait each round for silos that dropped out
    secagg: bool = False           # SecAgg+ over Flower (fedavg, mrmtl; tabular)
    public_data: str | None = None  # PrivateKT's public set (.npz with X), as the silos'
    schema: str | None = None  # type: ignore[assignment]  # the declared schema
    run_dir: str | None = None      # where the shared model goes (default: state_dir)

    @model_validator(mode="after")
    def _tls(self) -> ServerSection:
        if not self.insecure:
            for key in ("root_certificate", "certificate", "private_key"):
                if getattr(self, key) is None:
                    raise ConfigError(f"missing key 'server.{key}' ({_TLS_HINT})")
        return self

    def certificates(self) -> tuple[str, str, str] | None:
        """(CA, server certificate, server key) as written, None with insecure = true."""
        if self.insecure:
            return None
        return (str(self.root_certificate), str(self.certificate), str(self.private_key))


class ServerFile(Section):
    """server.toml. [job] holds the job's keys (checked by `silofl.runtime.network`, with
    the run model's defaults); [silos] maps each silo's name to its public key file."""

    missing_hint: ClassVar[str] = _TLS_HINT
    server: ServerSection
    job: dict[str, Any] = Field(default_factory=dict)
    silos: dict[str, str] = Field(default_factory=dict)


def read_silo_file(raw: dict, source: str) -> SiloFile:
    """Validate a parsed silo.toml; ConfigError naming `source` and the key."""
    return validate(SiloFile, raw, "", source)


def read_server_file(raw: dict, source: str) -> ServerFile:
    """Validate a parsed server.toml; ConfigError naming `source` and the key."""
    return validate(ServerFile, raw, "", source)
