"""Experiments: configuration files, runs that write a run directory, and reports."""
