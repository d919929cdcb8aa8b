"""The three documented ways to embed texts with tritonclient (used by tests). `model`: a
model served by name (its ensemble is the name, its unary front name_embed: rose_wire.served_models)."""
from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from rose_wire import (
    EMBED,
    EMBEDDINGS,
    EMBEDDINGS_BINARY,
    EMBEDDINGS_INT8,
    EMBEDDINGS_UBINARY,
    EMBEDDINGS_UINT8,
    ENSEMBLE,
    INT8_RANGES,
    TEXT,
)


def _text_array(texts) -> np.ndarray:
    return np.array([t.encode("utf-8") if isinstance(t, str) else t for t in texts], dtype=object)


def embed_stream(grpc_url: str, texts, parameters: dict | None = None, timeout: float = 120,
                 model: str = ENSEMBLE) -> np.ndarray:
    """gRPC streaming on the decoupled `ensemble` (or `model`)."""
    return stream_outputs(grpc_url, {TEXT: _text_array(texts)}, (EMBEDDINGS,), parameters, model, timeout)[EMBEDDINGS]


def embed_generate(http_url: str, texts, parameters: dict | None = None, timeout: float = 120,
                   model: str = ENSEMBLE) -> np.ndarray:
    """HTTP `generate` on `ensemble` (or `model`); the JSON reply is flat, reshaped to [N, D]."""
    body = {TEXT: list(texts), **({"parameters": parameters} if parameters else {})}
    request = urllib.request.Request(f"http://{http_url}/v2/models/{model}/generate",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        reply = json.load(response)
    return np.asarray(reply[EMBEDDINGS], dtype=np.float32).reshape(len(texts), -1)


def _infer_unary(protocol, client, texts, parameters: dict | None, model: str = EMBED) -> np.ndarray:
    """`client.infer` on the unary `embed` model; `protocol` is tritonclient.grpc or .http."""
    try:
        text = protocol.InferInput(TEXT, [len(texts)], "BYTES")
        text.set_data_from_numpy(_text_array(texts))
        return client.infer(model, [text], parameters=parameters).as_numpy(EMBEDDINGS)
    finally:
        client.close()


def embed_unary_grpc(grpc_url: str, texts, parameters: dict | None = None, model: str = EMBED) -> np.ndarray:
    """Plain `client.infer` over gRPC on the unary `embed` model (or `model`)."""
    return _infer_unary(grpcclient, grpcclient.InferenceServerClient(grpc_url), texts, parameters, model)


def embed_unary_http(http_url: str, texts, parameters: dict | None = None, model: str = EMBED) -> np.ndarray:
    """Plain `client.infer` over HTTP on the unary `embed` model (or `model`)."""
    client = httpclient.InferenceServerClient(http_url, network_timeout=120)
    return _infer_unary(httpclient, client, texts, parameters, model)


# Several outputs at once (the compact types): {output name: array}, only the outputs the reply carries.
_DTYPES = {EMBEDDINGS: np.float32, EMBEDDINGS_INT8: np.int8, EMBEDDINGS_UINT8: np.uint8,
           EMBEDDINGS_BINARY: np.int8, EMBEDDINGS_UBINARY: np.uint8, INT8_RANGES: np.float32}


def stream_outputs(grpc_url: str, inputs: dict, outputs=(), parameters: dict | None = None,
                   model: str = ENSEMBLE, timeout: float = 120) -> dict:
    """gRPC streaming; `inputs`: {name: numpy array} (object arrays are BYTES); `outputs`: the
    requested outputs (none: Triton's default, all of them)."""
    client = grpcclient.InferenceServerClient(grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        tensors = []
        for name, array in inputs.items():
            tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "INT64")
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        client.async_stream_infer(model, tensors, outputs=[grpcclient.InferRequestedOutput(n) for n in outputs] or None,
                                  parameters=parameters)
        result, error = results.get(timeout=timeout)
    finally:
        client.stop_stream()
        client.close()
    if error is not None:
        raise error
    return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}


def generate_outputs(http_url: str, texts, parameters: dict | None = None, timeout: float = 120) -> dict:
    """HTTP `generate` on `ensemble`: every output in the reply, reshaped ([2, D] ranges, else [N, ...])."""
    body = {TEXT: list(texts), **({"parameters": parameters} if parameters else {})}
    request = urllib.request.Request(f"http://{http_url}/v2/models/{ENSEMBLE}/generate",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        reply = json.load(response)
    return {n: np.asarray(reply[n], dtype=d).reshape(2 if n == INT8_RANGES else len(texts), -1)
            for n, d in _DTYPES.items() if n in reply}


def unary_outputs(protocol, url: str, texts, outputs=(), parameters: dict | None = None) -> dict:
    """`client.infer` on `embed`; `protocol` is tritonclient.grpc or .http."""
    client = protocol.InferenceServerClient(url)
    try:
        text = protocol.InferInput(TEXT, [len(texts)], "BYTES")
        text.set_data_from_numpy(_text_array(texts))
        requested = [protocol.InferRequestedOutput(n) for n in outputs] or None
        result = client.infer(EMBED, [text], outputs=requested, parameters=parameters)
        names = [o.name for o in result.get_response().outputs] if protocol is grpcclient else \
            [o["name"] for o in result.get_response()["outputs"]]
        return {n: result.as_numpy(n) for n in names}
    finally:
        client.close()


def post_gateway(server, path: str, body: dict) -> tuple[int, dict]:
    """One JSON POST to `server`'s gateway -> (status, JSON body), error statuses included."""
    request = urllib.request.Request(f"{server.gateway_url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)
