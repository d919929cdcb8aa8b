"""The servers a test session will need, started in background threads as it begins.

A tritonserver start is seconds of model stubs loading. Started one after another by
the fixtures that first need them, the test process waits through each; here every
start the selected tests need begins at once (tests/conftest.py decides which), and a
fixture takes its server when it is ready, or the start's exception."""
from __future__ import annotations

import threading
from typing import Callable

from rose_triton.server import TritonServer


class ServerStarts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._results: dict[str, TritonServer | BaseException] = {}

    def begin(self, key: str, start: Callable[[], TritonServer]) -> None:
        """Start `key`'s server in the background, unless it is started already."""
        with self._lock:
            if key in self._threads:
                return
            thread = self._threads[key] = threading.Thread(target=self._run, args=(key, start), daemon=True,
                                                           name=f"start {key}")
        thread.start()

    def _run(self, key: str, start: Callable[[], TritonServer]) -> None:
        try:
            self._results[key] = start()
        except BaseException as exc:  # handed to the fixture that takes it
            self._results[key] = exc

    def take(self, key: str, start: Callable[[], TritonServer]) -> TritonServer:
        """`key`'s server once it is ready (started now if nothing began it)."""
        self.begin(key, start)
        self._threads[key].join()
        result = self._results[key]
        if isinstance(result, BaseException):
            raise result
        return result

    def kill_all(self) -> None:
        """The session's end: every server started, taken or not, is killed (starts in progress
        are waited for first)."""
        for thread in list(self._threads.values()):
            thread.join()
        for result in self._results.values():
            if isinstance(result, TritonServer):
                result.kill()
