"""Gateway settings: one frozen dataclass, built from the command line (and a
few environment variables of the gateway's own). The tokenizer settings are the
tokenizer models' config.pbtxt under ROSE_* (rose_triton.parameters)."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TOKENIZER_CONFIG = REPO / "model_repository" / "tokenizer" / "config.pbtxt"
DEFAULT_RERANK_TOKENIZER_CONFIG = REPO / "model_sets" / "rerank" / "rerank_tokenizer" / "config.pbtxt"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"  # the embedded default model


@dataclass(frozen=True)
class GatewayConfig:
    triton: tuple[str, ...] = ("127.0.0.1:8001",)  # host:port or dns:///name:port, repeatable
    host: str = "127.0.0.1"
    port: int = 8080
    model_dir: str = ""                 # "" -> ROSE_MODEL_DIR, else the tokenizer config.pbtxt's
    model_name: str = ""                # the `model` clients send; "" -> from the folder
    tokenizer_config: str = str(DEFAULT_TOKENIZER_CONFIG)
    rerank_tokenizer_config: str = str(DEFAULT_RERANK_TOKENIZER_CONFIG)  # its limits apply to /v1/rerank
    rerank_model_name: str = "rerank"
    api_keys: frozenset[str] = field(default_factory=frozenset)
    max_inflight_per_replica: int = 4
    max_chunk_attempts: int = 4         # failures of one chunk before its request fails (429/503)
    max_chunk_tokens: int = 2048
    max_chunk_texts: int = 128
    max_rerank_chunk_documents: int = 64
    max_pending_tokens: int = 1 << 20   # tokens accepted and not yet answered; past it 429
    max_body_bytes: int = 8 << 20
    request_timeout_s: float = 120.0    # end-to-end deadline of a request (body read to answer); past it 504
    health_interval_s: float = 1.0
    dns_refresh_s: float = 10.0

    def __post_init__(self):
        if not self.triton:
            raise ValueError("give at least one --triton address")
        for name in ("max_inflight_per_replica", "max_chunk_attempts", "max_chunk_tokens", "max_chunk_texts",
                     "max_rerank_chunk_documents", "max_pending_tokens", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")


def read_api_keys(path: str | None, environ=os.environ) -> frozenset[str]:
    """Keys from a file (one per line, # comments) and ROSE_GATEWAY_API_KEYS (comma-separated)."""
    keys = [k for k in environ.get("ROSE_GATEWAY_API_KEYS", "").split(",")]
    if path:
        with open(path) as f:
            keys += [line.split("#", 1)[0] for line in f]
    return frozenset(k.strip() for k in keys if k.strip())


def parse_args(argv: list[str] | None = None) -> GatewayConfig:
    p = argparse.ArgumentParser(prog="python -m gateway", description=__doc__.splitlines()[0])
    p.add_argument("--triton", action="append", metavar="HOST:PORT",
                   help="a Triton gRPC address, or dns:///NAME:PORT for every address NAME resolves to "
                        "(repeatable; default 127.0.0.1:8001)")
    p.add_argument("--host", default=GatewayConfig.host)
    p.add_argument("--port", type=int, default=GatewayConfig.port)
    p.add_argument("--model-dir", default="",
                   help="model folder (the tokenizer's); default ROSE_MODEL_DIR, else the tokenizer config's "
                        "(the embedded model)")
    p.add_argument("--model-name", default=os.environ.get("ROSE_SERVED_MODEL_NAME", ""),
                   help="model name clients send (default: the folder's name; all-MiniLM-L6-v2 embedded)")
    p.add_argument("--tokenizer-config", default=GatewayConfig.tokenizer_config,
                   help="the tokenizer model's config.pbtxt (prefixes and limits are read there; ROSE_* "
                        "overrides apply as for the model)")
    p.add_argument("--rerank-tokenizer-config", default=GatewayConfig.rerank_tokenizer_config,
                   help="the rerank_tokenizer model's config.pbtxt (/v1/rerank's limits; ROSE_RERANK_* overrides)")
    p.add_argument("--rerank-model-name", default=os.environ.get("ROSE_RERANK_MODEL_NAME", "rerank"))
    p.add_argument("--api-key-file", default=os.environ.get("ROSE_GATEWAY_API_KEY_FILE"),
                   help="require Authorization: Bearer with one of these keys (also ROSE_GATEWAY_API_KEYS)")
    for name in ("max_inflight_per_replica", "max_chunk_attempts", "max_chunk_tokens", "max_chunk_texts",
                 "max_rerank_chunk_documents",
                 "max_pending_tokens", "max_body_bytes"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(GatewayConfig, name))
    p.add_argument("--request-timeout", type=float, default=GatewayConfig.request_timeout_s, metavar="SECONDS",
                   help="end-to-end deadline of a request, body read to answer (default %(default)g); past it 504")
    args = p.parse_args(argv)
    return GatewayConfig(
        triton=tuple(args.triton or GatewayConfig.triton), host=args.host, port=args.port,
        model_dir=args.model_dir, model_name=args.model_name, tokenizer_config=args.tokenizer_config,
        rerank_tokenizer_config=args.rerank_tokenizer_config,
        rerank_model_name=args.rerank_model_name, api_keys=read_api_keys(args.api_key_file),
        max_inflight_per_replica=args.max_inflight_per_replica, max_chunk_attempts=args.max_chunk_attempts,
        max_chunk_tokens=args.max_chunk_tokens,
        max_chunk_texts=args.max_chunk_texts, max_rerank_chunk_documents=args.max_rerank_chunk_documents,
        max_pending_tokens=args.max_pending_tokens, max_body_bytes=args.max_body_bytes,
        request_timeout_s=args.request_timeout)
