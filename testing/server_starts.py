"""The servers a test session will need, started ahead of need, one after another.

A tritonserver start is seconds of model stubs loading. Started by the fixtures that
first need them, the test process waits through each; here one background thread starts
the planned servers in the order the tests will need them (tests/conftest.py plans), while
the tests run, and a fixture takes its server when it is ready, or the start's exception.
One start at a time: several at once on a small machine slowed every run beside them."""
from __future__ import annotations

import threading
from typing import Callable

from rose_triton.server import TritonServer

Start = Callable[[], TritonServer]


class ServerStarts:
    def __init__(self, planned: list[tuple[str, Start]]) -> None:
        self._lock = threading.Lock()
        self._ready = {key: threading.Event() for key, _ in planned}
        self._results: dict[str, TritonServer | BaseException] = {}
        self._worker = threading.Thread(target=self._start_all, args=(planned,), daemon=True, name="server starts")
        self._worker.start()

    def _start_all(self, planned: list[tuple[str, Start]]) -> None:
        for key, start in planned:
            self._start(key, start)

    def _start(self, key: str, start: Start) -> None:
        try:
            self._results[key] = start()
        except BaseException as exc:  # handed to the fixture that takes it
            self._results[key] = exc
        self._ready[key].set()

    def take(self, key: str, start: Start) -> TritonServer:
        """`key`'s server once it is ready; one that was not planned starts now."""
        with self._lock:
            unplanned = key not in self._ready
            if unplanned:
                self._ready[key] = threading.Event()
        if unplanned:
            self._start(key, start)
        self._ready[key].wait()
        result = self._results[key]
        if isinstance(result, BaseException):
            raise result
        return result

    def kill_all(self) -> None:
        """The session's end: every server started, taken or not, is killed (a start in progress
        is waited for first)."""
        self._worker.join()
        for result in self._results.values():
            if isinstance(result, TritonServer):
                result.kill()
