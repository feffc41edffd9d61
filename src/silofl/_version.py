"""The package version, at the bottom of the layers so any module may read it."""

__version__ = "0.1.0"


#: the saved-model format (run directories, released silo/server models) and its version
FORMAT = "silofl-models"
FORMAT_VERSION = 1


def silofl_version() -> str:
    """The installed package's version (the source tree's when run uninstalled).

    Returns
    -------
    str
        A version string such as ``"0.1.0"``.
    """
    import importlib.metadata  # here: `import silofl` stays cheap

    try:
        return importlib.metadata.version("silofl")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return __version__
