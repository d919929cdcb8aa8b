"""The client paths of the overhead profile: one picklable spec per path, `connect() -> call(request)`."""
from __future__ import annotations

import http.client
import json
from dataclasses import dataclass

import numpy as np

from ..targets import RoseStream, TritonUnary, _text_array
from ..texts import Request


@dataclass(frozen=True)
class HttpGenerate:
    """HTTP `generate` on the ensemble, one kept-alive connection (JSON in and out)."""
    http_url: str
    model: str = "ensemble"

    def connect(self):
        host, port = self.http_url.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=600)
        path = f"/v2/models/{self.model}/generate"

        def call(request: Request) -> np.ndarray:
            conn.request("POST", path, json.dumps({"TEXT": request.texts}), {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
                raise RuntimeError(f"generate: HTTP {response.status}: {data[:300]!r}")
            return np.asarray(json.loads(data)["EMBEDDINGS"], dtype=np.float32).reshape(len(request.texts), -1)

        return call


@dataclass(frozen=True)
class UnaryEmbed:
    """Plain `client.infer` on the unary `embed` model over gRPC or HTTP (tritonclient)."""
    url: str
    protocol: str  # "grpc" | "http"
    model: str = "embed"

    def connect(self):
        if self.protocol == "grpc":
            import tritonclient.grpc as client_lib

            client = client_lib.InferenceServerClient(self.url)
        else:
            import tritonclient.http as client_lib

            client = client_lib.InferenceServerClient(self.url, network_timeout=600)

        def call(request: Request) -> np.ndarray:
            text = client_lib.InferInput("TEXT", [len(request.texts)], "BYTES")
            text.set_data_from_numpy(_text_array(request.texts))
            return client.infer(self.model, [text]).as_numpy("EMBEDDINGS")

        return call


# path -> (what it is, whether the server tokenizes, whether its output is the model's)
PATHS = {
    "tokens": ("pre-tokenized ids, `rose_encoder`, gRPC stream", False, True),
    "ensemble": ("text, `ensemble`, gRPC stream", True, True),
    "generate": ("text, `ensemble`, HTTP generate", True, True),
    "unary_grpc": ("text, unary `embed`, gRPC infer", True, True),
    "unary_http": ("text, unary `embed`, HTTP infer", True, True),
    "floor_execute": ("floor: identity decoupled Python model answering in execute, gRPC stream", False, False),
    "floor_thread": ("floor: identity decoupled Python model answering from a thread, gRPC stream", False, False),
    "floor_batched": ("floor: `floor_execute` behind Triton's dynamic batcher (inputs [1, N]), gRPC stream",
                      False, False),
    "padded": ("text, usual Triton way (padded HF model, dynamic batcher), gRPC infer", True, True),
}


def spec(path: str, grpc_url: str, http_url: str):
    if path == "tokens":
        return RoseStream(grpc_url, pre_tokenized=True)
    if path == "ensemble":
        return RoseStream(grpc_url)
    if path == "generate":
        return HttpGenerate(http_url)
    if path in ("unary_grpc", "unary_http"):
        return UnaryEmbed(grpc_url if path == "unary_grpc" else http_url, path.split("_")[1])
    if path.startswith("floor_"):
        return RoseStream(grpc_url, pre_tokenized=True, model=path, batch_dim=path == "floor_batched")
    if path == "padded":
        return TritonUnary(grpc_url, "hf_padded")
    raise ValueError(f"unknown path {path!r}; known: {', '.join(PATHS)}")
