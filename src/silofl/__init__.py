"""silofl: private, personalized cross-silo federated learning."""

from silofl._version import __version__


def load_run(path):
    """The saved models of a run directory (see `silofl.experiments.artifacts.load_run`)."""
    from silofl.experiments.artifacts import load_run as _load_run  # lazy: keeps import light
    return _load_run(path)


__all__ = ["__version__", "load_run"]
