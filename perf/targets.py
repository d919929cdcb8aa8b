"""Clients for served targets (ours, Triton baselines, OpenAI-style HTTP servers).

A target is a small picklable spec; `connect()` returns `call(request) ->
embeddings [N, D]` with its own connection, so each client process of a
throughput run opens its own.
"""
from __future__ import annotations

import http.client
import json
import multiprocessing as mp
import queue
import time
from dataclasses import dataclass

import numpy as np

from .measure import Progress, closed_loop, combine
from .texts import Request


def _text_array(texts) -> np.ndarray:
    return np.array([t.encode("utf-8") for t in texts], dtype=object)


@dataclass(frozen=True)
class RoseStream:
    """Ours: gRPC streaming on `ensemble` (text in) or `rose_encoder` (token ids in, + segment ids for
    reranker pairs); `model` overrides, `output` names the result tensor (SCORES for `rerank_encoder`)."""
    grpc_url: str
    pre_tokenized: bool = False
    timeout: float = 600.0
    model: str = ""
    output: str = "EMBEDDINGS"
    batch_dim: bool = False  # inputs shaped [1, N] (a model behind Triton's dynamic batcher)

    def connect(self):
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.grpc_url)
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))

        def tensor(name, values, datatype="INT64"):
            if self.batch_dim:
                values = values.reshape(1, -1)
            t = grpcclient.InferInput(name, list(values.shape), datatype)
            t.set_data_from_numpy(values)
            return t

        def call(request: Request) -> np.ndarray:
            if self.pre_tokenized:
                inputs = [tensor("INPUT_IDS", request.input_ids), tensor("SEQ_LENS", request.seq_lens)]
                if request.token_types is not None:
                    inputs.append(tensor("TOKEN_TYPE_IDS", request.token_types))
                client.async_stream_infer(self.model or "rose_encoder", inputs)
            else:
                client.async_stream_infer(self.model or "ensemble",
                                          [tensor("TEXT", _text_array(request.texts), "BYTES")])
            result, error = results.get(timeout=self.timeout)
            if error is not None:
                raise RuntimeError(f"rose: {error}")
            return result.as_numpy(self.output)

        return call


@dataclass(frozen=True)
class TritonUnary:
    """A plain Triton model (batching dim first): gRPC `infer` with TEXT [N, 1]."""
    grpc_url: str
    model: str

    def connect(self):
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.grpc_url)

        def call(request: Request) -> np.ndarray:
            text = grpcclient.InferInput("TEXT", [len(request.texts), 1], "BYTES")
            text.set_data_from_numpy(_text_array(request.texts).reshape(-1, 1))
            return client.infer(self.model, [text], client_timeout=600).as_numpy("EMBEDDINGS")

        return call


@dataclass(frozen=True)
class OpenAIEmbeddings:
    """An OpenAI-style /embeddings endpoint (vLLM, Infinity); reconnects when the server drops idle sockets."""
    host: str
    port: int
    path: str
    model: str
    token_ids: bool = False  # send pre-tokenized ids (vLLM accepts lists of ints)

    def connect(self):
        state = {"conn": None}

        def post(body: bytes) -> dict:
            for attempt in range(2):
                if state["conn"] is None:
                    state["conn"] = http.client.HTTPConnection(self.host, self.port, timeout=600)
                try:
                    state["conn"].request("POST", self.path, body, {"Content-Type": "application/json"})
                    response = state["conn"].getresponse()
                    data = response.read()
                except (http.client.HTTPException, ConnectionError):
                    state["conn"].close()
                    state["conn"] = None
                    if attempt:
                        raise
                    continue
                if response.status != 200:
                    raise RuntimeError(f"{self.path}: HTTP {response.status}: {data[:300]!r}")
                return json.loads(data)
            raise AssertionError("unreachable")

        def call(request: Request) -> np.ndarray:
            if self.token_ids:
                bounds = np.concatenate([[0], np.cumsum(request.seq_lens)])
                payload = [request.input_ids[bounds[i]:bounds[i + 1]].tolist() for i in range(len(request.seq_lens))]
            else:
                payload = request.texts
            reply = post(json.dumps({"model": self.model, "input": payload}).encode())
            rows = sorted(reply["data"], key=lambda d: d["index"])
            return np.asarray([r["embedding"] for r in rows], dtype=np.float32)

        return call


def _client_process(spec, requests, duration, offset, barrier, results):
    try:
        call = spec.connect()
        call(requests[offset % len(requests)])  # connect + first-call costs stay out of the window
        barrier.wait()
        results.put(closed_loop(call, requests, time.time(), duration, offset))
    except Exception as exc:  # reported to the parent, which fails the cell
        barrier.abort()
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def process_loop(spec, requests: list[Request], concurrency: int, duration: float, label: str) -> dict:
    """`concurrency` client processes, each with its own connection, closed loop for `duration` s."""
    ctx = mp.get_context("spawn")  # gRPC does not survive fork
    barrier, results = ctx.Barrier(concurrency + 1), ctx.Queue()
    procs = [ctx.Process(target=_client_process, args=(spec, requests, duration, k * 7, barrier, results), daemon=True)
             for k in range(concurrency)]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=600)
    except Exception:
        pass
    progress = Progress(label, duration, "s")
    start = time.monotonic()
    parts = []
    while len(parts) < concurrency:
        try:
            parts.append(results.get(timeout=0.2))
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and results.empty():
                break
        progress.update(min(duration, time.monotonic() - start))
    progress.close()
    for p in procs:
        p.join(5)
    errors = [p["error"] for p in parts if "error" in p]
    if errors or len(parts) < concurrency:
        raise RuntimeError(f"{label}: client failed: {errors or 'a client process died'}")
    return combine(parts)
