"""One typed configuration model for every command (pydantic): the run's sections, the
sweep's grid, the deploy/silo/server files; defaults in one place and the same keys in a
TOML file, on the command line (``--set section.key=value``) and in Python
(``Config(data={...})``). Bad keys and values raise `silofl.errors.ConfigError` naming the
file, the key, the value given and what is allowed.
"""

from silofl.config.base import Section, read_toml, validate
from silofl.config.input import (
    PATH_KEYS,
    apply_overrides,
    check_config_paths,
    check_writable_file,
    load_config,
    parse_override,
    resolve_config_paths,
    toml_value,
)
from silofl.config.run import (
    AuditSection,
    BudgetConfig,
    Config,
    DataConfig,
    ErosionSection,
    ModelConfig,
    OutputConfig,
    PrivacyConfig,
    SiloPrivacy,
    TrainingSection,
    TreesConfig,
    TuningConfig,
    check_privacy_target,
    config_from_dict,
)

__all__ = [
    "PATH_KEYS",
    "AuditSection",
    "BudgetConfig",
    "Config",
    "DataConfig",
    "ErosionSection",
    "TreesConfig",
    "ModelConfig",
    "OutputConfig",
    "PrivacyConfig",
    "Section",
    "SiloPrivacy",
    "TrainingSection",
    "TuningConfig",
    "apply_overrides",
    "check_config_paths",
    "check_privacy_target",
    "check_writable_file",
    "config_from_dict",
    "load_config",
    "parse_override",
    "read_toml",
    "resolve_config_paths",
    "toml_value",
    "validate",
]
