"""The HA lab for the chaos group: started once for the session (about 30 s from nothing), and
removed at the end unless it existed when the session began (a developer's lab stays) or
PKGQ_HA_KEEP=1 asks to keep it. Each test works in names of its own on it (`namespace`),
removed afterwards."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from uuid import uuid4

import pytest

from tests.support import ha_lab
from tests.support.ha_lab import Lab


@pytest.fixture(scope="session")
def the_lab() -> Iterator[Lab]:
    was_up = ha_lab.exists()
    started = Lab.up()  # also repairs a lab that a previous run left failed over
    yield started
    # Under xdist another worker may still be using the lab: leave it to whoever started the run.
    alone = "PYTEST_XDIST_WORKER" not in os.environ
    if alone and not was_up and os.environ.get("PKGQ_HA_KEEP") != "1":
        ha_lab.down()


@pytest.fixture
async def namespace(the_lab: Lab) -> AsyncIterator[str]:
    """The test's database on the lab, and the first part of its exchange and queue names."""
    ns = f"chaos_{uuid4().hex[:10]}"
    yield ns
    await asyncio.wait_for(the_lab.remove_namespace(f"{ns}.", ns), timeout=120)
