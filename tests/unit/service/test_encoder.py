"""Endpoint (engine_lib/service/endpoint.py): request validation before queuing, per-request post-processing."""
from __future__ import annotations

import numpy as np
import pytest

from engine_lib.contract import RaggedTokens
from engine_lib.errors import InputError
from engine_lib.options import RequestOptions
from engine_lib.service.endpoint import Endpoint
from engine_lib.service.outputs import EmbeddingOutput, finish_rows
from rose_wire import EMBEDDINGS
from testing.fake_engine import FakeEngine, Replies, expected_row, make_service

RAW = RequestOptions(normalize=False)


def make_encoder(**kwargs) -> Endpoint:
    return Endpoint(make_service(FakeEngine(), **kwargs))


def encode(encoder, replies, name, seqs, options=RAW):
    return encoder.submit(RaggedTokens.from_rows(seqs, options=options), replies.callback(name))


@pytest.mark.parametrize("ids, lens, message, field", [
    ([1, 2], [3], "SEQ_LENS sums to 3 but INPUT_IDS has 2", "SEQ_LENS"),
    ([1, 2], [2, 0], r"SEQ_LENS\[1\] is 0", "SEQ_LENS"),
    ([1, 1000], [2], r"outside \[0, 1000\)", "INPUT_IDS"),
    ([-1], [1], "outside", "INPUT_IDS"),
    ([1] * 65, [65], "at most 64", "SEQ_LENS"),
    ([], [], "SEQ_LENS is empty", "SEQ_LENS"),
])
def test_invalid_requests_are_refused_before_queuing(ids, lens, message, field):
    encoder = make_encoder()
    with pytest.raises(InputError, match=message) as refused:
        encoder.submit(RaggedTokens(np.array(ids, dtype=np.int64), np.array(lens, dtype=np.int64), options=RAW),
                       lambda *a: None)
    assert refused.value.field == field
    assert encoder.service.queue_depth() == {"rose_queue_requests": 0, "rose_queue_tokens": 0}
    assert encoder.service.metrics.total("rose_requests_total", outcome="invalid") == 1
    encoder.close()


def test_two_dimensional_inputs_are_refused():
    encoder = make_encoder()
    with pytest.raises(InputError, match="must be 1-D"):
        encoder.submit(RaggedTokens(np.ones((2, 2), dtype=np.int64), np.array([4]), options=RAW), lambda *a: None)
    encoder.close()


def test_request_larger_than_the_queue_is_invalid_not_overload():
    encoder = make_encoder(max_queued_tokens=50)
    with pytest.raises(InputError, match="split it"):
        encode(encoder, Replies(), "big", [[1] * 30, [2] * 30])
    encoder.close()


def test_options_apply_per_request():
    encoder = make_encoder()
    replies = Replies()
    encode(encoder, replies, "cut", [[3, 4]], RequestOptions(normalize=False, dimensions=2))
    encode(encoder, replies, "unit", [[3, 4]], RequestOptions(normalize=True))
    encode(encoder, replies, "both", [[3, 4]], RequestOptions(normalize=True, dimensions=2))
    replies.wait_for(3)
    np.testing.assert_array_equal(replies.results["cut"][0][EMBEDDINGS], [[3, 2]])
    raw = np.array([expected_row([3, 4])], dtype=np.float32)
    np.testing.assert_allclose(replies.results["unit"][0][EMBEDDINGS], raw / np.linalg.norm(raw), rtol=1e-6)
    np.testing.assert_allclose(replies.results["both"][0][EMBEDDINGS], [[3 / np.hypot(3, 2), 2 / np.hypot(3, 2)]],
                               rtol=1e-6)
    with pytest.raises(InputError, match="'dimensions' is 5; the model has 4") as refused:
        encode(encoder, replies, "wide", [[1]], RequestOptions(dimensions=5))
    assert refused.value.field == "dimensions"
    encoder.close()


def test_errors_pass_through_without_rows():
    encoder = Endpoint(make_service(FakeEngine(fail_token=999)))
    replies = Replies()
    encode(encoder, replies, "bad", [[999]])
    replies.wait_for(1)
    rows, error = replies.results["bad"]
    assert rows is None and "inference failed" in str(error)
    encoder.close()


def test_post_processing_failure_is_answered_as_an_error():
    class BrokenOutput(EmbeddingOutput):
        def finish(self, rows, options):
            raise ValueError("no rows today")

    encoder = Endpoint(make_service(FakeEngine()), output=BrokenOutput(FakeEngine.output_dim))
    replies = Replies()
    encode(encoder, replies, "broken", [[1, 2]])
    replies.wait_for(1)
    rows, error = replies.results["broken"]
    assert rows is None and "post-processing the rows failed: ValueError('no rows today')" in str(error)
    encoder.close()


def test_finish_rows_normalises_zero_rows_without_nan():
    out = finish_rows(np.zeros((2, 3), dtype=np.float64), RequestOptions())
    assert out.dtype == np.float32 and out.flags.c_contiguous and not np.isnan(out).any()
