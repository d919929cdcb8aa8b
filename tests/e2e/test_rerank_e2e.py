"""Rerankers served by a real tritonserver beside embedders.

One server per family: a random-weight BERT cross-encoder as the default reranker
(scripts/serve.sh --rerank-model-dir: models `rerank`, `score`, `rerank_encoder`; this
module's own server), and a random-weight Qwen3-style yes/no judge served by name
(--rerank-model qwen3-reranker=DIR: models `qwen3-reranker`, `qwen3-reranker_score`,
`qwen3-reranker_encoder`) in the session's multi-model launch (`multi_server`): every
path (gRPC streaming and HTTP generate on the ensemble, the unary front over HTTP and
gRPC, the gateway by `model`) against transformers on the same folder; bad inputs;
concurrent mixed embed + rerank requests.
"""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from rose_triton.server import REPO, TritonServer
from rose_wire import DEFAULT_RERANKER, INVALID_ARG, decode
from testing.embed_clients import embed_stream
from testing.tiny_rerankers import reference_scores, save_reranker

QUERY = "what is the capital of france"
DOCS = ["paris is the capital and largest city of france", "berlin is the capital of germany",
        "the quick brown fox", "yes", "gravity is a force that attracts two bodies " * 2]


@pytest.fixture(scope="module", params=[pytest.param("bert", marks=pytest.mark.own_server), "qwen3"])
def served(request, tmp_path_factory):
    if request.param == "qwen3":
        server = request.getfixturevalue("multi_server")
        yield "qwen3", server.reranker_folder, server
        return
    folder = tmp_path_factory.mktemp(f"reranker-{request.param}")
    save_reranker(request.param, folder)
    server = TritonServer(folder / "server.log", serve_args=["--rerank-model-dir", str(folder)], gateway=True,
                          env={"ROSE_WATCHDOG_INTERVAL": "1"})  # its last test waits for the watchdog's restart
    server.rerank_models = DEFAULT_RERANKER
    yield request.param, folder, server
    server.kill()


def models(server):
    """The reranker's Triton models on `server`: rerank, score, ... or the named model's."""
    return server.rerank_models


def _array(texts):
    return np.array([t if isinstance(t, bytes) else t.encode() for t in texts], dtype=object)


def _inputs(protocol, query, docs, query_shape=None):
    q = protocol.InferInput("QUERY", query_shape or [1], "BYTES")
    q.set_data_from_numpy(_array(query).reshape(query_shape or [1]))
    d = protocol.InferInput("DOCUMENTS", [len(docs)], "BYTES")
    d.set_data_from_numpy(_array(docs))
    return [q, d]


def rerank_stream(server, query, docs, params=None, query_shape=None):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    replies: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        client.async_stream_infer(models(server).ensemble, _inputs(grpcclient, query, docs, query_shape),
                                  parameters=params)
        result, error = replies.get(timeout=120)
    finally:
        client.stop_stream()
        client.close()
    if error is not None:
        raise error
    return result.as_numpy("SCORES")


def rerank_generate(server, query, docs, params=None):
    body = {"QUERY": query, "DOCUMENTS": docs, **({"parameters": params} if params else {})}
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/{models(server).ensemble}/generate",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return np.asarray(json.load(response)["SCORES"], dtype=np.float32)


def score_unary(server, query, docs, params=None, protocol=httpclient):
    url = server.http_url if protocol is httpclient else server.grpc_url
    client = protocol.InferenceServerClient(url)
    try:
        return client.infer(models(server).front, _inputs(protocol, query, docs), parameters=params).as_numpy("SCORES")
    finally:
        client.close()


def test_every_path_matches_reference(served):
    kind, folder, server = served
    probs, logits = reference_scores(kind, folder, QUERY, DOCS)
    streamed = rerank_stream(server, [QUERY], DOCS)
    assert streamed.shape == (len(DOCS),) and streamed.dtype == np.float32
    assert np.abs(streamed - probs).max() < 1e-3
    assert np.ptp(streamed) > 1e-3
    for other in (rerank_generate(server, [QUERY], DOCS), score_unary(server, [QUERY], DOCS),
                  score_unary(server, [QUERY], DOCS, protocol=grpcclient)):
        np.testing.assert_allclose(other, streamed, atol=1e-6)
    raw = score_unary(server, [QUERY], DOCS, {"raw_scores": True})
    np.testing.assert_allclose(raw, logits, rtol=1e-3, atol=1e-5)


def test_gateway_rerank_endpoint_matches_reference(served):
    """POST /v1/rerank on the launcher's gateway (Cohere/Jina shape) over the reranker's ensemble, by
    `model` (the default reranker's name is `rerank`) and without it (the one reranker served)."""
    kind, folder, server = served

    def rerank(body):
        request = urllib.request.Request(f"{server.gateway_url}/v1/rerank", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)["results"]

    probs, logits = reference_scores(kind, folder, QUERY, DOCS)
    name = "rerank" if kind == "bert" else server.reranker_name
    results = rerank({"model": name, "query": QUERY, "documents": DOCS, "top_n": 3})
    assert [r["index"] for r in results] == list(np.argsort(-probs, kind="stable")[:3])
    for r in results:
        assert abs(r["relevance_score"] - probs[r["index"]]) < 1e-3 and r["document"]["text"] == DOCS[r["index"]]
    raw = rerank({"query": QUERY, "documents": [{"text": d} for d in DOCS], "raw_scores": True,
                  "return_documents": False})
    assert len(raw) == len(DOCS) and all("document" not in r for r in raw)
    np.testing.assert_allclose([r["relevance_score"] for r in sorted(raw, key=lambda r: r["index"])], logits,
                               rtol=1e-3, atol=1e-5)
    embedders = ["all-MiniLM-L6-v2"] + ([] if kind == "bert" else [server.embedder_name, server.retrieval_name,
                                                                   server.colbert_name])
    with urllib.request.urlopen(f"{server.gateway_url}/v1/models", timeout=10) as response:
        assert [m["id"] for m in json.load(response)["data"]] == [*embedders, name]


def test_long_document_is_cut_and_query_kept(served):
    kind, folder, server = served
    long_doc = "the eiffel tower stands in paris " * 80
    max_length = 128 if kind == "bert" else 256
    probs, _ = reference_scores(kind, folder, QUERY, [long_doc, DOCS[0]], max_length=max_length)
    assert np.abs(rerank_stream(server, [QUERY], [long_doc, DOCS[0]]) - probs).max() < 1e-3
    with pytest.raises(InferenceServerException, match=r"DOCUMENTS\[1\] with the query is \d+ tokens"):
        rerank_stream(server, [QUERY], [DOCS[0], long_doc], {"truncate": False})


def test_instruction_reaches_the_template(served):
    kind, folder, server = served
    if kind != "qwen3":
        with pytest.raises(InferenceServerException, match="must be a string"):
            rerank_stream(server, [QUERY], DOCS, {"instruction": 3})
        with pytest.raises(InferenceServerException, match="takes no instruction"):
            score_unary(server, [QUERY], DOCS, {"instruction": "Judge relevance"})
        return
    instruction = "Judge whether the document answers the query"
    probs, _ = reference_scores(kind, folder, QUERY, DOCS, instruction=instruction)
    got = score_unary(server, [QUERY], DOCS, {"instruction": instruction})
    assert np.abs(got - probs).max() < 1e-3
    assert np.abs(got - rerank_stream(server, [QUERY], DOCS)).max() > 1e-4  # the instruction changed the pairs


def test_unary_score_equals_the_stream_with_options_and_keeps_error_codes(served):
    """`score` tokenizes pairs itself (rerank_tokenizer's code and settings) and calls the
    encoder directly: the stream's numbers for the same options, INVALID_ARGUMENT / 400 for bad input."""
    kind, _, server = served
    docs = DOCS + ["the eiffel tower stands in paris " * 80]  # cut to the model's maximum
    params = {"raw_scores": True, **({"instruction": "Judge whether the document answers"} if kind == "qwen3" else {})}
    streamed = rerank_stream(server, [QUERY], docs, params)
    assert np.abs(streamed - rerank_stream(server, [QUERY], docs)).max() > 1e-4  # the options changed the scores
    for protocol in (httpclient, grpcclient):
        np.testing.assert_allclose(score_unary(server, [QUERY], docs, params, protocol), streamed, atol=1e-6)
    for protocol, status in ((httpclient, "400"), (grpcclient, "StatusCode.INVALID_ARGUMENT")):
        with pytest.raises(InferenceServerException) as caught:
            score_unary(server, [QUERY], ["paris", b"\xc3\x28"], None, protocol)
        assert caught.value.status() == status and "DOCUMENTS[1] is not valid UTF-8" in str(caught.value)


BAD = {  # inputs, parameters, what the message says, the field on the wire (rose_wire.decode)
    "empty document list": ([QUERY], [], None, "DOCUMENTS is empty", "DOCUMENTS"),
    "empty document": ([QUERY], ["paris", "  "], None, "DOCUMENTS[1] is empty", "DOCUMENTS"),
    "non-UTF-8 document": ([QUERY], ["paris", b"\xc3\x28 broken"], None, "DOCUMENTS[1] is not valid UTF-8",
                           "DOCUMENTS"),
    "empty query": ([""], ["paris"], None, "QUERY[0] is empty", "QUERY"),
    "non-UTF-8 query": ([b"\xff"], ["paris"], None, "QUERY[0] is not valid UTF-8", "QUERY"),
    "two queries": ([QUERY, QUERY], ["paris"], None, "QUERY", None),  # Triton refuses the shape: its own text
    "unknown option": ([QUERY], ["paris"], {"normalize": True}, "unknown request parameter", "normalize"),
    "bad raw_scores": ([QUERY], ["paris"], {"raw_scores": "maybe"}, "raw_scores", "raw_scores"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_named_then_good_request_succeeds(served, case):
    _, _, server = served
    query, docs, params, message, field = BAD[case]
    for call in (lambda: rerank_stream(server, query, docs, params, query_shape=[len(query)]),
                 lambda: score_unary(server, query, docs, params) if len(query) == 1 else
                 rerank_stream(server, query, docs, params, query_shape=[len(query)])):
        with pytest.raises(InferenceServerException) as caught:
            call()
        assert message in str(caught.value) and decode(str(caught.value)).field == field, str(caught.value)
    assert score_unary(server, [QUERY], ["paris"]).shape == (1,)


def test_wrong_datatype_and_generate_errors_are_named(served):
    _, _, server = served
    client = httpclient.InferenceServerClient(server.http_url)
    docs = httpclient.InferInput("DOCUMENTS", [2], "INT32")
    docs.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="DOCUMENTS"):
        client.infer(models(server).front, [_inputs(httpclient, [QUERY], ["x"])[0], docs])
    with pytest.raises(InferenceServerException, match="QUERY"):
        client.infer(models(server).front, [_inputs(httpclient, [QUERY], ["x"])[1]])
    client.close()
    with pytest.raises(urllib.error.HTTPError) as caught:
        rerank_generate(server, [QUERY], [])
    assert "DOCUMENTS is empty" in caught.value.read().decode()


def test_pre_tokenized_token_types_must_match(served):
    kind, _, server = served
    client = grpcclient.InferenceServerClient(server.grpc_url)
    errors: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: errors.put(error))
    tensors = []
    for name, values in (("INPUT_IDS", [2, 5, 3, 6, 3]), ("SEQ_LENS", [5]), ("TOKEN_TYPE_IDS", [0, 0, 1])):
        tensor = grpcclient.InferInput(name, [len(values)], "INT64")
        tensor.set_data_from_numpy(np.array(values, dtype=np.int64))
        tensors.append(tensor)
    client.async_stream_infer(models(server).encoder, tensors)
    error = errors.get(timeout=60)
    client.stop_stream()
    assert error is not None and "TOKEN_TYPE_IDS" in str(error)
    assert (decode(str(error)).code, decode(str(error)).field) == (INVALID_ARG, "TOKEN_TYPE_IDS"), str(error)


def test_concurrent_embed_and_rerank_nothing_crosses(served):
    """Each request's answer under mixed concurrent load equals the same request sent alone."""
    _, _, server = served
    rerank_jobs = [(f"{QUERY} {i}", DOCS[i % len(DOCS):] + DOCS[:i % 3]) for i in range(6)]
    embed_jobs = [[f"text number {i}", "another text " * (i + 1)] for i in range(4)]
    alone_scores = [rerank_stream(server, [q], d) for q, d in rerank_jobs]
    alone_rows = [embed_stream(server.grpc_url, texts) for texts in embed_jobs]
    results, failures = {}, []

    def run(key, fn):
        try:
            results[key] = fn()
        except Exception as exc:  # noqa: BLE001 - recorded and asserted below
            failures.append((key, exc))

    calls = [(("rerank", i), lambda q=q, d=d: rerank_stream(server, [q], d)) for i, (q, d) in enumerate(rerank_jobs)]
    calls += [(("score", i), lambda q=q, d=d: score_unary(server, [q], d)) for i, (q, d) in enumerate(rerank_jobs)]
    calls += [(("embed", i), lambda t=t: embed_stream(server.grpc_url, t)) for i, t in enumerate(embed_jobs)]
    calls += [(("bad", 0), lambda: rerank_stream(server, [QUERY], []))]
    threads = [threading.Thread(target=run, args=call, daemon=True) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert [key for key, _ in failures] == [("bad", 0)], failures
    for i, expected in enumerate(alone_scores):
        np.testing.assert_allclose(results[("rerank", i)], expected, atol=1e-5)
        np.testing.assert_allclose(results[("score", i)], expected, atol=1e-5)
    for i, expected in enumerate(alone_rows):
        np.testing.assert_allclose(results[("embed", i)], expected, atol=1e-5)
    assert server.is_ready()


def test_readme_reranking_example_runs(served, capsys):
    """The README's Reranking block, verbatim (ports substituted; a reranker served by name: its model names)."""
    _, _, server = served
    section = (REPO / "README.md").read_text().split("## Reranking", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    code = code.replace("localhost:8000", server.http_url).replace("localhost:8001", server.grpc_url)
    names = models(server)
    code = code.replace('"rerank"', f'"{names.ensemble}"').replace("/models/rerank/", f"/models/{names.ensemble}/")
    code = code.replace('"score"', f'"{names.front}"')
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 3 and all(re.match(r"[01]\.\d{3}  \S", line) for line in printed), printed


def test_every_served_model_answers_the_watchdogs_probe(served):
    """scripts/watchdog.py probes `ensemble`, `embed`, and `rerank`, `score` with --rerank-model-dir,
    and the ensemble and unary front of every model served by name (the launcher passes it the
    assembled repository's served_models.json): each probe gets a real answer on a healthy server
    (a probe that always failed would tell a hang from nothing)."""
    import importlib.util

    from testing.reliability_helpers import children

    spec = importlib.util.spec_from_file_location("watchdog", REPO / "scripts" / "watchdog.py")
    watchdog = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(watchdog)
    kind, _, server = served
    (command,) = [c[1] for c in children(server.process.pid) if "scripts/watchdog.py" in c[1]]
    if kind == "bert":
        assert "--probe-rerank" in command and "--models-file" not in command
        probes = {m: watchdog.PROBES[m] for m in watchdog.served_models(rerank=True)}
    else:
        assert "--probe-rerank" not in command
        named, _ = watchdog.named_targets(command.split("--models-file ")[1].split()[0])
        assert set(named) == {server.embedder_name, server.embedder_name + "_embed", server.reranker_name,
                              server.reranker_name + "_score", server.retrieval_name, server.retrieval_name + "_embed",
                              server.colbert_name, server.colbert_name + "_embed"}
        probes = {**{m: watchdog.PROBES[m] for m in watchdog.served_models(rerank=False)}, **named}
    for model, body in probes.items():
        assert watchdog.probe(f"http://{server.http_url}", model, 60, body) == (watchdog.OK, ""), model


def test_killed_rerank_stub_is_noticed_and_the_server_recovers(served):
    """The watchdog watches the reranker's stubs too when one is served (last test of each server: it restarts it)."""
    from testing.reliability_helpers import children, watchdog_lines_naming

    kind, _, server = served
    if kind != "bert":
        pytest.skip("one restart per module is enough: run on the cross-encoder's server")
    (triton_pid, _), = [c for c in children(server.process.pid) if "bin/tritonserver" in c[1]]
    (stub_pid, _), = [c for c in children(triton_pid) if "rerank_encoder/1/model.py" in c[1]]
    os.kill(stub_pid, signal.SIGKILL)
    deadline = time.monotonic() + 180
    while not (server.is_ready() and triton_pid not in [c[0] for c in children(server.process.pid)]):
        assert time.monotonic() < deadline, f"server did not come back:\n{server.log_tail()}"
        time.sleep(1)
    assert rerank_stream(server, [QUERY], DOCS).shape == (len(DOCS),)
    log = server.log_tail(200_000)
    assert watchdog_lines_naming("rerank_encoder_0_0", server), server.log_tail()  # stub watch or a probe
    assert "[serve] a model stub died" in log
