"""What a handler may raise to steer its message (xqueue's release and bury, from inside).

    raise Retry(delay=30)          # not now: deliver it again in 30 s (counts as an attempt)
    raise Bury("needs a human")    # give up on it at once: into the dead-letter store

Any other exception is a handler error and follows the route's retry policy.
"""

from __future__ import annotations


class Retry(Exception):  # noqa: N818  (the name handlers raise; reads as an instruction)
    """Release the message to be delivered again after `delay` seconds (None: the route's
    backoff). Like Celery's `self.retry(countdown=…)`, it counts as an attempt, so the route's
    max_attempts still bounds it; the user's later messages wait behind it, as for any retry."""

    def __init__(self, delay: float | None = None, reason: str = "released by the handler"):
        if delay is not None and delay < 0:
            raise ValueError(f"delay must not be negative, got {delay}")
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


class Bury(Exception):  # noqa: N818
    """Bury the message in the dead-letter store at once with this reason (no retries). Like a
    broken domain rule, it does not hold the user's later messages back."""

    def __init__(self, reason: str = "buried_by_handler", detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


class TTRExceededError(Exception):
    """The handler ran longer than the route's TTR and was cancelled."""

    def __init__(self, ttr: float) -> None:
        super().__init__(f"the handler ran longer than the route's TTR of {ttr:g} s")
        self.ttr = ttr
