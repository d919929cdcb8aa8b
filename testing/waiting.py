"""The one way tests wait: for a condition the test can observe (a metric, a file, a log line, a
process), polled until it holds; the timeout only bounds a hang, it is never what passes a test."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

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
