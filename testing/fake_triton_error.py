"""pb_utils.TritonError's shape for tests of rose_triton without a Triton stub."""


class FakeTritonError:
    """A message and a code (the class attributes name the codes)."""
    INVALID_ARG, UNAVAILABLE, CANCELLED, INTERNAL = "c-invalid", "c-unavailable", "c-cancelled", "c-internal"

    def __init__(self, message, code=INTERNAL):
        self._message, self._code = message, code

    def message(self):
        return self._message

    def code(self):
        return self._code
