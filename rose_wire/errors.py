"""Errors on the wire: a code, the offending field, a human message, carried as one text.

Triton 2.51 carries only a message on gRPC streams, and hands every error of a
BLS call over as INTERNAL, so the code and the field travel inside the message:
`encode` writes them as a readable prefix and `decode` is the one place that
reads them back. The grammar is `<tag>: <message>` or `<tag> [<field>]: <message>`,
e.g. `invalid input [TEXT]: TEXT[1] is empty or only whitespace`; Triton may put
its own words in front (`in ensemble 'ensemble', ...`), so `decode` finds the
first tag in the text. Code names are those of pb_utils.TritonError.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

INVALID_ARG = "INVALID_ARG"   # the request breaks a rule: fix it, do not retry
UNAVAILABLE = "UNAVAILABLE"   # a queue is full: retry later or on another replica
CANCELLED = "CANCELLED"       # the client cancelled the request
INTERNAL = "INTERNAL"         # the server failed: retry once, report it
CODES = (INVALID_ARG, UNAVAILABLE, CANCELLED, INTERNAL)

_TAGS = {INVALID_ARG: "invalid input", UNAVAILABLE: "overloaded", CANCELLED: "cancelled", INTERNAL: "internal error"}
_CODE_OF_TAG = {tag: code for code, tag in _TAGS.items()}
_FIELD = r"[A-Za-z_][A-Za-z0-9_.]*"  # a tensor or request parameter name
_ENCODED = re.compile(rf"(?<!\w)({'|'.join(_TAGS.values())})(?: \[({_FIELD})\])?: ")
# Triton's own refusal when a model's queue (dynamic_batching queue policy) is full.
TRITON_QUEUE_FULL = "Exceeds maximum queue size"


@dataclass(frozen=True)
class WireError:
    """`code`: one of CODES, or None for a text no model of ours encoded (Triton's own
    errors, transport failures); `field`: the tensor or request parameter at fault, if one is."""
    code: str | None
    message: str
    field: str | None = None

    def __post_init__(self):
        if self.code is not None and self.code not in CODES:
            raise ValueError(f"unknown error code {self.code!r}; known: {CODES}")
        if self.field is not None and not re.fullmatch(_FIELD, self.field):
            raise ValueError(f"error field {self.field!r} is not a tensor or parameter name")


def encode(error: WireError) -> str:
    """The message text a Triton response carries for `error`."""
    if error.code is None:
        raise ValueError("an error without a code cannot be encoded")
    field = f" [{error.field}]" if error.field else ""
    return f"{_TAGS[error.code]}{field}: {error.message}"


def decode(text: str) -> WireError:
    """Code, field and message back from a response's text (whatever Triton put in front)."""
    found = _ENCODED.search(text)
    if found is not None:
        return WireError(_CODE_OF_TAG[found.group(1)], text[found.end():], found.group(2))
    if TRITON_QUEUE_FULL in text:
        return WireError(UNAVAILABLE, text)
    return WireError(None, text)
