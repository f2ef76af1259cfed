"""The event loop every pkgq command runs on: uvloop by default, asyncio's own on request.

A consumer draining a backlog is bound by one core of Python: its loop's socket reads and
writes, callbacks and tasks are part of every delivery's cost, and uvloop (libuv under the same
asyncio API) does that part in C. `pkgq bench` measured the usage backlog drained about a fifth
faster on it (docs/explanation/performance.md). PKGQ_EVENT_LOOP=asyncio keeps the standard
library's loop, for a platform uvloop does not support or to rule it out while debugging.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

EventLoopName = Literal["uvloop", "asyncio"]

_chosen: EventLoopName = "uvloop"


def choose(name: EventLoopName) -> None:
    """The loop later commands of this process run on (the CLI's settings say which)."""
    global _chosen
    _chosen = name


def chosen() -> EventLoopName:
    return _chosen


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the chosen loop (uvloop is imported only when it is chosen)."""
    if _chosen == "asyncio":
        return asyncio.new_event_loop
    import uvloop

    return uvloop.new_event_loop
