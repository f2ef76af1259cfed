"""`python -m consumers`: the `pkgq` command line, as the `pkgq` script runs it."""

from consumers.cli import main

main()
