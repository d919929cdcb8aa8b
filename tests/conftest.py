"""Shared fixtures: one real tritonserver per session, the reference model."""
from __future__ import annotations

import json
import os
import secrets
import threading

import pytest

from rose_triton.models_file import ServedModel
from rose_triton.server import TritonServer
from rose_wire import RERANKER, served_models

MULTI_EMBEDDER, MULTI_RERANKER = "qwen3-embedder", "qwen3-reranker"  # multi_server's models served by name
MULTI_RETRIEVAL = "bge-m3-tiny"  # multi_server's random-weight BGE-M3 (testing/tiny_retrieval.py)
MULTI_COLBERT = "colbert-tiny"  # and its random-weight ColBERT (PyLate's layout)

# Gateways started by the tests run one worker, whatever the CPU count (bounds and metrics stay
# those the tests set); tests/unit/gateway/test_gateway_workers.py runs two.
os.environ.setdefault("ROSE_GATEWAY_WORKERS", "1")
# Their Batch API is off (no folder shared between servers), but for the `server` fixture's, in its folder.
os.environ.setdefault("ROSE_GATEWAY_DATA_DIR", "")
# `dtype=auto` serves float32 on this machine's CPU, as it does on one without native bf16, so the
# suite holds served rows to float32 references at float32 tolerances on any CPU. The tests of
# the bf16 default set ROSE_CPU_BF16=auto themselves: tests/unit/runner/test_auto_dtype.py and
# tests/e2e/test_auto_dtype_e2e.py.
os.environ.setdefault("ROSE_CPU_BF16", "off")
# The CPU step bound times steps at start-up, so the budget it picks follows the machine's load; test
# servers keep max_batch_tokens as set (the bound's rule and its wiring:
# tests/unit/runner/test_batch_budget.py).
os.environ.setdefault("ROSE_MAX_CPU_STEP_MS", "0")


# scripts/test.sh runs the server tests as two pytest runs at once: ROSE_TEST_SHARD=own_server
# keeps the tests marked own_server (they start servers of their own), =shared the others.
SHARDS = ("own_server", "shared")


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests skip where torch sees no CUDA device (the CPU suite);
    ROSE_TEST_SHARD keeps one shard of the tests."""
    shard = os.environ.get("ROSE_TEST_SHARD")
    if shard:
        if shard not in SHARDS:
            raise pytest.UsageError(f"ROSE_TEST_SHARD={shard!r}: expected one of {SHARDS}")
        keep = [item for item in items if (item.get_closest_marker("own_server") is not None) == (shard == "own_server")]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep

    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def session_servers():
    """The session's shared servers, killed at the end: a graceful stop would wait a second per
    Python model instance (Triton unloads them one after another); the tests that need the
    graceful stop (SIGTERM drains) do it on servers of their own."""
    started: list[TritonServer] = []
    yield started
    for instance in started:
        instance.kill()


@pytest.fixture(scope="session")
def server(tmp_path_factory, session_servers):
    """A real tritonserver on loopback serving model_repository/ (default model).

    It has an admin key (perf_analyzer needs the statistics API); the security
    tests check that requests without it are refused. The launcher's gateway
    runs beside it (`server.gateway_url`), as with `make serve`. `server.hold`: the encoder's
    test-only hold (testing/hold.py), released unless a test holds it; `server.tokenizer_hold`:
    the tokenizer's."""
    from testing.hold import EncoderHold, TokenizerHold

    folder = tmp_path_factory.mktemp("triton")
    hold, tokenizer_hold = EncoderHold(folder), TokenizerHold(folder)
    # its own int8 calibration cache (tests/e2e/test_quantized_e2e.py sees it computed and written)
    instance = TritonServer(folder / "server.log", admin_key=secrets.token_hex(16), gateway=True,
                            env={**hold.env, **tokenizer_hold.env, "ROSE_CACHE_DIR": str(folder / "cache"),
                                 "ROSE_GATEWAY_DATA_DIR": str(folder / "gateway-data")})
    instance.cache_dir = folder / "cache"
    instance.hold, instance.tokenizer_hold = hold, tokenizer_hold
    session_servers.append(instance)
    return instance


@pytest.fixture(scope="session")
def model_dir():
    from engine_lib.model_folder import resolve_model_dir

    return resolve_model_dir("default")


@pytest.fixture(scope="session")
def reference_model(model_dir):
    """sentence-transformers on the same weights: the reference implementation."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_dir, device="cpu")


@pytest.fixture(scope="module")
def replicas(request, tmp_path_factory):
    """(A, B) for multi-replica tests: A is the session's server, B is this module's own
    (modules may kill it). B starts in the background while A comes up."""
    started = {}
    log = tmp_path_factory.mktemp("replica_b") / "server.log"
    thread = threading.Thread(target=lambda: started.setdefault("b", TritonServer(log)), daemon=True)
    thread.start()
    a = request.getfixturevalue("server")
    thread.join()
    if "b" not in started:
        pytest.fail(f"replica B did not start; log: {log}")
    yield a, started["b"]
    started["b"].kill()


@pytest.fixture(scope="session")
def multi_server(tmp_path_factory, session_servers):
    """One launch serving three models by name: the default all-MiniLM-L6-v2 (BERT; Triton
    models ensemble, embed, tokenizer, rose_encoder; gateway name all-MiniLM-L6-v2), a
    random-weight Qwen3 embedder (testing/qwen3_embedder.py) as `qwen3-embedder` from a models
    file with its own settings, and a random-weight Qwen3 yes/no reranker as `qwen3-reranker`
    (--rerank-model). Tests only read from it, except the reranker's stub-kill test, which
    waits for the restart."""
    from testing.qwen3_embedder import save_qwen3_embedder
    from testing.tiny_rerankers import save_reranker
    from testing.tiny_retrieval import save_bge_m3, save_colbert

    folder = tmp_path_factory.mktemp("multi")
    (folder / "qwen3_embedder").mkdir()
    embedder = save_qwen3_embedder(folder / "qwen3_embedder")
    reranker = folder / "reranker-qwen3"
    reranker.mkdir()
    save_reranker("qwen3", reranker)
    models_file = folder / "models.json"
    save_bge_m3(folder / "bge_m3")
    save_colbert(folder / "colbert")
    # max_cpu_step_ms=0: each encoder's budget is the one configured, however fast this machine steps
    models_file.write_text(json.dumps({"embedders": {MULTI_EMBEDDER: {
        "model_dir": "qwen3_embedder", "max_batch_tokens": 4096, "max_batch_sequences": 64, "max_cpu_step_ms": 0},
        MULTI_RETRIEVAL: {"model_dir": "bge_m3"}, MULTI_COLBERT: {"model_dir": "colbert"}}}))
    step_bound_off = {"ROSE_MAX_CPU_STEP_MS": "0",  # the default model, and the reranker by its prefix
                      ServedModel(MULTI_RERANKER, RERANKER, str(reranker)).env_prefix + "MAX_CPU_STEP_MS": "0"}
    instance = TritonServer(folder / "server.log", gateway=True, env=step_bound_off,
                            serve_args=["--models-file", str(models_file),
                                        "--rerank-model", f"{MULTI_RERANKER}={reranker}"])
    instance.embedder, instance.reranker_folder, instance.models_file = embedder, reranker, models_file
    instance.embedder_name, instance.reranker_name = MULTI_EMBEDDER, MULTI_RERANKER
    instance.retrieval_name, instance.retrieval_folder = MULTI_RETRIEVAL, folder / "bge_m3"
    instance.colbert_name, instance.colbert_folder = MULTI_COLBERT, folder / "colbert"
    instance.rerank_models = served_models(MULTI_RERANKER, RERANKER)
    session_servers.append(instance)
    return instance
