"""silofl: private, personalized cross-silo federated learning."""

__version__ = "0.1.0"


def load_run(path):
    """The saved models of a run directory (see `silofl.experiments.artifacts.load_run`)."""
    from silofl.experiments.artifacts import load_run as _load_run  # lazy: keeps import light
    return _load_run(path)


__all__ = ["__version__", "load_run"]
