"""The package version, at the bottom of the layers so any module may read it."""

__version__ = "0.1.0"
