"""`python -m silofl.cli`: the same entry point as the `silofl` command."""

from silofl.cli import main

main()
