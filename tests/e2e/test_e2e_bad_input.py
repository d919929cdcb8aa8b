"""Bad input over the real server: a clear error naming the problem, others unaffected."""
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from rose_wire import INVALID_ARG, decode
from testing.embed_clients import embed_stream, embed_unary_http

GOOD = ["a good request still works"]


def http_infer_raw(server, array, datatype="BYTES", params=None, model="embed"):
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        text = httpclient.InferInput("TEXT", list(array.shape), datatype)
        text.set_data_from_numpy(array)
        return client.infer(model, [text], parameters=params)
    finally:
        client.close()


BAD_CASES = {
    "empty list": (np.array([], dtype=object), "BYTES", None, "TEXT is empty"),
    "empty string": (np.array([b"fine", b""], dtype=object), "BYTES", None, "TEXT[1] is empty"),
    "not utf-8": (np.array([b"\xc3\x28 broken"], dtype=object), "BYTES", None, "TEXT[0] is not valid UTF-8"),
    "too long, truncate=false": (np.array([("word " * 400).encode()], dtype=object), "BYTES",
                                 {"truncate": False}, "more than the model's maximum of 256"),
    "wrong datatype": (np.array([1, 2], dtype=np.int32), "INT32", None, "TEXT"),
    "wrong shape": (np.array([[b"a", b"b"]], dtype=object), "BYTES", None, "TEXT"),
    "unknown option": (np.array([b"x"], dtype=object), "BYTES", {"normalise": True}, "unknown request parameter"),
    "too many dimensions": (np.array([b"x"], dtype=object), "BYTES", {"dimensions": 4096}, "dimensions"),
    "unknown priority": (np.array([b"x"], dtype=object), "BYTES", {"priority_class": "urgent"},
                         "'priority_class' must be one of"),
}
# The field each refusal names on the wire (rose_wire), where a tensor or parameter is at fault.
FIELDS = {"empty list": "TEXT", "empty string": "TEXT", "not utf-8": "TEXT", "too long, truncate=false": "TEXT",
          "unknown option": "normalise", "too many dimensions": "dimensions", "unknown priority": "priority_class"}


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_gets_named_error_then_good_request_succeeds(server, case):
    array, datatype, params, message = BAD_CASES[case]
    with pytest.raises(InferenceServerException) as caught:
        http_infer_raw(server, array, datatype, params)
    assert message in str(caught.value), str(caught.value)
    assert embed_unary_http(server.http_url, GOOD).shape == (1, 384)


def test_bad_input_on_stream_does_not_disturb_concurrent_good_requests(server):
    errors, good_rows = [], []

    def good_client():
        for _ in range(5):
            good_rows.append(embed_stream(server.grpc_url, GOOD * 3))

    def bad_client():
        for case in ("empty string", "not utf-8", "too long, truncate=false"):
            array, _, params, message = BAD_CASES[case]
            try:
                embed_stream(server.grpc_url, list(array), params)
            except InferenceServerException as exc:
                errors.append((message, str(exc)))

    threads = [threading.Thread(target=good_client, daemon=True) for _ in range(3)] + [threading.Thread(target=bad_client, daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(errors) == 3 and all(message in text for message, text in errors), errors
    assert len(good_rows) == 15 and all(r.shape == (3, 384) for r in good_rows)
    assert server.is_ready()


def test_pre_tokenized_encoder_rejects_inconsistent_lengths(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results = []
    client.start_stream(callback=lambda result, error: results.append(error))
    ids = grpcclient.InferInput("INPUT_IDS", [3], "INT64")
    ids.set_data_from_numpy(np.array([101, 7592, 102], dtype=np.int64))
    lens = grpcclient.InferInput("SEQ_LENS", [1], "INT64")
    lens.set_data_from_numpy(np.array([5], dtype=np.int64))
    client.async_stream_infer("rose_encoder", [ids, lens])
    client.stop_stream()  # waits for outstanding responses
    client.close()
    assert len(results) == 1 and "SEQ_LENS sums to 5 but INPUT_IDS has 3 tokens" in str(results[0])


def grpc_infer_raw(server, array, params=None, model="embed"):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        text = grpcclient.InferInput("TEXT", list(array.shape), "BYTES")
        text.set_data_from_numpy(array)
        return client.infer(model, [text], parameters=params)
    finally:
        client.close()


@pytest.mark.parametrize("case", ["empty string", "not utf-8", "unknown option", "unknown priority"])
def test_bad_input_status_code_survives_every_path(server, case):
    """The code, not only the message: HTTP 400 and gRPC INVALID_ARGUMENT through the unary
    front (BLS would hand it over as INTERNAL), the encoded code on the gRPC stream (stream
    errors carry a message only); every path's text decodes to the same code and field."""
    array, _, params, message = BAD_CASES[case]
    with pytest.raises(InferenceServerException) as http_error:
        http_infer_raw(server, array, params=params)
    assert http_error.value.status() == "400", (http_error.value.status(), str(http_error.value))
    with pytest.raises(InferenceServerException) as grpc_error:
        grpc_infer_raw(server, array, params)
    assert grpc_error.value.status() == "StatusCode.INVALID_ARGUMENT", grpc_error.value.status()
    with pytest.raises(InferenceServerException) as stream_error:
        embed_stream(server.grpc_url, list(array), params)
    for error in (http_error, grpc_error, stream_error):
        wire = decode(str(error.value))
        assert (wire.code, wire.field) == (INVALID_ARG, FIELDS[case]), str(error.value)
        assert message in wire.message, str(error.value)


@pytest.mark.parametrize("case", ["too long, truncate=false", "empty list", "too many dimensions"])
def test_unary_front_keeps_invalid_argument_from_its_tokenize_step_and_the_encoder(server, case):
    """The unary front tokenizes itself (its InputError) and hears the encoder's encoded errors
    through BLS (dimensions): both read INVALID_ARGUMENT / 400 naming the problem and its field."""
    array, _, params, message = BAD_CASES[case]
    with pytest.raises(InferenceServerException) as http_error:
        http_infer_raw(server, array, params=params)
    assert http_error.value.status() == "400" and message in str(http_error.value), str(http_error.value)
    with pytest.raises(InferenceServerException) as grpc_error:
        grpc_infer_raw(server, array, params)
    assert grpc_error.value.status() == "StatusCode.INVALID_ARGUMENT", grpc_error.value.status()
    assert message in str(grpc_error.value), str(grpc_error.value)
    assert decode(grpc_error.value.message()) == decode(str(http_error.value))
    assert decode(grpc_error.value.message()).field == FIELDS[case], str(grpc_error.value)


@pytest.mark.parametrize("case", ["empty string", "not utf-8", "too long, truncate=false", "unknown option",
                                  "too many dimensions", "unknown priority"])
def test_batched_front_refuses_bad_input_as_the_unary_front_does(server, case):
    """embed_batched (one text a batch row) names the same problem, code and field as `embed`."""
    array, _, params, message = BAD_CASES[case]
    with pytest.raises(InferenceServerException) as unary_error:
        grpc_infer_raw(server, array, params)
    with pytest.raises(InferenceServerException) as batched_error:
        grpc_infer_raw(server, array.reshape(-1, 1), params, model="embed_batched")
    assert batched_error.value.status() == "StatusCode.INVALID_ARGUMENT", str(batched_error.value)
    assert decode(batched_error.value.message()) == decode(unary_error.value.message())
    assert message in str(batched_error.value)
