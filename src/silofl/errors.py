"""Error types. Every message says what is wrong, where, and how to fix it."""


class SiloflError(Exception):
    """Base class: the CLI turns these into a one-line message and exit code 2."""


class DataError(SiloflError):
    """Input data is missing, unreadable or unusable."""


class ConfigError(SiloflError):
    """A configuration value or key is invalid."""


class PrivacyError(SiloflError):
    """A privacy target or mechanism parameter is invalid."""


class CalibrationError(PrivacyError):
    """No noise level reaches the requested privacy target."""


class BudgetExceeded(PrivacyError):
    """An event would push a silo past its privacy budget; nothing was executed."""
