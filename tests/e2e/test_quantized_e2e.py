"""Compact output types and truncation_direction on a real tritonserver (the session `server`), on
every Triton path, against sentence-transformers on the same weights."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from engine_lib.runner.self_check import MIN_COSINE
from rose_wire import (
    EMBEDDINGS,
    EMBEDDINGS_BINARY,
    EMBEDDINGS_INT8,
    EMBEDDINGS_UBINARY,
    EMBEDDINGS_UINT8,
    INPUT_IDS,
    INT8_RANGES,
    ROSE_ENCODER,
    SEQ_LENS,
    TEXT,
    decode,
)
from testing.embed_clients import generate_outputs, stream_outputs, unary_outputs
from testing.quantized import TYPES, check_types, ranges_of, st_calibration_rows
from testing.texts import VARIED_TEXTS

TEXTS = VARIED_TEXTS[:16]
COMPACT = [EMBEDDINGS_INT8, EMBEDDINGS_UINT8, EMBEDDINGS_BINARY, EMBEDDINGS_UBINARY]
ALL_TYPES = "float,int8,uint8,binary,ubinary,int8_ranges"


def texts_array(texts) -> np.ndarray:
    return np.array([t.encode() for t in texts], dtype=object)


def pretokenized(model_dir, texts) -> dict:
    from engine_lib.config import TokenizerConfig
    from engine_lib.options import RequestOptions
    from engine_lib.tokenization.text import TextTokenizer

    tokens = TextTokenizer(model_dir, TokenizerConfig()).encode(texts, RequestOptions())
    ids, lens = tokens.input_ids, tokens.seq_lens
    return {INPUT_IDS: ids, SEQ_LENS: lens}


# Each Triton path asked for every output: requested outputs where the path passes them on (all six
# named reads as none named, as Triton fills in all of them then: the ranges come in a second call),
# else (ensemble: Triton 2.51 asks its steps for every output) the parameter embedding_types.
ROWS = [EMBEDDINGS, *COMPACT]


def both(call):
    return {**call(ROWS), **call([INT8_RANGES])}


PATHS = {
    "ensemble_grpc_stream": lambda s, md, p: stream_outputs(s.grpc_url, {TEXT: texts_array(TEXTS)}, [],
                                                            {"embedding_types": ALL_TYPES, **p}),
    "ensemble_http_generate": lambda s, md, p: generate_outputs(s.http_url, TEXTS, {"embedding_types": ALL_TYPES, **p}),
    "embed_grpc": lambda s, md, p: both(lambda o: unary_outputs(grpcclient, s.grpc_url, TEXTS, o, p or None)),
    "embed_http": lambda s, md, p: both(lambda o: unary_outputs(httpclient, s.http_url, TEXTS, o, p or None)),
    "rose_encoder_grpc_stream": lambda s, md, p: both(lambda o: stream_outputs(s.grpc_url, pretokenized(md, TEXTS), o,
                                                                               p or None, model=ROSE_ENCODER)),
}


@pytest.fixture(scope="module")
def st_rows(reference_model):
    return reference_model.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)


@pytest.fixture(scope="module")
def st_calibration(reference_model):
    return st_calibration_rows(reference_model)


def check_against_reference(outputs: dict, st_rows: np.ndarray, st_ranges: np.ndarray) -> None:
    assert set(outputs) == {EMBEDDINGS, *COMPACT, INT8_RANGES}, sorted(outputs)
    compact = {kind: outputs[name] for kind, name in zip(TYPES, COMPACT)}
    check_types(outputs[EMBEDDINGS], compact, outputs[INT8_RANGES], st_rows, st_ranges)


@pytest.mark.parametrize("path", PATHS)
def test_every_type_on_every_path_matches_sentence_transformers(server, model_dir, st_rows, st_calibration, path):
    outputs = PATHS[path](server, model_dir, {})
    check_against_reference(outputs, st_rows, ranges_of(st_calibration))
    assert list((server.cache_dir / "calibration").glob("*.npy")), "the calibration rows were not cached"


@pytest.mark.parametrize("path", ["ensemble_grpc_stream", "embed_http", "rose_encoder_grpc_stream"])
def test_a_matryoshka_cut_is_quantized_with_ranges_of_cut_rows(server, model_dir, st_rows, st_calibration, path):
    outputs = PATHS[path](server, model_dir, {"dimensions": 64})
    cut = st_rows[:, :64] / np.linalg.norm(st_rows[:, :64], axis=1, keepdims=True)
    check_against_reference(outputs, cut, ranges_of(st_calibration, 64))


def test_only_what_is_asked_for_comes_back(server, model_dir):
    data = texts_array(TEXTS[:3])
    assert set(stream_outputs(server.grpc_url, {TEXT: data})) == {EMBEDDINGS}  # none named: EMBEDDINGS
    assert set(generate_outputs(server.http_url, TEXTS[:3])) == {EMBEDDINGS}
    assert set(stream_outputs(server.grpc_url, {TEXT: data}, [], {"embedding_types": "ubinary"})) == \
        {EMBEDDINGS_UBINARY}
    # Triton 2.51's ensemble does not pass the outputs its client names on to its steps: without
    # the parameter the encoder computes EMBEDDINGS only, which the ensemble does not return
    assert stream_outputs(server.grpc_url, {TEXT: data}, [EMBEDDINGS_UBINARY]) == {}
    assert set(stream_outputs(server.grpc_url, {TEXT: data}, [EMBEDDINGS_UBINARY], {"embedding_types": "ubinary"})) \
        == {EMBEDDINGS_UBINARY}
    assert set(generate_outputs(server.http_url, TEXTS[:3], {"embedding_types": "binary,float"})) == \
        {EMBEDDINGS, EMBEDDINGS_BINARY}
    for protocol, url in ((grpcclient, server.grpc_url), (httpclient, server.http_url)):
        assert set(unary_outputs(protocol, url, TEXTS[:3])) == {EMBEDDINGS}
        assert set(unary_outputs(protocol, url, TEXTS[:3], [EMBEDDINGS_UBINARY])) == {EMBEDDINGS_UBINARY}
        assert set(unary_outputs(protocol, url, TEXTS[:3], [], {"embedding_types": "int8,ubinary"})) == \
            {EMBEDDINGS_INT8, EMBEDDINGS_UBINARY}
        # named outputs decide (Triton passes back only those), the parameter applies when none are named
        assert set(unary_outputs(protocol, url, TEXTS[:3], [EMBEDDINGS], {"embedding_types": "int8"})) == {EMBEDDINGS}
    ids = pretokenized(model_dir, TEXTS[:3])
    assert set(stream_outputs(server.grpc_url, ids, model=ROSE_ENCODER)) == {EMBEDDINGS}
    ranges = stream_outputs(server.grpc_url, ids, [INT8_RANGES], model=ROSE_ENCODER)
    assert set(ranges) == {INT8_RANGES} and ranges[INT8_RANGES].shape == (2, 384)


@pytest.mark.parametrize("parameters, field", [({"embedding_types": "int4"}, "embedding_types"),
                                               ({"truncation_direction": "middle"}, "truncation_direction")])
def test_bad_values_are_refused_naming_the_parameter(server, parameters, field):
    calls = [lambda: stream_outputs(server.grpc_url, {TEXT: texts_array(["x"])}, [], parameters),
             lambda: unary_outputs(grpcclient, server.grpc_url, ["x"], [], parameters),
             lambda: unary_outputs(httpclient, server.http_url, ["x"], [], parameters)]
    for call in calls:
        with pytest.raises(InferenceServerException) as refused:
            call()
        wire = decode(str(refused.value))
        assert (wire.code, wire.field) == ("INVALID_ARG", field), str(refused.value)


LONG = " ".join(f"word{i} sentence number {i} of a long document." for i in range(300))  # ~2,400 tokens


def test_truncation_from_the_left_keeps_the_end_on_every_path(server, reference_model):
    tokenizer = reference_model.tokenizer
    right = reference_model.encode([LONG], normalize_embeddings=True)[0]
    tokenizer.truncation_side = "left"
    try:
        left = reference_model.encode([LONG], normalize_embeddings=True)[0]
    finally:
        tokenizer.truncation_side = "right"
    assert float(left @ right) < 0.99  # the two ends differ
    params = {"truncation_direction": "left"}
    rows = {
        "ensemble_grpc_stream": stream_outputs(server.grpc_url, {TEXT: texts_array([LONG])}, [], params)[EMBEDDINGS],
        "ensemble_http_generate": generate_outputs(server.http_url, [LONG], params)[EMBEDDINGS],
        "embed_grpc": unary_outputs(grpcclient, server.grpc_url, [LONG], [], params)[EMBEDDINGS],
        "embed_http": unary_outputs(httpclient, server.http_url, [LONG], [], params)[EMBEDDINGS],
    }
    for path, row in rows.items():
        assert float(row[0] @ left) >= MIN_COSINE, path
    default = stream_outputs(server.grpc_url, {TEXT: texts_array([LONG])}, [], {"truncation_direction": "right"})
    assert float(default[EMBEDDINGS][0] @ right) >= MIN_COSINE

