"""Retrying a step that may fail for a passing reason (a broker hiccup, a store busy for a moment).

One rule for the services: `attempts` tries in all, a pause between them that grows with the attempt
number, `on_failure` told of every failure (to log, or to restore state before the next try), and the
last error raised to the caller, who decides what giving up means (raise, dead-letter the input).
Errors outside `retry_on` are raised at once: they are not passing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Pause after failed attempt n (1-based): `first_s * n` (linear) or `first_s * 2**(n-1)`
    (exponential), at most `max_s`."""

    attempts: int = 3
    first_s: float = 0.5
    growth: Literal["linear", "exponential"] = "exponential"
    max_s: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.first_s < 0 or self.max_s < 0:
            raise ValueError(f"Backoff(attempts={self.attempts}, first_s={self.first_s}, max_s={self.max_s}): "
                             "attempts must be >= 1 and the pauses >= 0")

    def pause_s(self, attempt: int) -> float:
        grown = self.first_s * attempt if self.growth == "linear" else self.first_s * 2 ** (attempt - 1)
        return min(grown, self.max_s)


OnFailure = Callable[[int, Exception], None]


def retry(step: Callable[[], T], backoff: Backoff, *, retry_on: tuple[type[Exception], ...] = (Exception,),
          on_failure: OnFailure | None = None, sleep: Callable[[float], None] = time.sleep) -> T:
    """`step()`, tried up to `backoff.attempts` times; raises the last error."""
    for attempt in range(1, backoff.attempts + 1):
        try:
            return step()
        except retry_on as e:
            if on_failure is not None:
                on_failure(attempt, e)
            if attempt == backoff.attempts:
                raise
            sleep(backoff.pause_s(attempt))
    raise AssertionError("unreachable: the last attempt returns or raises")


async def retry_async(step: Callable[[], Awaitable[T]], backoff: Backoff, *,
                      retry_on: tuple[type[Exception], ...] = (Exception,), on_failure: OnFailure | None = None,
                      never_retry: tuple[type[BaseException], ...] = (asyncio.CancelledError,)) -> T:
    """`await step()`, tried up to `backoff.attempts` times; raises the last error. `never_retry` errors
    (a cancelled task, a failure that must stop the worker) pass through at once."""
    for attempt in range(1, backoff.attempts + 1):
        try:
            return await step()
        except never_retry:
            raise
        except retry_on as e:
            if on_failure is not None:
                on_failure(attempt, e)
            if attempt == backoff.attempts:
                raise
            await asyncio.sleep(backoff.pause_s(attempt))
    raise AssertionError("unreachable: the last attempt returns or raises")
