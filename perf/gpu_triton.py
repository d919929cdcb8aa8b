"""`--profile gpu-triton`: the Triton model repository itself on the GPU machine.

`scripts/serve.sh` serves a random-weight Qwen3 embedder folder (testing/qwen3_embedder.py: a word
tokenizer, 64 wide, so the model costs next to nothing and the host path shows) with the encoder on
`device=auto`; texts go through `ensemble` over gRPC streaming with tritonclient. First each text's
row is checked against transformers on the same weights (cosine >= 0.999), then: one client
sending single texts one after another (the serving overhead), and 16 clients at once. On a GPU
machine the encoder must serve on CUDA (the device label of `rose_self_check_cosine` on /metrics).
Triton comes from the carried wheels (perf/gpu_check.sh, stage `triton`); `--dry-run`: the same on
this machine's CPU."""
from __future__ import annotations

import datetime
import re
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from engine_lib.runner.self_check import MIN_COSINE
from rose_triton.server import TritonServer
from testing.qwen3_embedder import save_qwen3_embedder

from .measure import latency_loop, latency_stats, log, min_cosine, threaded_loop
from .profiles import Cell
from .targets import RoseStream
from .report import markdown  # noqa: F401 (the renderer of these profiles: the cells format)
from .texts import Request

WORDS = ("the quick brown fox jumps over the lazy dog hello world embedding models map text to vectors "
         "where is the nearest train station a search engine ranks documents for a query").split()
FULL = dict(words=128, sequential=200, clients=16, seconds=10.0)
DRY = dict(words=32, sequential=20, clients=4, seconds=2.0)
CHECK_TEXTS = ["hello world", "the lazy dog jumps over the quick brown fox", "vectors", "where is the search engine"]


def text_request(batch: list[str], words: int) -> Request:
    """Texts as the harness's request (`words` per text: the embeddings a load cell counts are its texts)."""
    return Request(batch, np.zeros(0, np.int64), np.full(len(batch), words))


def texts(num: int, words: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [[" ".join(rng.choice(WORDS, size=words))] for _ in range(num)]


def served_device(metrics_url: str, wait_s: float = 10.0) -> str:
    """The encoder's device as /metrics names it (`rose_self_check_cosine{...device="cuda:0"...}`), or "" if it
    does not show within `wait_s` (the encoder publishes its gauges every 0.5 s)."""
    deadline = time.monotonic() + wait_s
    while True:
        body = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
        match = re.search(r'^rose_self_check_cosine\{[^}]*device="([^"]+)"', body, flags=re.M)
        if match or time.monotonic() > deadline:
            return match.group(1) if match else ""
        time.sleep(0.2)


def per_thread_streams(grpc_url: str):
    """call(request) on the calling thread's own stream (opened on its first call); `.close()` ends them all."""
    local, opened = threading.local(), []

    def call(request):
        if not hasattr(local, "call"):
            local.call = RoseStream(grpc_url).connect()
            opened.append(local.call)
        return local.call(request)

    call.close = lambda: [stream.close() for stream in opened]
    return call


def measure(args, out_json, machine: dict) -> dict:
    sizes = DRY if args.dry_run else FULL
    sequential = Cell("ensemble over gRPC, one client", "batch1", "sequential", "text", sizes["words"], 1,
                      num_requests=sizes["sequential"])
    load = Cell("ensemble over gRPC, clients at once", "clients", "load", "text", sizes["words"], 1, sizes["clients"],
                duration_s=sizes["seconds"], metric="embeddings_per_s")
    started = datetime.datetime.now().isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory() as tmp:
        embedder = save_qwen3_embedder(Path(tmp))
        expected = embedder.reference(CHECK_TEXTS)
        server = TritonServer(Path(tmp) / "server.log", env={"ROSE_MODEL_DIR": str(embedder.folder)}, ready_timeout=600)
        try:
            call = RoseStream(server.grpc_url).connect()  # `ensemble`, text in, over gRPC streaming
            cosine = min_cosine(call(text_request(CHECK_TEXTS, 0)), expected)
            device = served_device(server.metrics_url)
            log(f"gpu-triton: served rows vs transformers min cosine {cosine:.6f}; encoder on {device or '?'}")
            requests = [text_request(batch, sizes["words"]) for batch in texts(32, sizes["words"], 5)]
            for request in requests[:5]:
                call(request)
            batch1 = latency_stats(latency_loop(call, requests, sequential.num_requests, 120, "batch1"))
            call.close()
            streams = per_thread_streams(server.grpc_url)
            try:
                loaded = threaded_loop(streams, requests, load.concurrency, load.duration_s, "clients")
            finally:
                streams.close()
        except BaseException:
            log(f"gpu-triton: the server's log ends:\n{server.log_tail()}")
            raise
        finally:
            server.stop()
    return {
        "profile": "gpu-triton" + ("-dry-run" if args.dry_run else ""),
        "description": __doc__.split("\n\n", 1)[1].replace("\n", " "),
        "notes": [f"served rows vs transformers (fp32, CPU) on {len(CHECK_TEXTS)} texts: min cosine {cosine:.6f}",
                  f"the encoder's device (/metrics): {device or 'not found'}"],
        "check": f"Each check text's row against transformers on the same weights: cosine >= {MIN_COSINE}.",
        "machine": machine, "model": {"name": "random-weight Qwen3 embedder, 64 wide (testing/qwen3_embedder.py)"},
        "targets": {"rose": {"label": "ours: `ensemble` (tokenizer + encoder) over gRPC streaming, tritonclient"}},
        "started": started, "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "cells": [sequential.entry({"rose": batch1}), load.entry({"rose": loaded})],
        "min_cosine": cosine, "device": device, "dry_run": args.dry_run,
        "ok": cosine >= MIN_COSINE and device.startswith("cpu" if args.dry_run else "cuda"),
    }
