"""Compact output types (engine_lib/service/quantize.py, outputs.py, calibration.py) against
sentence-transformers' quantize_embeddings, output selection, and the calibration's life."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from engine_lib.contract import RaggedTokens
from engine_lib.errors import InputError
from engine_lib.options import RequestOptions, parse_embedding_types
from engine_lib.service.calibration import Calibration, cache_key
from engine_lib.service.endpoint import Endpoint
from engine_lib.service.outputs import finish_rows, requested_outputs, select_outputs
from engine_lib.service.quantize import min_max, pack_signs, quantize_scalar
from rose_wire import (
    EMBEDDING_OUTPUTS,
    EMBEDDINGS,
    EMBEDDINGS_BINARY,
    EMBEDDINGS_INT8,
    EMBEDDINGS_UBINARY,
    EMBEDDINGS_UINT8,
    INT8_RANGES,
    SCORES,
)
from testing.fake_engine import FakeEngine, Replies, make_service


def unit_rows(n: int, d: int, seed: int) -> np.ndarray:
    rows = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.mark.parametrize("d", [8, 13, 384])
def test_binary_types_are_bit_exact_with_sentence_transformers(d):
    rows = unit_rows(50, d, d)
    rows[0, :3] = 0.0  # zero is not positive
    for signed, precision in ((True, "binary"), (False, "ubinary")):
        ours = pack_signs(rows, signed)
        theirs = quantize_embeddings(rows, precision)
        assert ours.dtype == theirs.dtype and ours.shape == (50, (d + 7) // 8)
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("d", [7, 384])
def test_scalar_types_equal_sentence_transformers_with_the_same_ranges(d):
    calibration = unit_rows(200, d, 1)
    ranges = min_max(calibration)
    rows = unit_rows(64, d, 2)  # outside the calibration: values beyond the ranges clip
    ranges[:, 0] = 0.25  # a dimension with no range: steps of 1
    for signed, precision, dtype in ((True, "int8", np.int8), (False, "uint8", np.uint8)):
        ours = quantize_scalar(rows, ranges, signed)
        theirs = quantize_embeddings(rows, precision, ranges=ranges)
        assert ours.dtype == theirs.dtype == dtype and ours.shape == rows.shape
        np.testing.assert_array_equal(ours, theirs)  # the same float32 arithmetic: not even one step apart
    assert quantize_scalar(rows, ranges, True).min() >= -128 and quantize_scalar(rows, ranges, False).max() <= 255


def test_quantize_scalar_refuses_ranges_of_another_width():
    with pytest.raises(ValueError, match="ranges have shape"):
        quantize_scalar(unit_rows(2, 4, 0), np.zeros((2, 5), dtype=np.float32), True)


@pytest.mark.parametrize("requested, named, expected", [
    ([], [], [EMBEDDINGS]),                                         # nothing asked
    (list(EMBEDDING_OUTPUTS), [], [EMBEDDINGS]),                    # Triton: none named = all; ensemble steps
    ([EMBEDDINGS_UBINARY], [], [EMBEDDINGS_UBINARY]),               # KServe requested outputs
    ([EMBEDDINGS_INT8, EMBEDDINGS], [], [EMBEDDINGS, EMBEDDINGS_INT8]),
    (list(EMBEDDING_OUTPUTS), [EMBEDDINGS_BINARY], [EMBEDDINGS_BINARY]),  # the ensemble with the parameter
    ([EMBEDDINGS], [EMBEDDINGS_UINT8], [EMBEDDINGS]),  # named outputs decide: Triton returns only those
])
def test_select_outputs(requested, named, expected):
    assert select_outputs(EMBEDDING_OUTPUTS, requested, named) == expected


def test_requested_outputs_of_a_front_parse_only_embedding_types():
    assert requested_outputs({"embedding_types": "ubinary,int8"}, list(EMBEDDING_OUTPUTS), EMBEDDING_OUTPUTS) == \
        [EMBEDDINGS_INT8, EMBEDDINGS_UBINARY]
    assert requested_outputs({"raw_scores": True}, [SCORES], [SCORES]) == [SCORES]  # the reranker's front
    with pytest.raises(InputError) as refused:
        requested_outputs({"embedding_types": "int4"}, [], EMBEDDING_OUTPUTS)
    assert refused.value.field == "embedding_types"


@pytest.mark.parametrize("value, expected", [
    (None, ()), ("", ()), ("int8", ("int8",)), ("ubinary, float,ubinary", ("ubinary", "float")),
    (["uint8", "binary"], ("uint8", "binary")),
])
def test_embedding_types_parameter(value, expected):
    assert parse_embedding_types(value) == expected
    assert RequestOptions.from_parameters({"embedding_types": value}).embedding_types == expected


@pytest.mark.parametrize("value", ["int4", 3, ["float", 1], "FLOAT"])
def test_bad_embedding_types_name_the_field(value):
    with pytest.raises(InputError) as refused:
        RequestOptions.from_parameters({"embedding_types": value})
    assert refused.value.field == "embedding_types"


# Calibration through an Endpoint over the fake engine (rows [first id, length, sum, 0]).
CALIBRATION_SEQS = [[i, i + 1, (i * 7) % 50 + 1][: 1 + i % 3] for i in range(1, 40)]


def calibration_sequences():
    return RaggedTokens.from_rows(CALIBRATION_SEQS)


def calibration_rows() -> np.ndarray:
    return np.array([[s[0], len(s), sum(s), 0] for s in CALIBRATION_SEQS], dtype=np.float32)


def make_endpoint(tmp_path, engine=None, sequences=calibration_sequences):
    calibration = Calibration(sequences, lambda seqs: str(tmp_path / "calibration" / (cache_key("f", seqs, "cpu") + ".npy")))
    return Endpoint(make_service(engine or FakeEngine(), max_queued_tokens=4096), calibration=calibration)


def ask(endpoint, replies, name, seqs, **options):
    endpoint.submit(RaggedTokens.from_rows(seqs, options=RequestOptions(**options)), replies.callback(name))


def test_int8_rows_use_ranges_calibrated_on_the_models_own_rows(tmp_path):
    endpoint = make_endpoint(tmp_path)
    replies = Replies()
    seqs = [[5, 6, 7], [30], [2, 2]]
    ask(endpoint, replies, "all", seqs, embedding_types=("float", "int8", "uint8", "binary", "ubinary", "int8_ranges"))
    ask(endpoint, replies, "cut", seqs, embedding_types=("int8", "int8_ranges"), dimensions=2)
    replies.wait_for(2)
    result, error = replies.results["all"]
    assert error is None and list(result) == list(EMBEDDING_OUTPUTS)
    floats = result[EMBEDDINGS]
    ranges = min_max(finish_rows(calibration_rows(), RequestOptions()))
    np.testing.assert_array_equal(result[INT8_RANGES], ranges)
    np.testing.assert_array_equal(result[EMBEDDINGS_INT8], quantize_embeddings(floats, "int8", ranges=ranges))
    np.testing.assert_array_equal(result[EMBEDDINGS_UINT8], quantize_embeddings(floats, "uint8", ranges=ranges))
    np.testing.assert_array_equal(result[EMBEDDINGS_BINARY], quantize_embeddings(floats, "binary"))
    np.testing.assert_array_equal(result[EMBEDDINGS_UBINARY], quantize_embeddings(floats, "ubinary"))
    cut, error = replies.results["cut"]
    cut_ranges = min_max(finish_rows(calibration_rows(), RequestOptions(dimensions=2)))  # ranges of the cut rows
    np.testing.assert_array_equal(cut[INT8_RANGES], cut_ranges)
    assert list(cut) == [EMBEDDINGS_INT8, INT8_RANGES] and cut[EMBEDDINGS_INT8].shape == (3, 2)
    endpoint.close()


def test_the_calibration_is_cached_and_read_back_instead_of_recomputed(tmp_path):
    first = make_endpoint(tmp_path)
    replies = Replies()
    ask(first, replies, "ranges", [[1]], embedding_types=("int8_ranges",))
    replies.wait_for(1)
    first.close()
    cached = list((tmp_path / "calibration").glob("*.npy"))
    assert len(cached) == 1
    np.testing.assert_array_equal(np.load(cached[0]), calibration_rows())

    engine = FakeEngine()
    second = make_endpoint(tmp_path, engine)
    ask(second, replies, "again", [[1]], embedding_types=("int8_ranges",))
    replies.wait_for(2)
    assert engine.batches == []  # neither the calibration nor the ranges-only request ran the engine
    np.testing.assert_array_equal(replies.results["again"][0][INT8_RANGES], replies.results["ranges"][0][INT8_RANGES])
    second.close()


def test_requests_waiting_for_the_calibration_all_get_their_rows_once(tmp_path):
    engine = FakeEngine()
    engine.gate.clear()  # steps finish only when the gate opens: requests pile up behind the calibration
    calls = []
    endpoint = make_endpoint(tmp_path, engine, sequences=lambda: calls.append(1) or calibration_sequences())
    replies = Replies()
    for i in range(6):
        ask(endpoint, replies, f"r{i}", [[i + 1, 2]], embedding_types=("uint8",))
    engine.gate.set()
    replies.wait_for(6)
    assert all(error is None and list(result) == [EMBEDDINGS_UINT8] for result, error in replies.results.values())
    assert len(calls) == 1
    endpoint.close()


def test_a_failed_calibration_fails_its_waiters_and_the_next_request_tries_again(tmp_path):
    calls = []
    lock = threading.Lock()

    def flaky():
        with lock:
            calls.append(1)
            if len(calls) == 1:
                raise OSError("texts unreadable")
        return calibration_sequences()

    endpoint = make_endpoint(tmp_path, sequences=flaky)
    replies = Replies()
    ask(endpoint, replies, "first", [[3]], embedding_types=("int8",))
    replies.wait_for(1)
    result, error = replies.results["first"]
    assert result is None and "calibrating the int8 ranges failed: texts unreadable" in str(error)
    ask(endpoint, replies, "second", [[3]], embedding_types=("int8",))
    ask(endpoint, replies, "plain", [[3]])  # float alone never waits for a calibration
    replies.wait_for(3)
    assert replies.results["second"][1] is None and list(replies.results["second"][0]) == [EMBEDDINGS_INT8]
    assert list(replies.results["plain"][0]) == [EMBEDDINGS]
    endpoint.close()


def test_an_endpoint_without_calibration_refuses_int8_naming_the_field():
    endpoint = Endpoint(make_service(FakeEngine()))
    with pytest.raises(InputError, match="no calibration") as refused:
        ask(endpoint, Replies(), "x", [[1]], embedding_types=("uint8",))
    assert refused.value.field == "embedding_types"
    replies = Replies()
    ask(endpoint, replies, "bits", [[1, 2]], embedding_types=("ubinary",))  # needs no ranges
    replies.wait_for(1)
    assert list(replies.results["bits"][0]) == [EMBEDDINGS_UBINARY]
    endpoint.close()
