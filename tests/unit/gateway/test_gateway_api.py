"""The gateway's HTTP layer and its use of the dispatcher, with in-process fake
replicas (real Triton and real clients: test_gateway_e2e.py). The fakes answer
from what they receive, so these tests check what the gateway sends too."""
import asyncio
import base64
import dataclasses

import numpy as np
import pytest

from engine_lib.config import TokenizerConfig
from engine_lib.errors import InputError
from engine_lib.options import INTERACTIVE_MAX_TEXTS, RequestOptions, RerankOptions
from engine_lib.tokenization.text import TextTokenizer
from rose_client.aio_stream import ReplicaError
from rose_wire import INVALID_ARG, UNAVAILABLE, WireError, encode
from testing.gateway_app import FAST, gateway_client

# For tests that count attempts: no unavailability window a stalled machine could run out
PATIENT = dataclasses.replace(FAST, max_unavailable_s=60)
MODEL = "all-MiniLM-L6-v2"


class FakeReplica:
    """Embeds a sequence as [sum of its ids, its length, 1, 0...] (D=8); scores a document by its length.
    `error`: every call fails with it."""

    def __init__(self, error=None):
        self.error = error
        self.calls = []

    def slot(self, url):
        replica = self

        class Slot:
            async def call(self, call):
                replica.calls.append(call)
                await asyncio.sleep(0)
                if replica.error:
                    raise ReplicaError(url, replica.error)
                if call.model == "rerank":
                    return np.array([len(d) for d in call.inputs["DOCUMENTS"]], dtype=np.float32)
                ids, lens = call.inputs["INPUT_IDS"], call.inputs["SEQ_LENS"]
                rows = np.zeros((len(lens), 8), dtype=np.float32)
                rows[:, 0] = [part.sum() for part in np.split(ids, np.cumsum(lens)[:-1])]
                rows[:, 1], rows[:, 2] = lens, 1
                dims = call.parameters.get("dimensions") if call.parameters else None
                return rows[:, :dims] if dims else rows

            async def is_ready(self):
                return True

            async def close(self):
                pass

        return Slot()



def run(scenario, replica=None, ready=True, reranker=False, retry=FAST, **config):
    """Run `scenario(client)` against the app, the backend's replicas replaced by `replica`."""
    replica = replica or FakeReplica()

    async def main():
        async with gateway_client(replica.slot, retry=retry, ready=ready, reranker=reranker, **config) as (client, _):
            return await scenario(client)

    return asyncio.run(main()), replica


def post(path, body, headers=None, **kwargs):
    async def scenario(client):
        return await client.post(path, json=body, headers=headers)
    return run(scenario, **kwargs)


@pytest.fixture(scope="module")
def text_tokenizer(model_dir):
    return TextTokenizer(model_dir, TokenizerConfig())


def test_rows_come_back_in_input_order_over_many_chunks(text_tokenizer):
    texts = [f"text number {i} " + "word " * (i % 7) for i in range(60)]
    response, replica = post("/v1/embeddings", {"model": MODEL, "input": texts}, max_chunk_tokens=40)
    assert response.status_code == 200, response.text
    body = response.json()
    tokens = text_tokenizer.encode(texts, RequestOptions())
    ids, lens = tokens.input_ids, tokens.seq_lens
    rows = np.array([d["embedding"] for d in body["data"]])
    assert [d["index"] for d in body["data"]] == list(range(60))
    np.testing.assert_array_equal(rows[:, 0], [p.sum() for p in np.split(ids, np.cumsum(lens)[:-1])])
    np.testing.assert_array_equal(rows[:, 1], lens)
    assert body["usage"] == {"prompt_tokens": int(lens.sum()), "total_tokens": int(lens.sum())}
    assert len(replica.calls) > 1 and all(int(c.inputs["SEQ_LENS"].sum()) <= 40 for c in replica.calls)
    sent = np.concatenate([c.inputs["INPUT_IDS"] for c in replica.calls])
    np.testing.assert_array_equal(sent, ids)  # the tokenizer model's ids, template and all


def test_base64_is_little_endian_float32_of_the_float_rows():
    texts = ["one", "two words"]
    floats, _ = post("/v1/embeddings", {"model": MODEL, "input": texts, "dimensions": 3})
    packed, _ = post("/v1/embeddings", {"model": MODEL, "input": texts, "dimensions": 3,
                                         "encoding_format": "base64"})
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in packed.json()["data"]]
    np.testing.assert_array_equal(decoded, [d["embedding"] for d in floats.json()["data"]])
    assert all(len(d) == 3 for d in decoded)


def test_token_id_inputs_go_through_unchanged_and_cut_when_truncating():
    response, replica = post("/v1/embeddings", {"model": MODEL, "input": [[5, 6, 7], list(range(1, 300))]})
    assert response.status_code == 200, response.text
    (call,) = replica.calls
    np.testing.assert_array_equal(call.inputs["SEQ_LENS"], [3, 256])
    np.testing.assert_array_equal(call.inputs["INPUT_IDS"], [5, 6, 7, *range(1, 257)])
    assert response.json()["usage"]["prompt_tokens"] == 259


@pytest.mark.parametrize("body, status, param, fragment", [
    ({"model": MODEL}, 400, "input", "'input' is required"),
    ({"model": MODEL, "input": []}, 400, "input", "empty list"),
    ({"model": MODEL, "input": ["ok", " "]}, 400, "input", "input[1] is empty"),
    ({"model": MODEL, "input": ["ok", 3]}, 400, "input", "mixes item types"),
    ({"model": MODEL, "input": [[1, 2], [3, "x"]]}, 400, "input", "input[1] must be a list of integer"),
    ({"model": MODEL, "input": [[1, 2], [99999999]]}, 400, "input", "input[1] holds token id 99999999"),
    ({"model": MODEL, "input": [[]]}, 400, "input", "input[0] is an empty list"),
    ({"model": MODEL, "input": "x", "encoding_format": "int8"}, 400, "encoding_format", "'float' or 'base64'"),
    ({"model": MODEL, "input": "x", "dimensions": -1}, 400, "dimensions", "non-negative integer"),
    # numbers at and past the 64-bit edges, floats and strings where an integer belongs (issue 17)
    ({"model": MODEL, "input": "x", "dimensions": 1 << 63}, 400, "dimensions", "must lie in [0, 9223372036854775807]"),
    ({"model": MODEL, "input": "x", "dimensions": (1 << 63) - 1}, 400, "dimensions", "the model has 384"),
    ({"model": MODEL, "input": "x", "dimensions": 385}, 400, "dimensions", "'dimensions' is 385; the model has 384"),
    ({"model": MODEL, "input": "x", "dimensions": 1 << 64}, 400, "dimensions", "must be an integer"),
    ({"model": MODEL, "input": "x", "dimensions": -(1 << 63) - 1}, 400, "dimensions", "must be an integer"),
    ({"model": MODEL, "input": "x", "dimensions": 1e30}, 400, "dimensions", "must be an integer"),
    ({"model": MODEL, "input": "x", "dimensions": "12"}, 400, "dimensions", "must be an integer, got '12'"),
    ({"model": MODEL, "input": [[1, 1 << 63]]}, 400, "input", "outside [0, 30522)"),
    ({"model": MODEL, "input": [[1, -(1 << 63)]]}, 400, "input", "outside [0, 30522)"),
    ({"model": MODEL, "input": [[1, 1 << 64]]}, 400, "input", "input[0] must be a list of integer"),
    ({"model": MODEL, "input": "x", "input_type": "passage"}, 400, "input_type", "must be one of"),
    ({"model": MODEL, "input": "x", "truncate": "maybe"}, 400, "truncate", "must be a boolean"),
    ({"model": MODEL, "input": "x", "temperature": 1}, 400, "temperature", "unknown field(s) ['temperature']"),
    ({"model": MODEL, "input": "word " * 400, "truncate": False}, 400, "input", "input[0] has"),
    ({"input": "x"}, 400, "model", "'model' is required"),
    ({"model": "text-embedding-3-small", "input": "x"}, 404, "model", "does not exist"),
    ({"model": MODEL, "input": ["x"] * 4097}, 413, "input", "at most 4096"),
])
def test_bad_embedding_requests_get_openai_errors(body, status, param, fragment):
    response, replica = post("/v1/embeddings", body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert fragment in error["message"] and error["param"] == param and error["type"]
    assert not replica.calls  # refused before any replica saw it


def _refused(options_type, parameters, **kwargs) -> bool:
    try:
        options_type.from_parameters(parameters, **kwargs)
    except InputError as exc:
        assert exc.field == next(iter(parameters))
        return True
    return False


@pytest.mark.parametrize("name, value", [
    ("dimensions", 0), ("dimensions", 3), ("dimensions", "3"), ("dimensions", -1), ("dimensions", 2.0),
    ("dimensions", True), ("dimensions", "three"), ("dimensions", None),
    ("truncate", True), ("truncate", "off"), ("truncate", 1), ("truncate", "maybe"), ("truncate", None),
    ("input_type", "query"), ("input_type", "document"), ("input_type", "passage"), ("input_type", ""),
    ("input_type", None),
])
def test_embedding_options_follow_the_models_rules(name, value):
    """The gateway accepts exactly the option values the models accept (engine_lib.options; an
    integer as a JSON number, not its digits), and names the option when it refuses one."""
    response, replica = post("/v1/embeddings", {"model": MODEL, "input": "x", name: value})
    refused = _refused(RequestOptions, {name: value}, json_body=True)
    assert response.status_code == (400 if refused else 200), response.text
    if refused:
        assert response.json()["error"]["param"] == name and not replica.calls
    else:
        (call,) = replica.calls
        options = RequestOptions.from_parameters({name: value})
        dimensions = {"dimensions": options.dimensions} if options.dimensions else {}  # 0 = all: nothing to send
        assert call.parameters == {"priority_class": "interactive", **dimensions}


@pytest.mark.parametrize("name, value", [
    ("raw_scores", True), ("raw_scores", "yes"), ("raw_scores", 2), ("truncate", "false"), ("truncate", []),
    ("instruction", "Judge"), ("instruction", 3), ("instruction", "x" * 5000), ("raw_scores", None),
])
def test_rerank_options_follow_the_models_rules(name, value):
    response, replica = post("/v1/rerank", {"query": "q", "documents": ["a"], name: value}, reranker=True)
    refused = _refused(RerankOptions, {name: value})
    assert response.status_code == (400 if refused else 200), response.text
    if refused:
        assert response.json()["error"]["param"] == name and not replica.calls
    else:
        expected = RerankOptions.from_parameters({name: value})
        assert replica.calls[0].parameters == ({name: getattr(expected, name)} if value is not None else {})


@pytest.mark.parametrize("num_inputs, sent", [(INTERACTIVE_MAX_TEXTS, "interactive"),
                                               (INTERACTIVE_MAX_TEXTS + 1, "batch")])
def test_the_class_of_an_embedding_request_is_decided_on_the_whole_request(num_inputs, sent):
    """Every chunk carries the class of the request it belongs to (the encoder sees only chunks)."""
    texts = [f"text {i}" for i in range(num_inputs)]
    response, replica = post("/v1/embeddings", {"model": MODEL, "input": texts}, max_chunk_texts=4)
    assert response.status_code == 200, response.text
    assert len(replica.calls) > 1 and all(c.parameters == {"priority_class": sent} for c in replica.calls)
    response, replica = post("/v1/embeddings", {"model": MODEL, "input": texts, "priority": "interactive"})
    assert all(c.parameters == {"priority_class": "interactive"} for c in replica.calls)


@pytest.mark.parametrize("path, body", [("/v1/embeddings", {"model": MODEL, "input": "x"}),
                                        ("/v1/rerank", {"query": "q", "documents": ["a"]})])
@pytest.mark.parametrize("value", ["urgent", "", 1, None, "batch"])
def test_priority_field_takes_the_two_classes_and_is_named_when_wrong(path, body, value):
    """The gateway's field is `priority`; the models' parameter is priority_class (Triton reserves priority)."""
    response, replica = post(path, {**body, "priority": value}, reranker=True)
    if value in ("urgent", "", 1):
        assert response.status_code == 400 and response.json()["error"]["param"] == "priority" and not replica.calls
        assert "'priority' must be one of ('interactive', 'batch')" in response.json()["error"]["message"]
    else:
        assert response.status_code == 200, response.text
        sent = replica.calls[0].parameters.get("priority_class")
        assert sent == (value or ("interactive" if path == "/v1/embeddings" else None))


def test_a_rerank_of_many_documents_is_batch_unless_it_says_otherwise():
    documents = [f"doc {i}" for i in range(INTERACTIVE_MAX_TEXTS + 1)]
    _, replica = post("/v1/rerank", {"query": "q", "documents": documents}, reranker=True, max_rerank_chunk_documents=8)
    assert len(replica.calls) > 1 and all(c.parameters == {"priority_class": "batch"} for c in replica.calls)
    body = {"query": "q", "documents": documents, "priority": "interactive"}
    _, replica = post("/v1/rerank", body, reranker=True)
    assert all(c.parameters == {"priority_class": "interactive"} for c in replica.calls)
    _, replica = post("/v1/rerank", {"query": "q", "documents": documents[:2]}, reranker=True)
    assert replica.calls[0].parameters == {}  # one chunk: the reranker's own rule (texts and tokens) decides


def test_rerank_limits_are_the_rerank_tokenizers(monkeypatch):
    """/v1/rerank applies rerank_tokenizer's config.pbtxt limits, ROSE_RERANK_* overrides included."""
    monkeypatch.setenv("ROSE_RERANK_MAX_TEXTS_PER_REQUEST", "3")
    monkeypatch.setenv("ROSE_RERANK_MAX_TEXT_BYTES", "8")
    cases = [(["a", "b", "c", "d"], 413, "documents has 4 texts; at most 3"), (["a", "123456789"], 413,
             "documents[1] is 9 bytes; at most 8"), (["a", " "], 400, "documents[1] is empty")]
    for documents, status, fragment in cases:
        response, replica = post("/v1/rerank", {"query": "q", "documents": documents}, reranker=True)
        assert response.status_code == status and fragment in response.json()["error"]["message"]
        assert response.json()["error"]["param"] == "documents" and not replica.calls
    response, _ = post("/v1/rerank", {"query": "a long query", "documents": ["a"]}, reranker=True)
    assert response.status_code == 413 and response.json()["error"]["param"] == "query"


def test_unparsable_bodies_and_unknown_routes_get_openai_errors():
    async def scenario(client):
        return [await client.post("/v1/embeddings", content=b"{not json"),
                await client.post("/v1/embeddings", content=b"[1, 2]"),
                await client.post("/v1/embeddings", content=b'{"model": "' + b"x" * 2000 + b'"}'),
                await client.get("/v1/embeddings"), await client.get("/v1/nothing")]

    responses, _ = run(scenario, max_body_bytes=1000)
    assert [r.status_code for r in responses] == [400, 400, 413, 405, 404]
    assert all(r.json()["error"]["message"] for r in responses)
    assert "not valid JSON" in responses[0].json()["error"]["message"]


def test_api_keys_are_required_when_configured():
    body = {"model": MODEL, "input": "x"}
    missing, _ = post("/v1/embeddings", body, api_keys=frozenset({"s3cret-key"}))
    wrong, _ = post("/v1/embeddings", body, api_keys=frozenset({"s3cret-key"}), headers={"Authorization": "Bearer no"})
    right, _ = post("/v1/embeddings", body, api_keys=frozenset({"s3cret-key"}),
                    headers={"Authorization": "Bearer s3cret-key"})
    assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert missing.json()["error"]["code"] == "invalid_api_key"


def test_encoder_overload_is_429_with_retry_after():
    response, replica = post("/v1/embeddings", {"model": MODEL, "input": "x"},
                             replica=FakeReplica(encode(WireError(UNAVAILABLE, "the queue holds 2048 requests"))),
                             retry=PATIENT)
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert "overloaded" in response.json()["error"]["message"] and len(replica.calls) == 2  # retried once


def test_a_request_over_the_pending_bound_is_413_before_any_replica_is_asked():
    """It could never pass: not a 429 (429 past what is left of the bound: test_gateway_limits.py)."""
    response, replica = post("/v1/embeddings", {"model": MODEL, "input": "many words " * 20}, max_pending_tokens=10)
    assert response.status_code == 413 and not replica.calls


def test_no_ready_replica_is_503_and_health_says_so():
    async def scenario(client):
        return await client.post("/v1/embeddings", json={"model": MODEL, "input": "x"}), await client.get("/health")

    (embed, health), _ = run(scenario, ready=False)
    assert embed.status_code == 503 and embed.headers["retry-after"] == "1"
    assert health.status_code == 503 and health.json()["replicas_ready"] == 0


def test_replica_failing_everywhere_is_503():
    response, _ = post("/v1/embeddings", {"model": MODEL, "input": "x"}, replica=FakeReplica("connection refused"))
    assert response.status_code == 503 and "connection refused" not in response.json()["error"]["message"]


def test_encoder_refusing_dimensions_is_400_naming_the_field():
    """(The gateway refuses a width above its folder's itself; an encoder may still refuse.)"""
    error = WireError(INVALID_ARG, "parameter 'dimensions' is 300; the model has 256", "dimensions")
    response, replica = post("/v1/embeddings", {"model": MODEL, "input": "x", "dimensions": 300},
                             replica=FakeReplica(f"in ensemble 'ensemble', {encode(error)}"))
    assert response.status_code == 400 and response.json()["error"]["param"] == "dimensions"
    assert response.json()["error"]["message"] == error.message
    assert len(replica.calls) == 1  # the same everywhere: not retried


@pytest.mark.parametrize("path, field, param", [
    ("/v1/embeddings", "INPUT_IDS", "input"), ("/v1/embeddings", "SEQ_LENS", "input"),
    ("/v1/embeddings", None, "input"), ("/v1/rerank", "DOCUMENTS", "documents"), ("/v1/rerank", "QUERY", "query"),
    ("/v1/rerank", "instruction", "instruction"), ("/v1/rerank", None, "documents")])
def test_a_refused_chunk_names_the_body_field_the_encoder_named(path, field, param):
    """`param` comes from the field the server sent, translated to the request body's names."""
    body = {"model": MODEL, "input": "x"} if path == "/v1/embeddings" else {"query": "q", "documents": ["d"]}
    response, _ = post(path, body, reranker=True, replica=FakeReplica(encode(WireError(INVALID_ARG, "refused", field))))
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert response.json()["error"]["message"] == "refused"


def test_rerank_sorts_by_score_with_indexes_over_document_chunks():
    documents = ["a" * n for n in (3, 9, 1, 7, 5, 2, 8)]
    body = {"query": "q?", "documents": documents, "top_n": 4, "raw_scores": True}
    response, replica = post("/v1/rerank", body, reranker=True, max_rerank_chunk_documents=3)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["index"] for r in results] == [1, 6, 3, 4]
    assert [r["relevance_score"] for r in results] == [len(documents[r["index"]]) for r in results]
    assert all(r["document"]["text"] == documents[r["index"]] for r in results)
    assert len(replica.calls) == 3 and all(list(c.inputs["QUERY"]) == [b"q?"] for c in replica.calls)
    assert all(c.parameters == {"raw_scores": True} for c in replica.calls)


def test_rerank_top_n_past_the_documents_returns_them_all():
    body = {"query": "q", "documents": ["bb", "a"], "top_n": (1 << 63) - 1, "return_documents": False}
    response, _ = post("/v1/rerank", body, reranker=True)
    assert response.status_code == 200 and [r["index"] for r in response.json()["results"]] == [0, 1]


def test_rerank_without_documents_in_results_and_without_a_reranker():
    body = {"query": "q", "documents": [{"text": "bb"}, "a"], "return_documents": False}
    served, _ = post("/v1/rerank", body, reranker=True)
    assert served.json()["results"] == [{"index": 0, "relevance_score": 2.0}, {"index": 1, "relevance_score": 1.0}]
    absent, replica = post("/v1/rerank", body, reranker=False)
    assert absent.status_code == 404 and "no reranker is served" in absent.json()["error"]["message"]
    wrong, _ = post("/v1/rerank", {**body, "model": "other"}, reranker=True)
    assert wrong.status_code == 404 and not replica.calls


@pytest.mark.parametrize("body, param", [
    ({"documents": ["a"]}, "query"), ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": ["a", ""]}, "documents"), ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": "q", "documents": [{"txt": "a"}]}, "documents"), ({"query": "q", "documents": ["a"], "x": 1}, "x"),
    ({"query": "q", "documents": ["a"], "top_n": 1 << 63}, "top_n"), ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": 1e30}, "top_n"), ({"query": "q", "documents": ["a"], "top_n": "2"}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": True}, "top_n"),
])
def test_bad_rerank_requests_are_400(body, param):
    response, replica = post("/v1/rerank", body, reranker=True)
    assert response.status_code == 400 and response.json()["error"]["param"] == param and not replica.calls


def test_models_lists_the_served_names():
    async def scenario(client):
        return (await client.get("/v1/models")).json()

    plain, _ = run(scenario)
    with_reranker, _ = run(scenario, reranker=True)
    assert [m["id"] for m in plain["data"]] == [MODEL]
    assert [m["id"] for m in with_reranker["data"]] == [MODEL, "rerank"]
