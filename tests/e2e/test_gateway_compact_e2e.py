"""The launcher's gateway (session `server`) with the compact types: Cohere's /v2/embed through
raw HTTP and the official `cohere` SDK, the model object's int8 ranges, truncation from either
side, against sentence-transformers on the same weights and the Triton ensemble."""
from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from engine_lib.runner.self_check import MIN_COSINE
from rose_wire import EMBEDDINGS, INT8_RANGES, OUTPUT_OF_TYPE, TEXT
from testing.embed_clients import stream_outputs
from testing.quantized import TYPES, check_types, ranges_of, st_calibration_rows
from testing.texts import VARIED_TEXTS

MODEL = "all-MiniLM-L6-v2"
TEXTS = VARIED_TEXTS[:12]
LONG = " ".join(f"word{i} sentence number {i} of a long document." for i in range(300))


@pytest.fixture(scope="module")
def st_calibration(reference_model):
    return st_calibration_rows(reference_model)


def v2_embed(server, **body) -> httpx.Response:
    return httpx.post(f"{server.gateway_url}/v2/embed", json={"model": MODEL, **body}, timeout=120)


def model_ranges(server, dimensions: int = 0) -> np.ndarray:
    query = f"?dimensions={dimensions}" if dimensions else ""
    response = httpx.get(f"{server.gateway_url}/v1/models/{MODEL}{query}", timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == MODEL and body["dimensions"] == (dimensions or 384)
    return np.array(body["int8_ranges"], dtype=np.float32)


@pytest.mark.parametrize("dimensions", [0, 128])
def test_v2_embed_every_type_matches_sentence_transformers(server, reference_model, st_calibration, dimensions):
    response = v2_embed(server, texts=TEXTS, input_type="search_document",
                        embedding_types=["float", *TYPES, "base64"], **({"output_dimension": dimensions}
                                                                        if dimensions else {}))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["texts"] == TEXTS and body["response_type"] == "embeddings_by_type"
    got = body["embeddings"]
    floats = np.array(got["float"], dtype=np.float32)
    compact = {t: np.array(got[t], dtype=np.int8 if t in ("int8", "binary") else np.uint8) for t in TYPES}
    st_rows = reference_model.encode(TEXTS, normalize_embeddings=False)
    if dimensions:
        st_rows = st_rows[:, :dimensions]
    st_rows = st_rows / np.linalg.norm(st_rows, axis=1, keepdims=True)
    ranges = model_ranges(server, dimensions)  # what a client de-quantizes with
    check_types(floats, compact, ranges, st_rows, ranges_of(st_calibration, dimensions))
    decoded = np.stack([np.frombuffer(base64.b64decode(b), dtype="<f4") for b in got["base64"]])
    np.testing.assert_array_equal(decoded, floats)
    # the same encoder as the ensemble's: the same numbers
    ensemble = stream_outputs(server.grpc_url, {TEXT: np.array([t.encode() for t in TEXTS], dtype=object)}, [],
                              {"embedding_types": "float,int8,uint8,binary,ubinary,int8_ranges",
                               **({"dimensions": dimensions} if dimensions else {})})
    np.testing.assert_array_equal(ensemble[INT8_RANGES], ranges)
    np.testing.assert_allclose(ensemble[EMBEDDINGS], floats, atol=1e-6)
    for t in TYPES:
        np.testing.assert_array_equal(ensemble[OUTPUT_OF_TYPE[t]], compact[t], err_msg=t)
    tokens = sum(len(ids) for ids in reference_model.tokenizer(TEXTS, truncation=True, max_length=256)["input_ids"])
    assert body["meta"]["billed_units"]["input_tokens"] == tokens


def test_v2_embed_truncate_start_end_none(server, reference_model):
    tokenizer = reference_model.tokenizer
    end = reference_model.encode([LONG], normalize_embeddings=True)[0]
    tokenizer.truncation_side = "left"
    try:
        start = reference_model.encode([LONG], normalize_embeddings=True)[0]
    finally:
        tokenizer.truncation_side = "right"
    for truncate, reference in (("END", end), ("START", start)):
        response = v2_embed(server, texts=[LONG], input_type="search_document", truncate=truncate)
        assert response.status_code == 200, response.text
        row = np.array(response.json()["embeddings"]["float"][0])
        assert float(row @ reference) >= MIN_COSINE, truncate
    refused = v2_embed(server, texts=["short", LONG], input_type="search_document", truncate="NONE")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "texts"
    assert "texts[1]" in refused.json()["error"]["message"]


def test_v1_embeddings_truncation_direction_left(server, reference_model):
    tokenizer = reference_model.tokenizer
    tokenizer.truncation_side = "left"
    try:
        left = reference_model.encode([LONG], normalize_embeddings=True)[0]
    finally:
        tokenizer.truncation_side = "right"
    response = httpx.post(f"{server.gateway_url}/v1/embeddings", timeout=120,
                          json={"model": MODEL, "input": [LONG], "truncation_direction": "left"})
    assert response.status_code == 200, response.text
    assert float(np.array(response.json()["data"][0]["embedding"]) @ left) >= MIN_COSINE


def test_the_cohere_sdk(server, reference_model, st_calibration):
    cohere = pytest.importorskip("cohere", reason="the cohere SDK (requirements-test.lock) is not installed")
    client = cohere.ClientV2(base_url=server.gateway_url, api_key="unused")
    response = client.embed(model=MODEL, texts=TEXTS, input_type="search_query",
                            embedding_types=["float", "int8", "uint8", "binary", "ubinary"])
    got = response.embeddings
    floats = np.array(got.float_, dtype=np.float32)
    compact = {t: np.array(getattr(got, t), dtype=np.int8 if t in ("int8", "binary") else np.uint8) for t in TYPES}
    st_rows = reference_model.encode(TEXTS, normalize_embeddings=True)
    check_types(floats, compact, model_ranges(server), st_rows, ranges_of(st_calibration))
    assert response.texts == TEXTS and response.meta.billed_units.input_tokens > len(TEXTS)
    short = client.embed(model=MODEL, texts=[LONG], input_type="search_document", embedding_types=["float"],
                         output_dimension=64, truncate="START")
    assert len(short.embeddings.float_[0]) == 64
    with pytest.raises(cohere.BadRequestError) as refused:
        client.embed(model=MODEL, texts=[LONG], input_type="search_document", truncate="NONE")
    assert refused.value.status_code == 400
