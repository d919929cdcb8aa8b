import numpy as np

from embed_clients import embed_generate, embed_stream, embed_unary_grpc, embed_unary_http


def test_three_ways_agree(server, reference_model):
    texts = ["hello world", "Ünïcödé 你好 🎉"]
    ref = reference_model.encode(texts, normalize_embeddings=True)
    for way in (embed_stream, embed_unary_grpc):
        np.testing.assert_allclose((way(server.grpc_url, texts) * ref).sum(1), 1, atol=1e-3)
    for way in (embed_generate, embed_unary_http):
        np.testing.assert_allclose((way(server.http_url, texts) * ref).sum(1), 1, atol=1e-3)
