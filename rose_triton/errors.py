"""engine_lib's errors as Triton responses carry them: rose_wire's code, field and encoded message."""
from __future__ import annotations

from engine_lib.errors import InputError, OverloadError, RequestCancelled
from rose_wire import CANCELLED, INTERNAL, INVALID_ARG, UNAVAILABLE, WireError, decode, encode

_CODES = ((InputError, INVALID_ARG), (OverloadError, UNAVAILABLE), (RequestCancelled, CANCELLED))


def wire_error(error: BaseException) -> WireError:
    """Our typed errors keep their code (and an InputError its field); anything else is INTERNAL."""
    code = next((code for cls, code in _CODES if isinstance(error, cls)), INTERNAL)
    field = error.field if isinstance(error, InputError) else None
    try:
        return WireError(code, str(error), field)
    except ValueError:  # a field the wire cannot carry (not a name): the message still names the problem
        return WireError(code, str(error))


def triton_error(pb_utils, error: BaseException | WireError):
    """A pb_utils.TritonError with the encoded message and its code."""
    wire = error if isinstance(error, WireError) else wire_error(error)
    return pb_utils.TritonError(encode(wire), getattr(pb_utils.TritonError, wire.code))


def relayed_error(pb_utils, error):
    """A step's error (BLS) passed on with the code its message encodes: BLS hands every
    error over as INTERNAL (Triton 2.51). Text no model of ours encoded keeps its own code."""
    wire = decode(error.message())
    if wire.code is None:
        return pb_utils.TritonError(error.message(), error.code())
    return triton_error(pb_utils, wire)
