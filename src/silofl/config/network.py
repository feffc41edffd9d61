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
from silofl.config.run import DataConfig, check_privacy_target
from silofl.errors import ConfigError, PrivacyError

__all__ = ["DEFAULT_METHODS", "NOISE_MODES", "ServerFile", "ServerSection",
           "SiloDataSection", "SiloFile", "SiloSection", "SiloServerSection",
           "read_server_file", "read_silo_file"]

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

    @model_validator(mode="after")
    def _target_in_range(self) -> SiloSection:
        # the run's range check ([privacy], [budget]): δ ≥ 0.5 would compose every charge
        # of this silo's store to ε ≈ 0
        check_privacy_target(self.epsilon, self.delta, "silo.")
        if self.lifetime_epsilon is not None:
            from silofl.privacy.targets import check_epsilon  # as check_privacy_target
            try:
                check_epsilon(self.lifetime_epsilon, "silo.", "lifetime_epsilon")
            except PrivacyError as e:
                raise ConfigError(str(e)) from None
        return self


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


_RUN_DATA = DataConfig.model_fields  # a silo's own table: the run's [data] defaults


class SiloDataSection(Section):
    """[data] of silo.toml: the silo's own table, the consortium's schema and the silo's
    own split; the keys and defaults of `silofl run`'s [data] that a table uses."""

    section: ClassVar[str] = "data"
    path: str                      # the silo's own table (CSV, CSV.gz or Parquet)
    schema: str  # type: ignore[assignment]  # the consortium's declared schema (TOML)
    test_fraction: float = _RUN_DATA["test_fraction"].default
    seed: int = _RUN_DATA["seed"].default
    missing: str = _RUN_DATA["missing"].default  # impute | drop | error
    sep: str = _RUN_DATA["sep"].default            # CSV separator ("" = ","), e.g. ";"
    encoding: str = _RUN_DATA["encoding"].default  # CSV text encoding ("" = utf-8)
    drop: list[str] = Field(default_factory=list)  # columns to leave out (dates, ids)
    # the person of each row (never a feature): needed for a job at privacy_unit = "person"
    person_column: str = _RUN_DATA["person_column"].default

    @model_validator(mode="after")
    def _check(self) -> SiloDataSection:
        for key in ("path", "schema"):
            if not getattr(self, key).strip():
                raise ConfigError(f"[data] {key} must name a file (the silo's own table; "
                                  "the consortium's schema)")
        if self.path.startswith("<"):
            raise ConfigError(f"[data] path is still the placeholder {self.path!r}; write "
                              "the path of this silo's own table (CSV, CSV.gz or Parquet)")
        if not 0 < self.test_fraction < 1:
            raise ConfigError(f"[data] test_fraction must be in (0, 1), got "
                              f"{self.test_fraction!r}")
        if self.missing not in ("impute", "drop", "error"):
            raise ConfigError(f"[data] missing must be impute, drop or error, got "
                              f"{self.missing!r}")
        return self


class SiloFile(Section):
    """silo.toml: [silo], [server] and, for a table, [data] (instead of [silo] data)."""

    missing_hint: ClassVar[str] = _COMPLETE
    silo: SiloSection
    server: SiloServerSection
    data: SiloDataSection | None = None

    @model_validator(mode="after")
    def _one_data(self) -> SiloFile:
        if self.data is not None and self.silo.data is not None:
            raise ConfigError("[silo] data and [data] both name the silo's data; keep [data] "
                              "(its own table and the consortium's schema)")
        if self.data is None and self.silo.data is None:
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
    poll_interval: float = 0.05    # s between the ServerApp's polls for replies (flwr: 3 s)
    secagg: bool = False           # SecAgg+ over Flower (fedavg, mrmtl, uldp; tabular)
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
