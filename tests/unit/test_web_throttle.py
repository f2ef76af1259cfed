"""consumers/web/throttle.py: failed sign-ins counted in a sliding window per user name and per
client address, in bounded memory."""

from __future__ import annotations

from consumers.web.throttle import Limit, LoginThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def throttle(clock: Clock, **options: int) -> LoginThrottle:
    return LoginThrottle(Limit(3, 60), Limit(10, 60), clock=clock, **options)


def test_the_wait_is_until_the_oldest_failure_that_keeps_the_count_at_the_limit_expires() -> None:
    clock = Clock()
    gate = throttle(clock)
    for step in range(3):
        assert gate.wait_for("olga", "10.0.0.1") == 0
        gate.attempt("olga", "10.0.0.1")
        clock.now += 10 * (step + 1)  # failures at 1000, 1010, 1030; now 1060
    assert gate.wait_for("olga", "10.0.0.1") == 0  # the first went out of the window at 1060
    gate.attempt("olga", "10.0.0.1")  # 1010, 1030, 1060
    assert gate.wait_for("olga", "10.0.0.1") == 10  # 1010 + 60 - 1060
    clock.now += 10
    assert gate.wait_for("olga", "10.0.0.1") == 0


def test_a_right_password_clears_the_names_failures_and_only_its_own_at_the_address() -> None:
    clock = Clock()
    gate = throttle(clock)
    for n in range(9):  # nine wrong guesses at other names from one address
        gate.attempt(f"name-{n}", "10.0.0.1")
    for _ in range(2):
        gate.attempt("olga", "10.0.0.1")
    gate.attempt("olga", "10.0.0.1")  # the right one, counted until it is checked
    gate.succeeded("olga", "10.0.0.1")
    assert gate.wait_for("olga", "10.0.0.2") == 0  # her name's failures are gone
    gate.attempt("vic", "10.0.0.1")  # the address's tenth failure: the guessing still counts
    assert gate.wait_for("anyone", "10.0.0.1") == 60


def test_sign_ins_posted_at_once_count_before_their_passwords_are_checked() -> None:
    gate = throttle(Clock())
    admitted = 0
    for _ in range(10):  # all in flight together: none has failed yet
        if gate.wait_for("olga", "10.0.0.1") == 0:
            gate.attempt("olga", "10.0.0.1")
            admitted += 1
    assert admitted == 3  # the per-name limit, not ten hashes


def test_the_address_limit_counts_failures_for_every_name() -> None:
    clock = Clock()
    gate = throttle(clock)
    for n in range(10):
        gate.attempt(f"name-{n}", "10.0.0.1")
    assert gate.wait_for("someone-else", "10.0.0.1") == 60
    assert gate.wait_for("someone-else", "10.0.0.2") == 0


def test_a_flood_of_made_up_names_keeps_at_most_max_keys_in_memory() -> None:
    clock = Clock()
    gate = throttle(clock, max_keys=50)
    for n in range(1000):
        gate.attempt(f"name-{n}", f"10.0.{n // 250}.{n % 250}")
    assert gate.tracked() <= 50
    assert gate.wait_for("name-999", "10.0.3.249") == 0  # one failure each: under the limits
