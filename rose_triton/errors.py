"""Our errors as Triton sees them: a tag at the start of each message, and its error code."""
from __future__ import annotations

from engine_lib.errors import InputError, OverloadError, RequestCancelled

# Triton's BLS responses (2.51) arrive with code INTERNAL whatever the step
# said, and gRPC stream responses carry a message only, so each message our
# models send starts with a tag a client (and the `embed` front) can read back.
TAGS = {InputError: ("invalid input", "INVALID_ARG"), OverloadError: ("overloaded", "UNAVAILABLE"),
        RequestCancelled: ("cancelled", "CANCELLED")}
INTERNAL = ("internal error", "INTERNAL")
# Triton's own refusal when a model's queue (dynamic_batching queue policy) is full.
TRITON_QUEUE_FULL = "Exceeds maximum queue size"


def _tag(error: Exception) -> tuple[str, str]:
    return next((tag for kind, tag in TAGS.items() if isinstance(error, kind)), INTERNAL)


def client_message(error: Exception) -> str:
    return f"{_tag(error)[0]}: {error}"


def code_name(error: Exception) -> str:
    """Triton error code name (pb_utils.TritonError.<name>) for one of our errors (subclasses included)."""
    return _tag(error)[1]


def code_name_from_message(message: str) -> str | None:
    """The code a tagged (or Triton queue-full) message stands for; None if untagged."""
    if TRITON_QUEUE_FULL in message:
        return "UNAVAILABLE"
    for tag, name in TAGS.values():
        if f"{tag}: " in message:
            return name
    return None
