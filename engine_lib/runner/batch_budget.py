"""`max_batch_tokens=auto`: batch up to the token count where the device saturates.

Below saturation a step costs about the same whatever its size (launch- or
latency-bound), so bigger batches are free throughput; past it, step time
grows in proportion to tokens and a bigger batch only adds latency. At start-up
the engine times steps of 64, 128, 256, ... tokens (a few runs each, the fastest
kept) and stops at the first size n whose double costs at least
`(2 - slack)` times as much: the budget is that n. If no measured size
saturates, the largest one is used.

On a CPU nothing saturates: every token costs from the start, yet bigger steps
still run more tokens a second (fewer per-step costs, better-shaped GEMMs) until
their working set outgrows the caches. A step is never pre-empted, so the
budget there is a latency bound instead (`bounded_tokens`): the largest size
whose step takes at most `max_cpu_step_ms`.

Encoders starting together on one host (a models file, several instances) time
their ladders one after another (`timing_alone`, a host-wide file lock), so no
ladder is timed against another one's steps.
"""
from __future__ import annotations

import fcntl
import logging
import os
import tempfile
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

from engine_lib.contract import PackedBatch

log = logging.getLogger(__name__)

LADDER_START, LADDER_MAX = 64, 8192
SLACK = 0.2  # doubling the batch must buy > 1/(1 - 0.1) ~ 11% more throughput to be worth it
TIMING_LOCK = os.path.join(tempfile.gettempdir(), "rose-step-timing.lock")
TIMING_LOCK_WAIT_S = 300.0  # past it (a stuck holder) the ladder is timed anyway, with a warning


@contextmanager
def timing_alone(path: str | None = None, wait_s: float = TIMING_LOCK_WAIT_S,
                 clock: Callable[[], float] = time.monotonic, pause: Callable[[float], None] = time.sleep
                 ) -> Iterator[bool]:
    """Hold the host-wide lock of start-up step timing (flock: released by the kernel if its holder
    dies); yields whether it is held. A lock file that cannot be opened or a holder past `wait_s`:
    timed anyway, with a warning."""
    path = path or TIMING_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        fd, why = None, exc
    if fd is None:
        log.warning("timing start-up steps without the host lock %s: %s", path, why)
        yield False
        return
    try:
        deadline, held = clock() + wait_s, False
        while not held:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if clock() >= deadline:
                    log.warning("timing start-up steps without the host lock %s: held by another encoder "
                                "for over %.0f s", path, wait_s)
                    break
                pause(0.05)
        yield held
    finally:
        os.close(fd)  # releases the lock


def saturation_tokens(step_seconds: Callable[[int], float], start: int = LADDER_START,
                      largest: int = LADDER_MAX, slack: float = SLACK) -> tuple[int, dict[int, float]]:
    """(budget, {tokens: seconds measured}); `step_seconds(n)` times one step of n tokens."""
    timings = {start: step_seconds(start)}
    n = start
    while n * 2 <= largest:
        timings[n * 2] = step_seconds(n * 2)
        if timings[n * 2] >= (2 - slack) * timings[n]:
            return n, timings
        n *= 2
    return n, timings


def ladder(start: int, largest: int) -> list[int]:
    """start, 2 x start, ... below `largest`, then `largest` itself."""
    sizes, n = [], start
    while n < largest:
        sizes.append(n)
        n *= 2
    return sizes + [largest]


def bounded_tokens(step_seconds: Callable[[int], float], bound_s: float, largest: int,
                   start: int = LADDER_START) -> tuple[int, dict[int, float]]:
    """(budget, {tokens: seconds measured}): the largest ladder size whose step takes at most `bound_s`
    (the smallest when none does); measuring stops at the first size over the bound."""
    timings: dict[int, float] = {}
    budget = None
    for n in ladder(start, largest):
        timings[n] = step_seconds(n)
        if timings[n] > bound_s:
            break
        budget = n
    return budget or min(timings), timings


def probe_batch(num_tokens: int, seq_len: int, vocab_size: int, seed: int = 0) -> PackedBatch:
    """num_tokens tokens as sequences of seq_len (the last one shorter), random ids."""
    rng = np.random.default_rng(seed)
    lengths = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len else [])
    return PackedBatch.from_sequences([rng.integers(0, vocab_size, size=n) for n in lengths])


def engine_step_timer(engine, runs: int = 3, clock: Callable[[], float] = time.perf_counter,
                      seq_len: int = 256) -> Callable[[int], float]:
    """Times `engine.step(...).wait()` (the served path, graphs included), fastest of `runs` after one warm-up."""
    seq_len = min(seq_len, engine.max_positions)

    def step_seconds(num_tokens: int) -> float:
        batch = probe_batch(num_tokens, seq_len, engine.vocab_size)
        engine.step(batch).wait()  # warm-up (and, with graphs, the eager run and the capture)
        best = float("inf")
        for _ in range(runs):
            start = clock()
            engine.step(batch).wait()
            best = min(best, clock() - start)
        return best
    return step_seconds


def auto_batch_tokens(engine, largest: int = LADDER_MAX, runs: int = 3,
                      clock: Callable[[], float] = time.perf_counter) -> int:
    budget, timings = saturation_tokens(engine_step_timer(engine, runs, clock), largest=largest)
    log.info("max_batch_tokens=auto: %d tokens (step ms by tokens: %s)", budget,
             ", ".join(f"{n}: {s * 1e3:.2f}" for n, s in timings.items()))
    return budget


def step_bounded_tokens(engine, largest: int, bound_s: float, runs: int = 2,
                        clock: Callable[[], float] = time.perf_counter) -> int:
    budget, timings = bounded_tokens(engine_step_timer(engine, runs, clock), bound_s, largest)
    log.info("max_cpu_step_ms=%d: %d tokens a step at most (step ms by tokens: %s)", round(bound_s * 1e3), budget,
             ", ".join(f"{n}: {s * 1e3:.2f}" for n, s in timings.items()))
    return budget
