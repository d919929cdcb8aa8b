"""The server as it starts by default (`dtype=auto`, ROSE_CPU_BF16 unset): bfloat16 on a CPU with native
bf16, float32 elsewhere; rows within the 0.999 rule on every call path, and /metrics names the dtype.
(The rest of the suite pins float32: tests/conftest.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from engine_lib.device.cpu_features import CPU_BF16_ENV, native_bf16
from engine_lib.runner.self_check import MIN_COSINE
from rose_triton.server import TritonServer
from testing.embed_clients import embed_generate, embed_stream, embed_unary_grpc, embed_unary_http
from testing.metrics import sample, scrape
from testing.texts import VARIED_TEXTS
from testing.waiting import wait_until

pytestmark = pytest.mark.own_server

WAYS = {
    "grpc_stream_ensemble": lambda server, texts: embed_stream(server.grpc_url, texts),
    "http_generate_ensemble": lambda server, texts: embed_generate(server.http_url, texts),
    "grpc_unary_embed": lambda server, texts: embed_unary_grpc(server.grpc_url, texts),
    "http_unary_embed": lambda server, texts: embed_unary_http(server.http_url, texts),
}


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("auto_dtype")
    server = TritonServer(folder / "server.log", env={CPU_BF16_ENV: "auto"})
    yield server
    server.kill()


def test_default_dtype_follows_the_cpu_and_metrics_name_it(default_server):
    expected = "bfloat16" if native_bf16() else "float32"

    def served():
        _, samples = scrape(default_server)
        return [k for k in samples if k.startswith("rose_self_check_cosine{")]

    keys = wait_until(served, what="the self-check gauge on /metrics")
    assert any('model="rose_encoder"' in k and f'dtype="{expected}"' in k and 'device="cpu"' in k for k in keys), keys
    cosine = sample(scrape(default_server)[1], "rose_self_check_cosine", model="rose_encoder", dtype=expected)
    assert MIN_COSINE <= cosine <= 1.0 and (cosine < 1.0) == (expected == "bfloat16")


@pytest.mark.parametrize("way", WAYS)
def test_default_dtype_rows_match_sentence_transformers(default_server, reference_model, way):
    rows = WAYS[way](default_server, VARIED_TEXTS)
    references = reference_model.encode(VARIED_TEXTS, normalize_embeddings=True)
    assert rows.shape == references.shape and rows.dtype == np.float32
    cos = (rows / np.linalg.norm(rows, axis=1, keepdims=True) * references).sum(axis=1)
    assert cos.min() >= MIN_COSINE, {VARIED_TEXTS[i][:30]: float(c) for i, c in enumerate(cos) if c < MIN_COSINE}
