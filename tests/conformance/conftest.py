"""The conformance modules start real `pkgq` processes as the e2e tests do."""

from tests.e2e.conftest import spawn

__all__ = ["spawn"]
