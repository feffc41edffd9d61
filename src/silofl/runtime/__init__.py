"""Runtimes that execute algorithms: the in-process simulator (networked runtimes later)."""
