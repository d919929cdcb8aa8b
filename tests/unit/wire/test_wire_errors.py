"""rose_wire's error encoding: what encode writes, decode reads back (code, field, message),
whatever Triton puts in front; text we did not encode; Triton's own queue-full refusal."""
import subprocess
import sys

import pytest

from rose_wire import CANCELLED, CODES, INTERNAL, INVALID_ARG, UNAVAILABLE, WireError, decode, encode
from testing import REPO

ERRORS = [WireError(INVALID_ARG, "TEXT[1] is empty or only whitespace", "TEXT"),
          WireError(INVALID_ARG, "parameter 'dimensions' is 999; the model has 384", "dimensions"),
          WireError(INVALID_ARG, "unknown request parameter(s) ['normalise']; known: [...]"),
          WireError(UNAVAILABLE, "encoder queue is full (2048 requests pending)"),
          WireError(CANCELLED, "cancelled by the client"),
          WireError(INTERNAL, "inference failed: RuntimeError: CUDA error: an illegal memory access\nsecond line"),
          WireError(INTERNAL, "inference failed: step said 'invalid input [TEXT]: x'")]  # a tag inside the message


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: f"{e.code}-{e.field}")
@pytest.mark.parametrize("prefix", ["", "in ensemble 'ensemble', ", "[StatusCode.INVALID_ARGUMENT] "])
def test_decode_reads_back_what_encode_wrote(error, prefix):
    assert decode(prefix + encode(error)) == error


def test_the_encoded_text_stays_readable():
    assert encode(ERRORS[0]) == "invalid input [TEXT]: TEXT[1] is empty or only whitespace"
    assert encode(ERRORS[3]) == "overloaded: encoder queue is full (2048 requests pending)"
    assert {encode(WireError(code, "x")).split(":")[0] for code in CODES} == {
        "invalid input", "overloaded", "cancelled", "internal error"}


@pytest.mark.parametrize("text", ["Stub process 'rose_encoder' is not healthy.", "connection refused",
                                  "no response within 300s", "an invalid input without a colon", ""])
def test_text_we_did_not_encode_has_no_code(text):
    assert decode(text) == WireError(None, text)


def test_tritons_queue_full_refusal_is_unavailable():
    text = "in ensemble 'ensemble', Exceeds maximum queue size"
    assert decode(text) == WireError(UNAVAILABLE, text)


def test_only_known_codes_and_name_shaped_fields_go_on_the_wire():
    with pytest.raises(ValueError, match="unknown error code"):
        WireError("NOT_FOUND", "x")
    with pytest.raises(ValueError, match="not a tensor or parameter name"):
        WireError(INVALID_ARG, "x", "TEXT]: y")
    with pytest.raises(ValueError, match="without a code"):
        encode(WireError(None, "x"))


def test_rose_wire_needs_only_the_standard_library():
    """The client and the gateway import it; it must not pull in numpy, tritonclient or the server."""
    code = ("import sys; before = set(sys.modules); import rose_wire; "
            "print(*sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in sys.stdlib_module_names))")
    found = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert set(found.stdout.split()) == {"rose_wire", "rose_wire.errors", "rose_wire.names"}, found.stdout
