"""The gateway's `model` routing (gateway/engine/routing.py) with a models file, against in-process fake
replicas that record which Triton model each chunk went to (real servers: test_multi_model_e2e.py)."""
import asyncio
import json

import numpy as np
import pytest

from engine_lib.config import TokenizerConfig
from engine_lib.options import RequestOptions
from engine_lib.tokenization.text import TextTokenizer
from gateway.app import create_app
from gateway.config import GatewayConfig
from testing.gateway_app import REPLICA, gateway_client

DEFAULT = "all-MiniLM-L6-v2"


class RecordingReplica:
    """Embeds a sequence as [sum of its ids, its length] (D=2); scores a document by its length."""

    def __init__(self):
        self.calls = []

    def slot(self, url):
        replica = self

        class Slot:
            async def call(self, call):
                replica.calls.append(call)
                await asyncio.sleep(0)
                if "DOCUMENTS" in call.inputs:
                    return np.array([len(d) for d in call.inputs["DOCUMENTS"]], dtype=np.float32)
                ids, lens = call.inputs["INPUT_IDS"], call.inputs["SEQ_LENS"]
                return np.array([[part.sum(), len(part)] for part in np.split(ids, np.cumsum(lens)[:-1])],
                                dtype=np.float32)

            async def close(self):
                pass

        return Slot()


@pytest.fixture(scope="module")
def models_file(tmp_path_factory, model_dir):
    """Two embedders and two rerankers by name, on the default model's folder with their own settings."""
    path = tmp_path_factory.mktemp("routing") / "models.json"
    path.write_text(json.dumps({
        "embedders": {"e5": {"model_dir": model_dir, "query_prefix": "query: ", "max_texts_per_request": 2},
                      "plain": {"model_dir": model_dir}},
        "rerankers": {"judge": {"model_dir": model_dir, "max_texts_per_request": 3},
                      "second": {"model_dir": model_dir}}}))
    return str(path)


def run(scenario, models_file, default_reranker=False, not_ready=()):
    replica = RecordingReplica()

    async def main():
        async with gateway_client(replica.slot, reranker=default_reranker, models_file=models_file) as (client, app):
            backend = app.state.gateway.backend
            backend.target_ready = {m: {REPLICA: m not in not_ready} for m in backend.targets}
            return await scenario(client)

    return asyncio.run(main()), replica


def post(path, body, models_file, **kwargs):
    async def scenario(client):
        return await client.post(path, json=body)
    return run(scenario, models_file, **kwargs)


def test_each_embedder_gets_its_own_encoder_tokenizer_settings_and_limits(models_file, model_dir):
    texts = ["what is a vector", "an index"]
    for name, encoder, prefix in ((DEFAULT, "rose_encoder", ""), ("e5", "e5_encoder", "query: "),
                                  ("plain", "plain_encoder", "")):
        response, replica = post("/v1/embeddings", {"model": name, "input": texts, "input_type": "query"},
                                 models_file)
        assert response.status_code == 200 and response.json()["model"] == name, response.text
        (call,) = replica.calls
        tokens = TextTokenizer(model_dir, TokenizerConfig(query_prefix=prefix)).encode(
            texts, RequestOptions.from_parameters({"input_type": "query"}))
        ids, lens = tokens.input_ids, tokens.seq_lens
        assert call.model == encoder
        np.testing.assert_array_equal(call.inputs["INPUT_IDS"], ids)  # the route's own template
        np.testing.assert_array_equal(call.inputs["SEQ_LENS"], lens)
    too_many = {"input": ["a", "b", "c"]}
    assert post("/v1/embeddings", {"model": "e5", **too_many}, models_file)[0].status_code == 413
    assert post("/v1/embeddings", {"model": DEFAULT, **too_many}, models_file)[0].status_code == 200


def test_rerankers_route_by_name_and_without_one_only_when_unambiguous(models_file):
    body = {"query": "q", "documents": ["aa", "b"]}
    for name in ("judge", "second"):
        response, replica = post("/v1/rerank", {**body, "model": name}, models_file)
        assert response.status_code == 200 and response.json()["model"] == name, response.text
        assert [c.model for c in replica.calls] == [name]
    response, replica = post("/v1/rerank", body, models_file)
    assert response.status_code == 400 and response.json()["error"]["param"] == "model" and not replica.calls
    assert "several rerankers are served: ['judge', 'second']" in response.json()["error"]["message"]
    response, replica = post("/v1/rerank", body, models_file, default_reranker=True)
    assert response.status_code == 200 and [c.model for c in replica.calls] == ["rerank"]
    response, _ = post("/v1/rerank", {**body, "documents": ["a"] * 4, "model": "judge"}, models_file)
    assert response.status_code == 413  # judge's own max_texts_per_request


def test_unknown_names_are_404_naming_the_served_ones(models_file):
    response, replica = post("/v1/embeddings", {"model": "nope", "input": "x"}, models_file)
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"
    assert f"served: {[DEFAULT, 'e5', 'plain']}" in response.json()["error"]["message"]
    response, _ = post("/v1/embeddings", {"model": "judge", "input": "x"}, models_file)
    assert response.status_code == 404 and "it is a reranker" in response.json()["error"]["message"]
    response, _ = post("/v1/rerank", {"model": "e5", "query": "q", "documents": ["d"]}, models_file,
                       default_reranker=True)
    assert response.status_code == 404 and "served: ['rerank', 'judge', 'second']" in response.json()["error"]["message"]
    assert not replica.calls


def test_models_lists_every_model_and_a_model_no_replica_serves_is_503(models_file):
    async def scenario(client):
        return (await client.get("/v1/models")).json()

    listed, _ = run(scenario, models_file, default_reranker=True)
    assert [m["id"] for m in listed["data"]] == [DEFAULT, "e5", "plain", "rerank", "judge", "second"]
    response, replica = post("/v1/embeddings", {"model": "e5", "input": "x"}, models_file, not_ready=("e5_encoder",))
    assert response.status_code == 503 and "'e5_encoder'" in response.json()["error"]["message"]
    assert post("/v1/embeddings", {"model": "plain", "input": "x"}, models_file,
                not_ready=("e5_encoder",))[0].status_code == 200


def test_a_named_model_cannot_take_a_default_models_name(tmp_path, model_dir):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"embedders": {DEFAULT: {"model_dir": model_dir}}}))
    with pytest.raises(ValueError, match="a name of the default models"):
        create_app(GatewayConfig(triton=("fake:1",), models_file=str(path)))


def test_the_launchers_preflight_refuses_a_default_models_name(tmp_path, models_file, model_dir):
    """`python -m gateway.config` (serve.sh, before anything starts) runs check_names."""
    from gateway.config import check_names

    assert check_names(GatewayConfig(models_file=models_file)) == ["e5", "plain", "judge", "second"]
    for name in (DEFAULT, "rerank"):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"rerankers": {name: {"model_dir": model_dir}}}))
        with pytest.raises(ValueError, match=f"serves '{name}', a name of the default models"):
            check_names(GatewayConfig(models_file=str(path)))
