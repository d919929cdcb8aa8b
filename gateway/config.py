"""Gateway settings: one frozen dataclass, built from the command line (and a
few environment variables of the gateway's own), and the model names they serve.
The tokenizer settings are the tokenizer models' config.pbtxt under ROSE_*
(rose_triton.parameters)."""
from __future__ import annotations

import argparse
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine_lib.config import TokenizerConfig
from engine_lib.model_folder import DEFAULT_MODEL
from rose_triton.models_file import read_models_file
from rose_triton.parameters import config_from_pbtxt
from rose_wire import RERANK

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
    models_file: str = ""               # models served by name (rose_triton/models_file.py); "" = none
    api_keys: frozenset[str] = field(default_factory=frozenset)
    keys_file: str = ""                 # named keys with limits (gateway/http/keys.py); "" = none
    access_log: str = "-"               # one JSON line per request: "-" standard error, "off", or a file
    max_inflight_per_replica: int = 4
    max_chunk_attempts: int = 4         # failures of one chunk before its request fails (429/503)
    max_chunk_tokens: int = 2048
    max_chunk_texts: int = 128
    max_rerank_chunk_documents: int = 64
    max_pending_tokens: int = 1 << 20   # tokens accepted and not yet answered; past it 429
    max_body_bytes: int = 8 << 20
    max_concurrent_requests: int = 128  # /v1/embeddings and /v1/rerank being answered, body in; past it 429
    max_receiving_connections: int = 1024  # connections receiving a request's headers or body; past it 503
    max_receiving_per_client: int = 64     # the same from one client address; past it 429
    max_buffered_body_bytes: int = 1 << 30  # request bodies held, arriving or being answered; past it 503
    max_header_bytes: int = 32 << 10   # request line + headers; past it 431
    header_timeout_s: float = 10.0     # to receive a request's headers (from connect or the last answer)
    body_timeout_s: float = 30.0       # to receive a request's body (from its headers); past it 408
    keep_alive_timeout_s: float = 5.0  # an idle keep-alive connection is closed after this
    request_timeout_s: float = 120.0   # end-to-end deadline of a request (body read to answer); past it 504
    health_interval_s: float = 1.0
    dns_refresh_s: float = 10.0
    allow_unauthenticated: bool = False  # listen beyond loopback without API keys
    workers: int = 1                    # processes on the port (gateway/workers.py); bounds are per worker
    # the Batch API (gateway/batch/): its files and jobs under data_dir ("" = off)
    data_dir: str = ""
    batch_max_file_lines: int = 50_000
    batch_max_file_bytes: int = 200 << 20
    batch_max_files_per_key: int = 1000
    batch_max_active_per_key: int = 100
    batch_concurrency: int = 8          # a job's lines in flight at once
    batch_lease_s: float = 30.0         # a job's runner lease; a dead runner's job is resumed after it

    def __post_init__(self):
        if not self.triton:
            raise ValueError("give at least one --triton address")
        for name in ("max_inflight_per_replica", "max_chunk_attempts", "max_chunk_tokens", "max_chunk_texts",
                     "max_rerank_chunk_documents", "max_pending_tokens", "max_body_bytes", "max_concurrent_requests",
                     "max_receiving_connections", "max_receiving_per_client", "max_buffered_body_bytes",
                     "max_header_bytes", "workers", *BATCH_BOUNDS):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s", "request_timeout_s", "batch_lease_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_buffered_body_bytes < self.max_body_bytes:
            raise ValueError(f"max_buffered_body_bytes ({self.max_buffered_body_bytes}) must be >= max_body_bytes "
                             f"({self.max_body_bytes}): a body of the largest size could never be taken")
        if not self.api_keys and not self.keys_file and not self.allow_unauthenticated and not is_loopback(self.host):
            raise ValueError(f"--host {self.host} is reachable from other machines and no API key is set: set "
                             "ROSE_GATEWAY_API_KEYS, --api-key-file or --keys-file, or pass --allow-unauthenticated "
                             "(ROSE_GATEWAY_ALLOW_UNAUTHENTICATED=1) to serve without keys")


def is_loopback(host: str) -> bool:
    """Only this machine can connect to `host` (a name other than localhost counts as open)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_workers() -> int:
    """ROSE_GATEWAY_WORKERS, else half the CPUs this process may use, 1 to 4: the gateway
    usually shares its host with Triton (scripts/serve.sh), and past 4 the encoders, not the
    gateway, bound a replica set."""
    setting = os.environ.get("ROSE_GATEWAY_WORKERS", "")
    if setting:
        try:
            return int(setting)
        except ValueError:
            raise ValueError(f"ROSE_GATEWAY_WORKERS must be an integer, got {setting!r}") from None
    return min(4, max(1, usable_cpus() // 2))


def usable_cpus(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The CPUs this process may run on, capped by a cgroup v2 CPU quota (a container's limit)."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def read_api_keys(path: str | None, environ=os.environ) -> frozenset[str]:
    """Keys from a file (one per line, # comments) and ROSE_GATEWAY_API_KEYS (comma-separated)."""
    keys = [k for k in environ.get("ROSE_GATEWAY_API_KEYS", "").split(",")]
    if path:
        try:
            with open(path) as f:
                keys += [line.split("#", 1)[0] for line in f]
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--api-key-file {path} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    return frozenset(k.strip() for k in keys if k.strip())


BATCH_BOUNDS = ("batch_max_file_lines", "batch_max_file_bytes", "batch_max_files_per_key", "batch_max_active_per_key",
                "batch_concurrency")
BOUND_HELP = {
    "max_concurrent_requests": "/v1/embeddings, /v2/embed and /v1/rerank requests being answered, counted once "
                               "their body is in; past it 429",
    "max_receiving_connections": "connections receiving a request (from its first byte to the end of its body; "
                                 "idle keep-alive connections do not count); past it 503 and the connection closed",
    "max_receiving_per_client": "the same from one client address (behind a proxy every client has the proxy's: "
                                "raise it to --max-receiving-connections there); past it 429 and the connection "
                                "closed",
    "max_buffered_body_bytes": "bytes of request bodies held, arriving or being answered; past it 503 and the "
                               "connection closed",
    "max_body_bytes": "a request body; past it 413",
    "max_header_bytes": "request line and headers; past it 431",
    "batch_max_file_lines": "requests in a file uploaded for a batch; past it 400",
    "batch_max_file_bytes": "a file uploaded for a batch; past it 413",
    "batch_max_files_per_key": "files an API key stores (uploads and batch outputs); past it 429",
    "batch_max_active_per_key": "an API key's unfinished batches; past it 429",
    "batch_concurrency": "a batch job's requests in flight at once (each worker runs one job at a time)",
}


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
    p.add_argument("--models-file", default=os.environ.get("ROSE_MODELS_FILE", ""),
                   help="the launcher's models file (JSON or YAML; also ROSE_MODELS_FILE): route each model it "
                        "serves by name to its own Triton models (gateway/engine/routing.py)")
    p.add_argument("--api-key-file", default=os.environ.get("ROSE_GATEWAY_API_KEY_FILE"),
                   help="require Authorization: Bearer with one of these keys (also ROSE_GATEWAY_API_KEYS)")
    p.add_argument("--keys-file", default=os.environ.get("ROSE_GATEWAY_KEYS_FILE", ""),
                   help="named keys with their models and limits (JSON or YAML, re-read when it changes; also "
                        "ROSE_GATEWAY_KEYS_FILE): docs/operations.md, \"Per-key limits\"")
    p.add_argument("--access-log", default=os.environ.get("ROSE_GATEWAY_ACCESS_LOG", "-"), metavar="FILE",
                   help="one JSON line per request: '-' standard error (default), 'off', or a file (also "
                        "ROSE_GATEWAY_ACCESS_LOG)")
    p.add_argument("--allow-unauthenticated", action="store_true",
                   default=os.environ.get("ROSE_GATEWAY_ALLOW_UNAUTHENTICATED", "") == "1",
                   help="serve without API keys on an address other machines reach (refused otherwise; also "
                        "ROSE_GATEWAY_ALLOW_UNAUTHENTICATED=1)")
    for name in ("max_inflight_per_replica", "max_chunk_attempts", "max_chunk_tokens", "max_chunk_texts",
                 "max_rerank_chunk_documents", "max_pending_tokens", "max_body_bytes", "max_concurrent_requests",
                 "max_receiving_connections", "max_receiving_per_client", "max_buffered_body_bytes",
                 "max_header_bytes"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(GatewayConfig, name),
                       help=BOUND_HELP.get(name, "") + " (default %(default)s)")
    for name in ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s"):
        p.add_argument("--" + name.removesuffix("_s").replace("_", "-"), type=float, default=getattr(GatewayConfig, name),
                       help="seconds")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes sharing the port (SO_REUSEPORT); the concurrency, pending-token and "
                        "in-flight bounds are divided among them (default: ROSE_GATEWAY_WORKERS, else half the "
                        "CPUs, 1 to 4)")
    p.add_argument("--request-timeout", type=float, default=GatewayConfig.request_timeout_s, metavar="SECONDS",
                   help="end-to-end deadline of a request, body read to answer (default %(default)g); past it 504")
    p.add_argument("--data-dir", default=os.environ.get("ROSE_GATEWAY_DATA_DIR", ""),
                   help="the Batch API's folder (/v1/files, /v1/batches: SQLite and the files; also "
                        "ROSE_GATEWAY_DATA_DIR); workers and replicas sharing it share the jobs; default: off")
    for name in BATCH_BOUNDS:
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(GatewayConfig, name),
                       help=BOUND_HELP[name] + " (default %(default)s)")
    p.add_argument("--batch-lease", type=float, default=GatewayConfig.batch_lease_s, metavar="SECONDS",
                   help="a batch job's runner lease: a job whose runner died is resumed after it (default %(default)g)")
    args = p.parse_args(argv)
    return GatewayConfig(
        triton=tuple(args.triton or GatewayConfig.triton), host=args.host, port=args.port,
        model_dir=args.model_dir, model_name=args.model_name, tokenizer_config=args.tokenizer_config,
        rerank_tokenizer_config=args.rerank_tokenizer_config,
        rerank_model_name=args.rerank_model_name, models_file=args.models_file, api_keys=read_api_keys(args.api_key_file),
        keys_file=args.keys_file, access_log=args.access_log,
        max_inflight_per_replica=args.max_inflight_per_replica, max_chunk_attempts=args.max_chunk_attempts,
        max_chunk_tokens=args.max_chunk_tokens,
        max_chunk_texts=args.max_chunk_texts, max_rerank_chunk_documents=args.max_rerank_chunk_documents,
        max_pending_tokens=args.max_pending_tokens, max_body_bytes=args.max_body_bytes,
        max_concurrent_requests=args.max_concurrent_requests, max_receiving_connections=args.max_receiving_connections,
        max_receiving_per_client=args.max_receiving_per_client, max_buffered_body_bytes=args.max_buffered_body_bytes,
        max_header_bytes=args.max_header_bytes,
        header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
        keep_alive_timeout_s=args.keep_alive_timeout, allow_unauthenticated=args.allow_unauthenticated,
        request_timeout_s=args.request_timeout,
        workers=args.workers if args.workers is not None else default_workers(),
        data_dir=args.data_dir, batch_lease_s=args.batch_lease, **{name: getattr(args, name) for name in BATCH_BOUNDS})


def served_model_name(config: GatewayConfig, model_dir_setting: str, model_dir: str) -> str:
    """--model-name, else the default model's name, else the folder's name."""
    if config.model_name:
        return config.model_name
    if model_dir_setting in ("", DEFAULT_MODEL):
        return DEFAULT_MODEL_NAME
    return os.path.basename(os.path.normpath(model_dir))


def check_names(config: GatewayConfig) -> list[str]:
    """The served names `config` gives (the default embedder's, `rerank`, the models
    file's), refusing a named model that takes a default model's name: `python -m gateway.config`
    runs this before the launcher starts anything, Routes again at start."""
    setting = config_from_pbtxt(TokenizerConfig, config.tokenizer_config, model_dir=config.model_dir or None).model_dir
    defaults = {served_model_name(config, setting, setting), config.rerank_model_name, RERANK}
    named = [m.name for m in read_models_file(config.models_file)] if config.models_file else []
    clash = sorted(defaults & set(named))
    if clash:
        raise ValueError(f"the models file serves {clash[0]!r}, a name of the default models: choose another")
    return named


if __name__ == "__main__":  # `python -m gateway.config ARGS`: check the settings only (scripts/serve.sh)
    try:
        check_names(parse_args())
    except ValueError as exc:
        raise SystemExit(f"gateway: {exc}") from None
