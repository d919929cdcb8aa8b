"""Failures after which the encoder process must end so the launcher restarts it.

A sticky device error leaves the CUDA context unusable (every later call
fails); a dead service thread leaves requests hanging. Either way the service
answers what is pending with an error, then calls `exit_process`: the
launcher's watchdog sees the exit code and restarts the server, which is never
"ready" while hanging requests.
"""
from __future__ import annotations

import logging
import os
import time

# Errors after which the CUDA context is unusable (every later call fails): restart the process.
STICKY_DEVICE_ERRORS = ("illegal memory access", "device-side assert", "unspecified launch failure",
                        "misaligned address", "illegal instruction", "uncorrectable ECC error",
                        "CUBLAS_STATUS_EXECUTION_FAILED", "CUDA error: unknown error")
EXIT_CODE = 70


def is_sticky_device_error(exc: BaseException) -> bool:
    text = str(exc)
    return any(marker in text for marker in STICKY_DEVICE_ERRORS)


def exit_process(reason: str) -> None:
    """Default `on_fatal`: give the error responses a moment to leave, then end the process."""
    time.sleep(0.5)
    logging.shutdown()
    os._exit(EXIT_CODE)
