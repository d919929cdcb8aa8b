"""The one way tests wait: for a condition the test can observe (a metric, a file, a log line, a
process), polled until it holds; the timeout only bounds a hang, it is never what passes a test."""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 60.0, what: str = "the condition",
               interval: float = 0.01) -> T:
    """Poll `condition` until it returns something truthy; return that. After `timeout` s the test
    fails naming `what` (a string, or a callable for a message built then, e.g. with a log tail)."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")
        time.sleep(interval)
    return result


async def wait_until_async(probe: Callable[[], Awaitable[T]], condition: Callable[[T], object],
                           timeout: float = 60.0, what: str = "the condition", interval: float = 0.01) -> T:
    """wait_until inside an event loop: await `probe` until `condition` holds for what it
    returned; return that. After `timeout` s the test fails naming `what`."""
    deadline = time.monotonic() + timeout
    while not condition(result := await probe()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)
    return result
