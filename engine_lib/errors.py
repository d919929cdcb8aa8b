"""Error types that map onto client-visible errors."""


class InputError(ValueError):
    """A request is malformed; the message names the offending field."""


class OverloadError(RuntimeError):
    """The server refuses new work because its queue is full."""
