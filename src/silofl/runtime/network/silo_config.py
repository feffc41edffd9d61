"""A silo's configuration: silo.toml read, checked and its paths resolved.

The keys, types and defaults are `silofl.config.network.SiloSection`'s; this module turns a
file into the `SiloConfig` the silo program (`silo.SiloProgram`) runs with.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from silofl.config.network import DEFAULT_METHODS, SiloSection, read_silo_file
from silofl.errors import ConfigError
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.network.jobspec import DATA_KINDS
from silofl.runtime.network.silo_table import TableSettings, table_settings


@dataclass
class SiloConfig:
    """A silo's settings with paths resolved (`load_silo_config`); the keys, types and
    defaults of silo.toml are `silofl.config.network.SiloSection`'s."""

    name: str
    data: Path                 # tabular: .npz with X_train, y_train, X_test, y_test,
                               # feature_names; graph: the folder of the 7 pandemic files
    epsilon: float             # this job's target (σ is calibrated for it)
    delta: float
    lifetime_epsilon: float    # the store's lifetime target (first time the store sees us)
    budget_store: Path
    state_dir: Path
    private_key: Path
    server_address: str
    root_certificate: Path | None  # None: plain gRPC (only with insecure = true)
    noise: str = SiloSection.model_fields["noise"].default
    max_rounds: int = SiloSection.model_fields["max_rounds"].default
    methods: tuple[str, ...] = DEFAULT_METHODS  # consented
    public_data: Path | None = None  # PrivateKT's public set D_p (.npz with X)
    data_kind: str = SiloSection.model_fields["data_kind"].default  # `DATA_KINDS`
    table: TableSettings | None = None  # [data]: the silo's own table and the shared schema
    run_dir: Path | None = None      # where the released models go (default: state_dir)

    @property
    def release_dir(self) -> Path:
        return Path(self.run_dir if self.run_dir is not None else self.state_dir)

    @property
    def target(self) -> PrivacyTarget:
        return PrivacyTarget(self.epsilon, self.delta)

    @property
    def lifetime(self) -> PrivacyTarget:
        return PrivacyTarget(self.lifetime_epsilon, self.delta)


def _store_path(s: SiloSection, base: Path) -> Path:
    """[silo] budget_store, else the user's lifetime store of [silo] deployment (default
    "default"): the same store whichever folder the silo's config lives in, so a new
    `deploy init` folder is not a new budget."""
    if s.budget_store is not None:
        return base / s.budget_store
    from silofl.privacy.store_paths import check_deployment, default_store_path
    return default_store_path(check_deployment(s.deployment))


def load_silo_config(path: str | Path) -> SiloConfig:
    """Read silo.toml (paths relative to its folder); ConfigError naming the file and the
    bad key (`silofl.config.network.SiloFile`)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read silo config {str(path)!r}: {e}") from None
    base = path.parent
    f = read_silo_file(raw, str(path))
    s, srv = f.silo, f.server
    table = table_settings(f.data, base, str(path))
    if s.data_kind not in DATA_KINDS:
        raise ConfigError(f"{path}: [silo] data_kind must be one of {', '.join(DATA_KINDS)}, "
                          f"got {s.data_kind!r}")
    rel = lambda v: None if v is None else (base / v)  # noqa: E731
    cfg = SiloConfig(
        name=s.name, data=table.path if table else base / str(s.data), epsilon=s.epsilon,
        delta=s.delta,
        lifetime_epsilon=s.epsilon if s.lifetime_epsilon is None else s.lifetime_epsilon,
        budget_store=_store_path(s, base), state_dir=base / s.state_dir,
        private_key=base / s.private_key, server_address=srv.address,
        root_certificate=rel(srv.root_certificate), noise=s.noise, max_rounds=s.max_rounds,
        methods=tuple(s.methods), public_data=rel(s.public_data), data_kind=s.data_kind,
        table=table, run_dir=rel(s.run_dir))
    _ = cfg.target, cfg.lifetime  # validates ε, δ
    return cfg
