"""Test-only fault points: the named places in the serving path where a hook, installed once at
start-up, may hold work so a test can keep it in flight on any machine.

Off (the default, and always in a deployment): no hook is installed and a point costs one
global test. The hook a server installs (rose_triton/faults.py, when ROSE_TEST_FAULTS names a
folder) is the only thing that looks at files; docs/operations.md, "Test-only hold"."""
from __future__ import annotations

from typing import Optional, Protocol

# Where the serving path asks; the hook decides whether it is held now.
ENCODER_BATCH = "encoder.before_batch"  # the encoder's scheduler, before it picks a batch (held: none is picked)
TOKENIZE = "tokenizer.before_tokenize"  # a text request, before it is tokenized (held: it waits)
BATCH_LINE = "batch.before_line"  # the gateway's batch runner, before it starts a job's next line (held: it waits)
POINTS = (ENCODER_BATCH, TOKENIZE, BATCH_LINE)


class FaultHook(Protocol):
    def held(self, point: str) -> bool:
        """True while `point` is held; never blocks (the caller keeps serving meanwhile)."""

    def wait(self, point: str) -> None:
        """Return once `point` is not held (the caller waits meanwhile)."""


hook: Optional[FaultHook] = None


def install(new_hook: Optional[FaultHook]) -> None:
    """Set the process's hook (None: off). Called once at start-up, before any request."""
    global hook
    hook = new_hook


def held(point: str) -> bool:
    """True while a test holds `point`; off: False."""
    return hook is not None and hook.held(point)


def wait(point: str) -> None:
    """Wait while a test holds `point`; off: returns at once."""
    if hook is not None:
        hook.wait(point)
