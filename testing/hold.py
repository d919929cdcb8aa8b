"""The encoder's and the tokenizer's test-only holds, seen from a test: gate files the test controls.

A server started with `hold.env` (ROSE_TEST_HOLD_FILE, EncoderConfig.test_hold_file)
keeps the batch its encoder picked from stepping while the gate file exists, so work the
test sent stays in flight until the test releases it, on a fast machine as on a slow one.
The launcher's watchdog does not probe while it is held (scripts/watchdog.py).
"""
from __future__ import annotations

from pathlib import Path

from testing.reliability_helpers import metric_value
from testing.waiting import wait_until


class _GateFile:
    """A test-only gate of the server: held while `path` exists (`with gate:` holds, leaving releases)."""
    ENV = ""  # the launcher variable that points the server at the file

    def __init__(self, path: Path):
        self.path = path

    @property
    def env(self) -> dict[str, str]:
        return {self.ENV: str(self.path)}

    def __enter__(self):
        self.path.touch()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


class EncoderHold(_GateFile):
    ENV = "ROSE_TEST_HOLD_FILE"

    def __init__(self, folder: Path):
        super().__init__(Path(folder) / "encoder.hold")


class TokenizerHold(_GateFile):
    """The tokenizer's test-only hold (ROSE_TEST_TOKENIZE_HOLD_FILE, TokenizerConfig.test_tokenize_hold_file):
    while held, a request waits before it is tokenized; `wait_entered` returns once one is inside."""
    ENV = "ROSE_TEST_TOKENIZE_HOLD_FILE"

    def __init__(self, folder: Path):
        super().__init__(Path(folder) / "tokenizer.hold")
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
