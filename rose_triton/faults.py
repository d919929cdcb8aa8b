"""Python tracebacks from a model stub that dies of a fatal signal."""
from __future__ import annotations

import faulthandler
import sys


def enable_tracebacks() -> None:
    """On SIGSEGV, SIGBUS, SIGABRT, SIGFPE or SIGILL, write every thread's Python traceback to
    the stub's stderr (the server's log), then die of the signal as before (kernel log line,
    core file where allowed). Each model's `initialize` calls it: the stub's interpreter is
    isolated (PyConfig_InitIsolatedConfig), so PYTHONFAULTHANDLER never reaches it."""
    faulthandler.enable(file=sys.__stderr__ if sys.__stderr__ is not None else 2, all_threads=True)
