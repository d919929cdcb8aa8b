"""The batched unary front `embed_batched` on a real tritonserver: one text per batch row, rows equal
to the reference and to the ensemble's; requests Triton's dynamic batcher hands over together are
each answered their own rows, options and errors."""
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from engine_lib.runner.self_check import MIN_COSINE
from testing import REPO
from testing.embed_clients import embed_stream, stream_outputs
from testing.hold import wait_for_metric
from testing.texts import VARIED_TEXTS
from testing.waiting import wait_until
from rose_wire import EMBED_BATCHED, EMBEDDINGS, EMBEDDINGS_INT8, TEXT

LONG_TEXT = "embedding " * 600  # past the model's 256 tokens: refused when truncate is off


def infer(protocol, url, texts, parameters=None, outputs=(EMBEDDINGS,)):
    """client.infer on embed_batched, TEXT [B, 1] -> {output: rows}."""
    client = protocol.InferenceServerClient(url)
    try:
        text = protocol.InferInput(TEXT, [len(texts), 1], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object).reshape(-1, 1))
        wanted = [protocol.InferRequestedOutput(n) for n in outputs]
        result = client.infer(EMBED_BATCHED, [text], outputs=wanted, parameters=parameters)
        return {n: result.as_numpy(n) for n in outputs}
    finally:
        client.close()


@pytest.mark.parametrize("protocol", [grpcclient, httpclient], ids=["grpc", "http"])
def test_rows_match_the_reference_and_the_ensemble(server, reference_model, protocol):
    texts = VARIED_TEXTS[:24]
    url = server.grpc_url if protocol is grpcclient else server.http_url
    rows = infer(protocol, url, texts)[EMBEDDINGS]
    assert rows.shape == (len(texts), 384) and rows.dtype == np.float32
    reference = reference_model.encode(texts, normalize_embeddings=True)
    cos = (rows * reference).sum(axis=1) / np.linalg.norm(rows, axis=1)
    assert cos.min() >= MIN_COSINE
    np.testing.assert_allclose(rows, embed_stream(server.grpc_url, texts), atol=1e-6)


def test_requests_batched_together_are_each_answered_their_own(server):
    """Both instances held at the tokenizer's gate, then requests with different options, outputs and
    one bad text queue in Triton's dynamic batcher; once released they run in fewer executions than
    requests, and each gets the rows a request of its own gets from the ensemble, or its own error."""
    asks = [(VARIED_TEXTS[0:2], {}, (EMBEDDINGS,)), (VARIED_TEXTS[2:3], {"normalize": False}, (EMBEDDINGS,)),
            (VARIED_TEXTS[3:6], {}, (EMBEDDINGS,)), (VARIED_TEXTS[6:8], {"dimensions": 64}, (EMBEDDINGS,)),
            ([VARIED_TEXTS[8], LONG_TEXT], {"truncate": False}, (EMBEDDINGS,)),
            (VARIED_TEXTS[9:11], {}, (EMBEDDINGS_INT8,)), (VARIED_TEXTS[11:12], {"embedding_types": "sparse"},
                                                          (EMBEDDINGS,)),
            (VARIED_TEXTS[12:16], {}, (EMBEDDINGS,))]
    holders = [(VARIED_TEXTS[20:21], {}, (EMBEDDINGS,)), (VARIED_TEXTS[21:22], {}, (EMBEDDINGS,))]
    stats = grpcclient.InferenceServerClient(server.grpc_url)
    headers = {"triton-grpc-protocol-rose-admin-key": server.admin_key}

    def executions():
        (model,) = stats.get_inference_statistics(EMBED_BATCHED, headers=headers, as_json=True)["model_stats"]
        return int(model.get("execution_count", 0)), int(model.get("inference_count", 0))

    def call(ask):
        texts, parameters, outputs = ask
        try:
            return infer(grpcclient, server.grpc_url, texts, parameters or None, outputs)
        except InferenceServerException as exc:
            return exc

    before = executions()
    with ThreadPoolExecutor(len(asks) + len(holders)) as pool:
        with server.tokenizer_hold as hold:
            held = []
            for count, ask in enumerate(holders, 1):  # one request inside each instance, one at a time
                held.append(pool.submit(call, ask))
                hold.wait_entered(count)
            futures = [pool.submit(call, ask) for ask in asks]
            wait_for_metric(server.metrics_url, f'nv_inference_pending_request_count{{model="{EMBED_BATCHED}"',
                            len(asks), why="(the requests queued behind the held instances)")
        answers = [f.result(timeout=120) for f in futures]
        assert all(not isinstance(f.result(timeout=120), Exception) for f in held)
    rows = sum(len(texts) for texts, _, _ in asks + holders)
    # Triton counts an execution's rows once its execute returns, after the answers went out.
    after = wait_until(lambda: (counts := executions())[1] - before[1] >= rows and counts, 60,
                       lambda: f"Triton's statistics to count {rows} rows of {EMBED_BATCHED} (before {before}, "
                               f"now {executions()})")
    assert after[1] - before[1] == rows
    assert after[0] - before[0] < len(asks) + len(holders), "the queued requests were not handed over together"

    for (texts, parameters, outputs), answer in zip(asks, answers):
        if parameters.get("truncate") is False:
            assert isinstance(answer, InferenceServerException) and "256" in str(answer), answer
            assert answer.status() == "StatusCode.INVALID_ARGUMENT"
            continue
        if parameters.get("embedding_types") == "sparse":
            assert isinstance(answer, InferenceServerException) and "embedding_types" in str(answer)
            assert answer.status() == "StatusCode.INVALID_ARGUMENT"
            continue
        assert not isinstance(answer, Exception), answer
        # the ensemble's steps give every output it maps: the parameter names the type there
        types = {"embedding_types": "int8"} if EMBEDDINGS_INT8 in outputs else {}
        own = stream_outputs(server.grpc_url, {TEXT: np.array([t.encode() for t in texts], dtype=object)},
                             outputs, {**parameters, **types} or None)
        for name in outputs:
            assert answer[name].shape == own[name].shape and answer[name].dtype == own[name].dtype, name
            np.testing.assert_allclose(answer[name].astype(np.float32), own[name].astype(np.float32),
                                       atol=1e-5 if name == EMBEDDINGS else 1, err_msg=str(parameters))


def test_the_api_reference_example_runs(server, reference_model):
    """docs/api.md's embed_batched call, verbatim (port substituted): rows for a query of each text."""
    section = (REPO / "docs" / "api.md").read_text().split("\n## `embed_batched`", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    scope = {}
    exec(compile(code.replace("localhost:8001", server.grpc_url), "docs/api.md", "exec"), scope)
    reference = reference_model.encode(scope["texts"], normalize_embeddings=True)
    assert scope["rows"].shape == (2, 384) and (scope["rows"] * reference).sum(axis=1).min() >= MIN_COSINE
