"""chunking=mean on a real tritonserver (the session `server`) on every path, against a reference
that embeds the same windows with sentence-transformers' model and pools them by token count."""
from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from engine_lib.runner.self_check import MIN_COSINE
from rose_wire import EMBEDDINGS, TEXT
from testing.embed_clients import generate_outputs, stream_outputs, unary_outputs

LONG = " ".join(f"Paragraph {i}: the river keeps flowing past village number {i} at dawn." for i in range(120))
TEXTS = ["a short text", LONG, LONG[: len(LONG) // 3]]


@pytest.fixture(scope="module")
def reference(reference_model):
    """Each text's windows built from the tokenizer alone ([CLS] + consecutive 254-token slices of its
    own tokens + [SEP]), embedded one by one, averaged weighted by tokens, normalised; and the tokens."""
    tokenizer = reference_model.tokenizer
    rows, tokens = [], 0
    for text in TEXTS:
        body = tokenizer(text, add_special_tokens=False)["input_ids"]
        room = 256 - 2
        windows = [[tokenizer.cls_token_id, *body[at:at + room], tokenizer.sep_token_id]
                   for at in range(0, len(body), room)]
        pooled = []
        for window in windows:
            ids = torch.tensor([window])
            with torch.no_grad():
                out = reference_model({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                       "token_type_ids": torch.zeros_like(ids)})
            pooled.append(out["sentence_embedding"][0].numpy())
        weights = np.array([len(w) for w in windows], dtype=np.float64)
        row = (np.stack(pooled) * weights[:, None]).sum(axis=0) / weights.sum()
        rows.append(row / np.linalg.norm(row))
        tokens += int(weights.sum())
    assert len(windows) >= 1 and tokens > 2 * 256  # the long texts do need several windows
    return np.stack(rows), tokens


def test_chunked_vectors_match_the_reference_on_every_path(server, reference):
    expected, tokens = reference
    data = np.array([t.encode() for t in TEXTS], dtype=object)
    params = {"chunking": "mean"}
    rows = {
        "ensemble_grpc_stream": stream_outputs(server.grpc_url, {TEXT: data}, [], params)[EMBEDDINGS],
        "ensemble_http_generate": generate_outputs(server.http_url, TEXTS, params)[EMBEDDINGS],
        "embed_grpc": unary_outputs(grpcclient, server.grpc_url, TEXTS, [], params)[EMBEDDINGS],
        "embed_http": unary_outputs(httpclient, server.http_url, TEXTS, [], params)[EMBEDDINGS],
    }
    response = httpx.post(f"{server.gateway_url}/v1/embeddings", timeout=120,
                          json={"model": "all-MiniLM-L6-v2", "input": TEXTS, "chunking": "mean",
                                "encoding_format": "float"})
    assert response.status_code == 200, response.text
    rows["gateway"] = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
    assert response.json()["usage"]["prompt_tokens"] == tokens  # every window's tokens
    for path, got in rows.items():
        assert got.shape == expected.shape, path
        cosines = (got * expected).sum(axis=1)
        assert cosines.min() >= MIN_COSINE, (path, cosines)
    truncated = stream_outputs(server.grpc_url, {TEXT: data})[EMBEDDINGS]  # default: off, truncation as before
    assert float(truncated[1] @ expected[1]) < MIN_COSINE
    np.testing.assert_allclose(truncated[0], rows["ensemble_grpc_stream"][0], atol=1e-6)  # a short text: the same


def test_too_many_windows_are_refused_naming_the_input(server):
    from tritonclient.utils import InferenceServerException

    from rose_wire import decode

    huge = " ".join(f"w{i} sentence {i}." for i in range(4000))
    with pytest.raises(InferenceServerException) as refused:
        unary_outputs(grpcclient, server.grpc_url, ["x", huge], [], {"chunking": "mean"})
    wire = decode(str(refused.value))
    assert wire.code == "INVALID_ARG" and wire.field == "TEXT" and "TEXT[1] needs more than 32 windows" in wire.message
