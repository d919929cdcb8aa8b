"""One thread for an encoder's torch work: its loading and timing, then its scheduler's steps.

libgomp (torch's OpenMP on Linux) keeps a pool of worker threads for each thread that starts
parallel work. A second such thread leaves its workers idle in a pool of their own, and once
libgomp manages more threads than there are cores it cuts every worker's spinning short: each
of a step's parallel regions then waits for its workers to be woken. all-MiniLM-L6-v2, one
128-token sequence on 2 cores: 14-21 ms a step when loaded on one thread and stepped on another,
11-12.6 ms on one thread (docs/benchmarks.md, "One thread for torch"). So build_endpoint loads
the engine on the thread that then runs the scheduler's loop.

With one pool, libgomp's default spin before an idle worker sleeps (300,000 pauses: milliseconds)
kept the worker spinning through the gaps between a loaded server's small steps, on cores the
other stubs need; `bound_openmp_spinning` shortens it to what covers the gaps inside a step.
"""
from __future__ import annotations

import os
import queue
import sys
import threading
from concurrent.futures import Future
from typing import Callable, Optional

OPENMP_SPIN_COUNT = "10000"  # libgomp's GOMP_SPINCOUNT for an encoder process (docs/benchmarks.md)


def bound_openmp_spinning(environ=os.environ, torch_loaded: bool | None = None) -> bool:
    """Set GOMP_SPINCOUNT=OPENMP_SPIN_COUNT unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set already
    (the operator's choice wins) or torch is loaded (libgomp read its environment then). True if set."""
    loaded = "torch" in sys.modules if torch_loaded is None else torch_loaded
    if loaded or "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return False
    environ["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT
    return True


class ComputeThread:
    """A thread that runs what `call` gives it, one at a time, until `hand_over` gives it its loop."""

    def __init__(self, name: str):
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable, *args, **kwargs):
        """fn(*args, **kwargs) on this thread; returns its result or raises its exception here."""
        done: Future = Future()
        self._work.put((fn, args, kwargs, done))
        return done.result()

    def hand_over(self, loop: Callable[[], None]) -> None:
        """Run `loop()` on this thread as its last work; the thread ends when `loop` returns."""
        self._work.put((loop, (), {}, None))

    def close(self) -> None:
        """End the thread once what it was given is done (when nothing was handed over)."""
        self._work.put(None)

    def join(self, timeout: Optional[float] = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while (item := self._work.get()) is not None:
            fn, args, kwargs, done = item
            if done is None:
                fn()
                return
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # the caller gets it, as if it had run there
                done.set_exception(exc)
