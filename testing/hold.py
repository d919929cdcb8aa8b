"""The encoder's and the tokenizer's test-only holds, seen from a test: gate files the test controls.

A server started with `hold.env` (ROSE_TEST_HOLD_FILE, EncoderConfig.test_hold_file)
keeps the batch its encoder picked from stepping while the gate file exists, so work the
test sent stays in flight until the test releases it, on a fast machine as on a slow one.
Before a hold starts, the launcher's watchdog is paused (ROSE_TEST_WATCHDOG_PAUSE_FILE,
scripts/watchdog.py) and the hold waits for its acknowledgement: no probe of its is left
in the server's queues to take a place the test counts on, however slow the machine.
"""
from __future__ import annotations

import uuid
from pathlib import Path

from testing.reliability_helpers import metric_value
from testing.waiting import wait_until


PAUSE_ENV = "ROSE_TEST_WATCHDOG_PAUSE_FILE"


class _GateFile:
    """A test-only gate of the server: held while `path` exists (`with gate:` pauses the watchdog,
    then holds; leaving releases both). `watchdog`: the server runs the launcher's watchdog."""
    ENV = ""  # the launcher variable that points the server at the file

    _pausing: dict[Path, int] = {}  # pause file -> gates of its server holding now (holds nest)

    def __init__(self, path: Path, watchdog: bool = True):
        self.path = path
        self.pause = path.with_name("watchdog.pause")  # one per server folder, shared by its gates
        self.watchdog = watchdog
        self._pausing_now = False

    @property
    def env(self) -> dict[str, str]:
        return {self.ENV: str(self.path), PAUSE_ENV: str(self.pause)}

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
    ENV = "ROSE_TEST_HOLD_FILE"

    def __init__(self, folder: Path, watchdog: bool = True):
        super().__init__(Path(folder) / "encoder.hold", watchdog)


class TokenizerHold(_GateFile):
    """The tokenizer's test-only hold (ROSE_TEST_TOKENIZE_HOLD_FILE, TokenizerConfig.test_tokenize_hold_file):
    while held, a request waits before it is tokenized; `wait_entered` returns once one is inside."""
    ENV = "ROSE_TEST_TOKENIZE_HOLD_FILE"

    def __init__(self, folder: Path, watchdog: bool = True):
        super().__init__(Path(folder) / "tokenizer.hold", watchdog)
        self.entered = Path(f"{self.path}.entered")

    def __enter__(self):
        self.entered.unlink(missing_ok=True)
        return super().__enter__()

    def wait_entered(self, timeout: float = 60) -> None:
        wait_until(self.entered.exists, timeout, "a request to reach the tokenizer's hold")


def wait_for_metric(metrics_url: str, prefix: str, at_least: float, timeout: float = 60, why: str = "") -> float:
    """Poll the server's metrics until the samples starting with `prefix` sum to `at_least`
    (the encoder publishes every 0.5 s); fails the test after `timeout` s."""
    def reached():
        value = metric_value(metrics_url, prefix)
        return (value,) if value >= at_least else None

    return wait_until(reached, timeout, lambda: f"{prefix} to reach {at_least} {why}", 0.05)[0]
