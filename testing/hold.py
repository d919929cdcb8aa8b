"""The server's test-only holds, seen from a test: gate files the test controls.

A server started with `hold.env` (ROSE_TEST_FAULTS=<folder>, rose_triton/faults.py) holds
a fault point of engine_lib/faults.py while the point's gate file exists in that folder:
EncoderHold keeps the encoder from picking a batch, so work the test sent stays in flight
until the test releases it, on a fast machine as on a slow one; TokenizerHold keeps a text
request from being tokenized. Before a hold starts, the launcher's watchdog is paused
(`watchdog.pause` in the same folder, scripts/watchdog.py) and the hold waits for its
acknowledgement: no probe of its is left in the server's queues to take a place the test
counts on, however slow the machine.
"""
from __future__ import annotations

import uuid
from contextlib import contextmanager
from pathlib import Path

from engine_lib import faults
from rose_triton.faults import FAULTS_ENV, FileGate, entered_file, gate_file
from testing.reliability_helpers import metric_value
from testing.waiting import wait_until


class _GateFile:
    """A test-only gate of the server: `point` held while its file exists (`with gate:` pauses
    the watchdog, then holds; leaving releases both). `watchdog`: the server runs the launcher's watchdog."""
    POINT = ""  # the engine_lib.faults point it holds

    _pausing: dict[Path, int] = {}  # pause file -> gates of its server holding now (holds nest)

    def __init__(self, folder: Path, watchdog: bool = True):
        self.folder = Path(folder)
        self.path = gate_file(self.folder, self.POINT)
        self.pause = self.folder / "watchdog.pause"  # scripts/watchdog.py PAUSE_FILE_NAME, shared by the gates
        self.watchdog = watchdog
        self._pausing_now = False

    @property
    def env(self) -> dict[str, str]:
        """What the server is started with (the same for every gate of one folder)."""
        return {FAULTS_ENV: str(self.folder)}

    def __enter__(self):
        if self.watchdog:
            self._pause_watchdog()
        self.path.touch()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def release(self) -> None:
        self.path.unlink(missing_ok=True)
        if self._pausing_now:
            self._pausing_now = False
            self._pausing[self.pause] -= 1
            if not self._pausing[self.pause]:
                self.pause.unlink(missing_ok=True)

    def _pause_watchdog(self) -> None:
        self._pausing_now = True
        self._pausing[self.pause] = self._pausing.get(self.pause, 0) + 1
        if self._pausing[self.pause] > 1:
            return  # paused already by a gate holding outside this one
        token = uuid.uuid4().hex
        self.pause.write_text(token)
        ack = Path(f"{self.pause}.ack")
        wait_until(lambda: ack.exists() and ack.read_text() == token, 120,
                   "the watchdog to acknowledge its pause (its last probes answered)", 0.05)


class EncoderHold(_GateFile):
    """The encoder's hold: while held, its scheduler picks no batch (queued requests are still
    checked for cancellation)."""
    POINT = faults.ENCODER_BATCH


class TokenizerHold(_GateFile):
    """The tokenizer's hold: while held, a text request waits before it is tokenized (in the
    `tokenizer` model and the unary `embed` front); `wait_entered` returns once one is inside."""
    POINT = faults.TOKENIZE

    def __init__(self, folder: Path, watchdog: bool = True):
        super().__init__(folder, watchdog)
        self.entered = entered_file(self.folder, self.POINT)

    def __enter__(self):
        self.entered.unlink(missing_ok=True)
        return super().__enter__()

    def wait_entered(self, count: int = 1, timeout: float = 60) -> None:
        """Until `count` requests wait at the hold (each model instance that tokenizes holds one)."""
        wait_until(lambda: self.entered.exists() and self.entered.stat().st_size >= count, timeout,
                   f"{count} request(s) to reach the tokenizer's hold")


class BatchLineHold(_GateFile):
    """A gateway's batch runner's hold (the gateway started with `env`): while held, the runner
    starts no new line of its job (lines in flight go on); `wait_entered` returns once it waits
    there. No watchdog to pause: the gateway is not a Triton server."""
    POINT = faults.BATCH_LINE

    def __init__(self, folder: Path):
        super().__init__(folder, watchdog=False)
        self.entered = entered_file(self.folder, self.POINT)

    def __enter__(self):
        self.entered.unlink(missing_ok=True)
        return super().__enter__()

    def wait_entered(self, timeout: float = 60) -> None:
        wait_until(self.entered.exists, timeout, "the batch runner to reach its hold")


def wait_for_metric(metrics_url: str, prefix: str, at_least: float, timeout: float = 60, why: str = "") -> float:
    """Poll the server's metrics until the samples starting with `prefix` sum to `at_least`
    (the encoder publishes every 0.5 s); fails the test after `timeout` s."""
    def reached():
        value = metric_value(metrics_url, prefix)
        return (value,) if value >= at_least else None

    return wait_until(reached, timeout, lambda: f"{prefix} to reach {at_least} {why}", 0.05)[0]


def wait_for_metric_zero(metrics_url: str, prefix: str, timeout: float = 60, why: str = "") -> None:
    """Poll until the samples starting with `prefix` sum to 0. The encoder publishes its gauges every
    0.5 s, so a page may still show work that has gone: a test that sees a gauge at 0 before it sends
    work knows that a rise after it is that work's, not a value left from an earlier test's."""
    wait_until(lambda: metric_value(metrics_url, prefix) == 0, timeout,
               lambda: f"{prefix} to read 0 {why}", 0.05)


@contextmanager
def held_in_process(folder: Path):
    """This process's fault points gated by the gate files in `folder` (unit tests: the hook
    a server installs at start-up, rose_triton/faults.py), off again on leaving."""
    faults.install(FileGate(str(folder)))
    try:
        yield
    finally:
        faults.install(None)
