"""Checks that `make check` runs over the source tree (not part of what pkgq runs)."""
