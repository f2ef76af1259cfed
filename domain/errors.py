"""Domain errors: a message that breaks one of these rules will break it on every retry."""

from __future__ import annotations

from uuid import UUID

MAX_AMOUNT = 1000
"""Upper bound on one purchase: a larger `amount` is a bug upstream, not a real order."""
MAX_QUEUED_ITEMS = 1000
"""Live items (in_queue and active) one user may hold unless configured otherwise
(PKGQ_MAX_QUEUED_ITEMS): a purchase that would take the user beyond it is refused."""


class DomainError(Exception):
    """A command that the package queue refuses for good (retrying cannot help)."""


class InvalidAmountError(DomainError):
    def __init__(self, amount: int) -> None:
        super().__init__(f"amount must be between 1 and {MAX_AMOUNT}, got {amount}")
        self.amount = amount


class QueueFullError(DomainError):
    """A purchase would take the user beyond the live items one user may hold. Refused before
    anything changes: every retry is refused alike until the user's queue has room."""

    def __init__(self, user_id: UUID, live: int, amount: int, cap: int) -> None:
        super().__init__(
            f"user {user_id} holds {live} live item(s) (in_queue and active); {amount} more "
            f"would make {live + amount}, beyond the {cap} one user may hold "
            "(PKGQ_MAX_QUEUED_ITEMS): refused, nothing changed"
        )
        self.user_id = user_id
        self.live = live
        self.amount = amount
        self.cap = cap


class UnknownPackageError(DomainError):
    def __init__(self, package_id: int) -> None:
        super().__init__(
            f"package {package_id} is not in the catalog; add it with `pkgq catalog add`"
        )
        self.package_id = package_id


class ItemNotFoundError(DomainError):
    def __init__(self, item_id: int, user_id: UUID) -> None:
        super().__init__(f"queue item {item_id} does not exist or is not user {user_id}'s")
        self.item_id = item_id
        self.user_id = user_id


class ItemNotCancellableError(DomainError):
    def __init__(self, item_id: int, status: str) -> None:
        super().__init__(f"queue item {item_id} is {status}; only in_queue/active can be cancelled")
        self.item_id = item_id
        self.status = status


class ItemNotAdjustableError(DomainError):
    def __init__(self, item_id: int, status: str) -> None:
        super().__init__(f"queue item {item_id} is {status}; only in_queue/active can be adjusted")
        self.item_id = item_id
        self.status = status


class NegativeUsageError(DomainError):
    def __init__(self, upload: int, download: int) -> None:
        super().__init__(f"usage must be >= 0, got upload={upload} download={download}")
        self.upload = upload
        self.download = download


class PackageRetiredError(DomainError):
    def __init__(self, package_id: int) -> None:
        super().__init__(
            f"package {package_id} is retired: it sells no more (items bought before keep it)"
        )
        self.package_id = package_id


class UnlimitedTrafficError(DomainError):
    def __init__(self, item_id: int) -> None:
        super().__init__(f"queue item {item_id} has unlimited traffic; its quota cannot change")
        self.item_id = item_id


MAX_COUNTER = 2**63 - 1
"""The largest number a counter holds: Postgres stores them as bigint."""
MIN_COUNTER = -(2**63)


class CounterOverflowError(DomainError):
    """A command would take a counter beyond what a bigint holds, on its own or summed with
    what is stored. Refused before anything changes: the same command fails the same way on
    every retry."""

    def __init__(self, counter: str, value: int, stored: int) -> None:
        super().__init__(
            f"{counter} would be {_shown(value)} (it is {_shown(stored)}), beyond what a "
            f"counter holds ({MIN_COUNTER}..{MAX_COUNTER}): refused, nothing changed"
        )
        self.counter = counter
        self.value = value
        self.stored = stored


def _shown(value: int) -> str:
    """A number for a message: an absurd one by its size only (Python will not print an int of
    more than 4300 digits, and nobody reads one of 40)."""
    return str(value) if abs(value) < 10**30 else f"a number of {value.bit_length()} bits"
