"""Retries: pauses grow as configured, failures are reported, the last error reaches the caller."""

from __future__ import annotations

import asyncio

import pytest

from bus.retry import Backoff, retry, retry_async

pytestmark = pytest.mark.unit


class Flaky:
    def __init__(self, failures: int, error: type[Exception] = OSError) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error(f"failure {self.calls}")
        return "done"


def test_pauses_grow_linearly_or_exponentially_up_to_the_cap() -> None:
    assert [Backoff(5, 0.5, "linear").pause_s(n) for n in (1, 2, 3)] == [0.5, 1.0, 1.5]
    assert [Backoff(5, 1.0, "exponential", max_s=3).pause_s(n) for n in (1, 2, 3, 4)] == [1, 2, 3, 3]
    with pytest.raises(ValueError, match="attempts=0"):
        Backoff(0)


def test_retry_succeeds_after_passing_failures() -> None:
    slept: list[float] = []
    seen: list[tuple[int, str]] = []
    step = Flaky(2)
    result = retry(step, Backoff(3, 1.0, "linear"), retry_on=(OSError,),
                   on_failure=lambda n, e: seen.append((n, str(e))), sleep=slept.append)
    assert result == "done" and step.calls == 3
    assert slept == [1.0, 2.0] and seen == [(1, "failure 1"), (2, "failure 2")]


def test_retry_raises_the_last_error_and_never_retries_other_errors() -> None:
    slept: list[float] = []
    with pytest.raises(OSError, match="failure 3"):
        retry(Flaky(5), Backoff(3, 0.1), retry_on=(OSError,), sleep=slept.append)
    assert slept == [0.1, 0.2]
    other = Flaky(1, KeyError)
    with pytest.raises(KeyError):
        retry(other, Backoff(3), retry_on=(OSError,), sleep=slept.append)
    assert other.calls == 1


def test_retry_async_retries_and_lets_cancellation_through() -> None:
    step = Flaky(1)

    async def flaky() -> str:
        return step()

    async def cancelled() -> str:
        raise asyncio.CancelledError

    assert asyncio.run(retry_async(flaky, Backoff(2, 0.0))) == "done" and step.calls == 2
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(retry_async(cancelled, Backoff(3, 0.0)))
    broken = Flaky(99)

    async def always_failing() -> str:
        return broken()

    with pytest.raises(OSError, match="failure 2"):
        asyncio.run(retry_async(always_failing, Backoff(2, 0.0)))
