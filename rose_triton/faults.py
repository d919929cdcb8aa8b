"""A model stub's faults: Python tracebacks when it dies of a fatal signal, and the test-only
fault gate (ROSE_TEST_FAULTS) through which a test in another process holds engine_lib.faults' points."""
from __future__ import annotations

import faulthandler
import logging
import os
import sys
import time
from pathlib import Path
from typing import Mapping, Optional

from engine_lib import faults

FAULTS_ENV = "ROSE_TEST_FAULTS"  # a folder: the server's fault gate; unset (the default) = off

log = logging.getLogger(__name__)


def start_stub() -> None:
    """Each model's `initialize` calls it first: tracebacks on fatal signals, and the test-only
    fault gate when ROSE_TEST_FAULTS names a folder (never in a deployment)."""
    enable_tracebacks()
    install_fault_gate()


def install_fault_gate(environ: Optional[Mapping[str, str]] = None) -> None:
    """engine_lib.faults' hook: a FileGate on the ROSE_TEST_FAULTS folder; unset: none (off)."""
    folder = (os.environ if environ is None else environ).get(FAULTS_ENV, "")
    if folder:
        faults.install(FileGate(folder))
        log.warning("test-only fault gate on (%s=%s): a file there holds this model's work", FAULTS_ENV, folder)


def enable_tracebacks() -> None:
    """On SIGSEGV, SIGBUS, SIGABRT, SIGFPE or SIGILL, write every thread's Python traceback to
    the stub's stderr (the server's log), then die of the signal as before (kernel log line,
    core file where allowed). The stub's interpreter is isolated (PyConfig_InitIsolatedConfig),
    so PYTHONFAULTHANDLER never reaches it."""
    faulthandler.enable(file=sys.__stderr__ if sys.__stderr__ is not None else 2, all_threads=True)


def gate_file(folder: str | Path, point: str) -> Path:
    """The file that holds `point` while it exists (testing/hold.py creates and removes it)."""
    return Path(folder) / f"{point}.hold"


def entered_file(folder: str | Path, point: str) -> Path:
    """Created by a caller that starts waiting at a held `point`: a request is inside. Each caller
    that enters adds one byte, so its size counts them (several model instances wait at once)."""
    return Path(folder) / f"{point}.hold.entered"


class FileGate:
    """engine_lib.faults' hook for a test in another process: `point` is held while its
    gate_file exists. A waiting caller polls (POLL_S), so a release is seen within it."""
    POLL_S = 0.01

    def __init__(self, folder: str):
        if not os.path.isdir(folder):
            raise ValueError(f"{FAULTS_ENV}={folder!r} is not a folder (unset it outside tests)")
        self.folder = folder
        self._files = {point: str(gate_file(folder, point)) for point in faults.POINTS}

    def held(self, point: str) -> bool:
        return os.path.exists(self._files[point])

    def wait(self, point: str) -> None:
        wait_at_gate(self._files[point], str(entered_file(self.folder, point)))


def wait_at_gate(gate: str, entered: str) -> None:
    """While the file `gate` exists: add a byte to `entered` (the test sees one more caller arrived)
    and wait until the test removes `gate`, polling every FileGate.POLL_S."""
    if not os.path.exists(gate):
        return
    with open(entered, "ab") as marker:  # O_APPEND: callers in several processes each add theirs
        marker.write(b".")
    while os.path.exists(gate):
        time.sleep(FileGate.POLL_S)
