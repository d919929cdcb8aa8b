"""Error types that map onto client-visible errors."""
from __future__ import annotations


class InputError(ValueError):
    """A request is malformed; the message names the problem, `field` the offending input or
    parameter (e.g. "dimensions", "TEXT", "INPUT_IDS") when there is one."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class InputTooLarge(InputError):
    """A request is over a size limit (texts per request, bytes per text or per request): the
    same invalid input to Triton; the gateway answers it 413 instead of 400."""


class OverloadError(RuntimeError):
    """The server refuses new work because its queue is full."""


class DeviceOutOfMemory(OverloadError):
    """A step ran out of device (or host) memory: its requests are refused as overload (retry, or send
    fewer or shorter texts); the service goes on."""


class RequestCancelled(RuntimeError):
    """The client cancelled the request before all its sequences were computed."""
