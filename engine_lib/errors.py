"""Error types that map onto client-visible errors."""
from __future__ import annotations


class InputError(ValueError):
    """A request is malformed; the message names the offending field."""


class OverloadError(RuntimeError):
    """The server refuses new work because its queue is full."""


class RequestCancelled(RuntimeError):
    """The client cancelled the request before all its sequences were computed."""
