"""The gateway's compact types: POST /v2/embed (Cohere's API), GET /v1/models/{model} with the
int8 ranges, truncation_direction on /v1/embeddings, over in-process fake replicas that answer
from what they receive (real Triton and the real `cohere` SDK: tests/e2e/test_gateway_cohere_e2e.py)."""
import asyncio
import base64

import numpy as np
import pytest

from engine_lib.config import TokenizerConfig
from engine_lib.options import RequestOptions
from engine_lib.service.outputs import finish_rows, pool_windows
from engine_lib.service.quantize import pack_signs, quantize_scalar
from engine_lib.tokenization.text import TextTokenizer
from rose_client.aio_stream import ReplicaError
from rose_wire import INT8_RANGES, INVALID_ARG, OUTPUT_OF_TYPE, WireError, encode
from testing.gateway_app import gateway_client

MODEL = "all-MiniLM-L6-v2"
WIDTH = 8
TYPE_OF = {name: kind for kind, name in OUTPUT_OF_TYPE.items()}


def fake_ranges(dimensions: int) -> np.ndarray:
    d = dimensions or WIDTH
    return np.vstack((-np.linspace(0.1, 0.9, d), np.linspace(0.2, 1.0, d))).astype(np.float32)


class FakeEncoder:
    """rose_encoder's outputs from what it receives: a sequence's raw row is [sum of ids, length,
    1, 0, ...] (D=8), then the real post-processing with fake ranges."""

    def __init__(self, error=None):
        self.calls, self.error = [], error

    def slot(self, url):
        encoder = self

        class Slot:
            async def call(self, call):
                encoder.calls.append(call)
                await asyncio.sleep(0)
                if encoder.error:
                    raise ReplicaError(url, encoder.error)
                options = RequestOptions.from_parameters(call.parameters)
                ranges = fake_ranges(options.dimensions)
                if call.output == INT8_RANGES and not call.outputs:
                    return ranges
                ids, lens = call.inputs["INPUT_IDS"], call.inputs["SEQ_LENS"]
                raw = np.zeros((len(lens), WIDTH), dtype=np.float32)
                raw[:, 0] = [part.sum() for part in np.split(ids, np.cumsum(lens)[:-1])]
                raw[:, 1], raw[:, 2] = lens, 1
                if "TEXT_WINDOWS" in call.inputs:
                    raw = pool_windows(raw, lens.tolist(), call.inputs["TEXT_WINDOWS"])
                floats = finish_rows(raw, options)
                made = {"float": floats, "int8": quantize_scalar(floats, ranges, True),
                        "uint8": quantize_scalar(floats, ranges, False), "binary": pack_signs(floats, True),
                        "ubinary": pack_signs(floats, False)}
                if not call.outputs:
                    return made[TYPE_OF[call.output]]
                return {name: made[TYPE_OF[name]] for name in call.outputs}

            async def is_ready(self):
                return True

            async def close(self):
                pass

        return Slot()


def run(scenario, encoder=None, **config):
    encoder = encoder or FakeEncoder()

    async def main():
        async with gateway_client(encoder.slot, **config) as (client, app):
            app.state.gateway.tokenizer.output_dim = WIDTH  # the fake's width
            return await scenario(client)

    return asyncio.run(main()), encoder


def post(path, body, **kwargs):
    async def scenario(client):
        return await client.post(path, json=body)
    return run(scenario, **kwargs)


def get(path, **kwargs):
    async def scenario(client):
        return await client.get(path)
    return run(scenario, **kwargs)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return TextTokenizer(model_dir, TokenizerConfig())


def test_v2_embed_returns_every_asked_type_keyed_by_type_in_input_order(tokenizer):
    texts = [f"text {i} " + "word " * i for i in range(30)]
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    response, encoder = post("/v2/embed", {"model": MODEL, "texts": texts, "input_type": "search_query",
                                           "embedding_types": types, "output_dimension": 6}, max_chunk_tokens=60)
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"id", "embeddings", "texts", "meta", "response_type"} and body["texts"] == texts
    assert list(body["embeddings"]) == types
    tokens = tokenizer.encode(texts, RequestOptions(input_type="query"))
    ids, lens = tokens.input_ids, tokens.seq_lens
    assert body["meta"]["billed_units"] == {"input_tokens": int(lens.sum())}
    raw = np.zeros((30, WIDTH), dtype=np.float32)
    raw[:, 0] = [p.sum() for p in np.split(ids, np.cumsum(lens)[:-1])]
    raw[:, 1], raw[:, 2] = lens, 1
    floats = finish_rows(raw, RequestOptions(dimensions=6))
    got = body["embeddings"]
    np.testing.assert_allclose(got["float"], floats, rtol=1e-6)
    np.testing.assert_array_equal(got["int8"], quantize_scalar(floats, fake_ranges(6), True))
    np.testing.assert_array_equal(got["uint8"], quantize_scalar(floats, fake_ranges(6), False))
    np.testing.assert_array_equal(got["binary"], pack_signs(floats, True))
    np.testing.assert_array_equal(got["ubinary"], pack_signs(floats, False))
    decoded = [np.frombuffer(base64.b64decode(b), dtype="<f4") for b in got["base64"]]
    np.testing.assert_array_equal(decoded, np.array(got["float"], dtype=np.float32))
    assert len(encoder.calls) > 1
    for call in encoder.calls:  # one encoder call per chunk computes every type; base64 is float's bytes
        assert call.outputs == tuple(OUTPUT_OF_TYPE[t] for t in types[:5])
        assert call.parameters == {"embedding_types": "float,int8,uint8,binary,ubinary", "dimensions": 6}
    np.testing.assert_array_equal(np.concatenate([c.inputs["INPUT_IDS"] for c in encoder.calls]), ids)


@pytest.mark.parametrize("truncate, direction", [("END", "right"), ("START", "left"), (None, "right")])
def test_v2_embed_truncate_cuts_the_named_end(tokenizer, truncate, direction):
    text = "begin " + "middle " * 400 + "finish"
    body = {"model": MODEL, "texts": [text], "input_type": "search_document"}
    response, encoder = post("/v2/embed", {**body, **({"truncate": truncate} if truncate else {})})
    assert response.status_code == 200, response.text
    tokens = tokenizer.encode([text], RequestOptions(truncation_direction=direction))
    expected = tokens.input_ids
    np.testing.assert_array_equal(encoder.calls[0].inputs["INPUT_IDS"], expected)
    assert response.json()["meta"]["billed_units"]["input_tokens"] == len(expected) == tokenizer.max_length


@pytest.mark.parametrize("body, status, param", [
    ({"texts": ["x"], "truncate": "NONE", "input_type": "search_query", "repeat": 400}, 400, "texts"),
    ({"texts": ["x"], "embedding_types": ["float", "int4"]}, 400, "embedding_types"),
    ({"texts": ["x"], "embedding_types": "float"}, 400, "embedding_types"),
    ({"texts": ["x"], "input_type": "image"}, 400, "input_type"),
    ({"texts": ["x"], "truncate": "MIDDLE"}, 400, "truncate"),
    ({"texts": ["x"], "output_dimension": 0}, 400, "output_dimension"),
    ({"texts": ["x"], "output_dimension": 9}, 400, "output_dimension"),
    ({"texts": ["x"], "output_dimension": "4"}, 400, "output_dimension"),
    ({"texts": ["x"], "images": ["data:image/png;base64,AAAA"]}, 400, "images"),
    ({"texts": ["x"], "max_tokens": 10}, 400, "max_tokens"),
    ({"texts": ["x"], "dimensions": 4}, 400, "dimensions"),
    ({"texts": "x"}, 400, "texts"),
    ({"texts": [""]}, 400, "texts"),
    ({"texts": []}, 400, "texts"),
    ({"texts": ["x"] * 5000}, 413, "texts"),
    ({"texts": ["x"], "model": "other"}, 404, "model"),
])
def test_v2_embed_refusals_name_the_field(body, status, param):
    body = {"model": MODEL, **body}
    if body.pop("repeat", None):
        body["texts"] = ["word " * 400]
    response, encoder = post("/v2/embed", body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param
    assert encoder.calls == []


def test_v2_embed_passes_an_encoder_refusal_on_as_400():
    error = encode(WireError(INVALID_ARG, "no calibration", "embedding_types"))
    response, _ = post("/v2/embed", {"model": MODEL, "texts": ["x"], "embedding_types": ["int8"]},
                       encoder=FakeEncoder(error))
    assert response.status_code == 400 and response.json()["error"]["param"] == "embedding_types"


@pytest.mark.parametrize("query, dimensions", [("", WIDTH), ("?dimensions=5", 5), ("?dimensions=0", WIDTH)])
def test_the_model_object_carries_the_int8_ranges(query, dimensions):
    response, encoder = get(f"/v1/models/{MODEL}{query}")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == MODEL and body["object"] == "model" and body["dimensions"] == dimensions
    np.testing.assert_array_equal(body["int8_ranges"], fake_ranges(dimensions))
    (call,) = encoder.calls
    assert call.output == INT8_RANGES and call.outputs == () and call.parameters["embedding_types"] == "int8_ranges"


@pytest.mark.parametrize("path, status, param", [(f"/v1/models/{MODEL}?dimensions=9", 400, "dimensions"),
                                                 (f"/v1/models/{MODEL}?dimensions=x", 400, "dimensions"),
                                                 (f"/v1/models/{MODEL}?width=3", 400, "width"),
                                                 ("/v1/models/other", 404, "model")])
def test_the_model_object_refusals(path, status, param):
    response, encoder = get(path)
    assert response.status_code == status and response.json()["error"]["param"] == param
    assert encoder.calls == []


def test_v1_embeddings_truncation_direction_for_texts_and_token_ids(tokenizer):
    text = "begin " + "middle " * 400 + "finish"
    response, encoder = post("/v1/embeddings", {"model": MODEL, "input": [text], "truncation_direction": "left"})
    assert response.status_code == 200, response.text
    tokens = tokenizer.encode([text], RequestOptions(truncation_direction="left"))
    expected = tokens.input_ids
    np.testing.assert_array_equal(encoder.calls[0].inputs["INPUT_IDS"], expected)
    ids = list(range(1, 400))
    response, encoder = post("/v1/embeddings", {"model": MODEL, "input": [ids], "truncation_direction": "left"})
    assert response.status_code == 200
    np.testing.assert_array_equal(encoder.calls[0].inputs["INPUT_IDS"], ids[-tokenizer.max_length:])
    response, _ = post("/v1/embeddings", {"model": MODEL, "input": ["x"], "truncation_direction": "up"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "truncation_direction"


def test_v1_embeddings_chunking_keeps_each_texts_windows_in_one_chunk_and_counts_them_all(tokenizer):
    long = " ".join(f"w{i} sentence {i}." for i in range(300))
    texts = ["short", long, "another short one", long + " tail"]
    response, encoder = post("/v1/embeddings", {"model": MODEL, "input": texts, "chunking": "mean",
                                                "encoding_format": "float"}, max_chunk_tokens=600)
    assert response.status_code == 200, response.text
    tokens = tokenizer.encode_windows(texts, RequestOptions(chunking="mean"))
    ids, lens, windows = tokens.input_ids, tokens.seq_lens, tokens.windows
    assert windows.tolist()[0] == 1 and windows[1] > 1
    body = response.json()
    assert body["usage"]["prompt_tokens"] == int(lens.sum())
    raw = np.zeros((len(lens), WIDTH), dtype=np.float32)
    raw[:, 0] = [p.sum() for p in np.split(ids, np.cumsum(lens)[:-1])]
    raw[:, 1], raw[:, 2] = lens, 1
    expected = finish_rows(pool_windows(raw, lens.tolist(), windows), RequestOptions())
    np.testing.assert_allclose([d["embedding"] for d in body["data"]], expected, rtol=1e-6)
    sent = [c.inputs["TEXT_WINDOWS"].tolist() for c in encoder.calls]
    assert sum(sent, []) == windows.tolist() and len(encoder.calls) > 1
    for call in encoder.calls:
        assert int(call.inputs["TEXT_WINDOWS"].sum()) == len(call.inputs["SEQ_LENS"])
    np.testing.assert_array_equal(np.concatenate([c.inputs["INPUT_IDS"] for c in encoder.calls]), ids)


def test_v1_embeddings_chunking_past_the_window_cap_is_413(tokenizer):
    huge = " ".join(f"w{i} sentence {i}." for i in range(4000))  # more than 32 windows of 256 tokens
    response, encoder = post("/v1/embeddings", {"model": MODEL, "input": ["x", huge], "chunking": "mean"})
    assert response.status_code == 413 and response.json()["error"]["param"] == "input"
    assert "input[1] needs more than 32 windows" in response.json()["error"]["message"] and encoder.calls == []
    response, _ = post("/v1/embeddings", {"model": MODEL, "input": ["x"], "chunking": "max"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "chunking"
