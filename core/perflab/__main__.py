"""`python -m perflab` is the same as the `perflab` command."""

from perflab.cli import main

main()
