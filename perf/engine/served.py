"""`--profile gpu-served`: the served path on one GPU, Endpoint (BatchingService + a CUDA engine with graphs)
under concurrent load.

Random-weight Qwen3-Embedding-0.6B-shaped model (timing does not depend on weight
values), built with `build_endpoint` exactly as the Triton model builds it
(bf16, graphs auto, max_batch_tokens=auto, self-check on). Then:
1. correctness under concurrency: threads submit mixed-length requests at once;
   every row is checked against a float32 eager engine (cosine >= MIN_COSINE);
2. the seed's scenarios 1-3 through the Endpoint (pre-tokenized): batch 1 at
   128/512/4096 tokens sequential; 512 tokens at batch 5/25/50 sequential;
   batches of 100 at 512/1024/4096 tokens from 4 client threads;
3. bf16 vs fp32 (the self-check figure and the rows above), graph counters.
`--dry-run`: a tiny model on CPU with a capture stand-in, small sizes, to check the profile (CI).
"""
from __future__ import annotations

import datetime
import functools
import tempfile
import threading
import time

import numpy as np

from engine_lib.config import EncoderConfig
from engine_lib.contract import PackedBatch
from engine_lib.options import RequestOptions
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.runner.self_check import MIN_COSINE
from engine_lib.service.build import build_endpoint
from rose_wire import EMBEDDINGS

from ..machine import flops_per_token, gemm_flops
from ..measure import latency_loop, latency_stats, threaded_loop
from ..profiles import S1, S2, S3, Cell, select
from ..runner import log, min_cosine
from .common import (
    QWEN3_EMBEDDING_0_6B,
    TINY_QWEN3,
    model_record,
    rerun_capture,
    save_random_qwen3,
    token_request,
    token_requests,
)

FULL = dict(s1=(128, 512, 4096), s2_len=512, s2=(5, 25, 50), s3_batch=100, s3=(512, 1024, 4096), s3_seconds=6.0,
            iters=100, s2_iters=30, threads=8, per_thread=12, max_mixed=1024)
DRY = dict(s1=(8, 40), s2_len=40, s2=(2, 5), s3_batch=8, s3=(40, 100), s3_seconds=1.0,
           iters=3, s2_iters=2, threads=3, per_thread=3, max_mixed=100)
CHECK = ("Before the timings, threads submitted mixed-length requests at once and every row was checked against "
         f"a float32 eager engine (cosine >= {MIN_COSINE}; the notes give the figure). Timings include the "
         "Endpoint's queue and batching, no Triton.")


def cells(sizes: dict) -> tuple[Cell, ...]:
    return (*(Cell(S1, f"s1-len{n}", "sequential", "tokens", n, 1, num_requests=sizes["iters"]) for n in sizes["s1"]),
            *(Cell(S2, f"s2-batch{b}", "sequential", "tokens", sizes["s2_len"], b, num_requests=sizes["s2_iters"])
              for b in sizes["s2"]),
            *(Cell(S3, f"s3-len{n}", "load", "tokens", n, sizes["s3_batch"], 4, duration_s=sizes["s3_seconds"],
                   metric="embeddings_per_s") for n in sizes["s3"]))


def embed(endpoint, request, timeout: float = 120.0) -> np.ndarray:
    """One request through the Endpoint; blocks until answered (normalised rows)."""
    done, box = threading.Event(), {}

    def on_done(rows, error):
        box["rows"], box["error"] = rows, error
        done.set()

    endpoint.submit(request.input_ids, request.seq_lens, RequestOptions(), on_done)
    if not done.wait(timeout):
        raise TimeoutError("request not answered")
    if box["error"] is not None:
        raise box["error"]
    return box["rows"][EMBEDDINGS]


def concurrent_check(endpoint, reference: ModelRunner, sizes: dict, vocab: int) -> dict:
    """Threads submit mixed-length requests at once; every row vs the fp32 eager reference."""
    rng = np.random.default_rng(1)
    work = [[[rng.integers(0, vocab, size=int(n)) for n in rng.integers(1, sizes["max_mixed"], size=rng.integers(1, 7))]
             for _ in range(sizes["per_thread"])] for _ in range(sizes["threads"])]
    expected = [[reference.step(PackedBatch.from_sequences(request)).wait() for request in thread] for thread in work]
    results: list[list] = [[] for _ in work]
    barrier = threading.Barrier(len(work))

    def client(i):
        barrier.wait()
        for request in work[i]:
            try:
                results[i].append(embed(endpoint, token_request(request)))
            except Exception as exc:  # recorded, reported, fails the check
                results[i].append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [repr(r) for thread in results for r in thread if isinstance(r, Exception)]
    cosines = [min_cosine(r, e) for thread, exp in zip(results, expected) for r, e in zip(thread, exp)
               if not isinstance(r, Exception)]
    worst = min(cosines) if cosines else float("nan")
    return {"requests": sum(map(len, work)), "rows": int(sum(len(r) for t in work for r in t)), "errors": errors,
            "min_cosine_vs_fp32": worst, "ok": not errors and worst >= MIN_COSINE}


def time_cell(endpoint, cell: Cell, vocab: int) -> dict:
    call = functools.partial(embed, endpoint)
    rng = np.random.default_rng(2)
    if cell.mode == "sequential":
        requests = token_requests(rng, 8 if cell.batch == 1 else 4, cell.batch, cell.seq_len, vocab)
        for request in requests[:3]:  # warm-up: eager, capture, replay of the bucket
            call(request)
        return latency_stats(latency_loop(call, requests, cell.num_requests, cell.max_seconds, cell.key))
    requests = token_requests(rng, 4, cell.batch, cell.seq_len, vocab)
    call(requests[0])
    return threaded_loop(call, requests, cell.concurrency, cell.duration_s, cell.key)


def measure(args, out_json, machine: dict) -> dict:
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu-served: no CUDA device (use --dry-run on CPU)")
    device, sizes = ("cpu", DRY) if args.dry_run else ("cuda", FULL)
    shape = TINY_QWEN3 if args.dry_run else QWEN3_EMBEDDING_0_6B
    started = datetime.datetime.now().isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory() as folder:
        save_random_qwen3(shape, folder, device)  # the HF model it returns is not needed
        reference = ModelRunner(folder, device=device, dtype="float32", cuda_graphs="off")
        params = {"model_dir": folder, "device": device, "dtype": "float32" if args.dry_run else "bfloat16",
                  "max_batch_tokens": "auto", "max_queued_tokens": str(4 << 20)}
        extra = {}
        if args.dry_run:  # graphs on CPU through the capture stand-in
            params.update(attention_backend="masked", cuda_graphs="on")
            extra = {"graph_capture": rerun_capture}
        load_start = time.perf_counter()
        endpoint = build_endpoint(EncoderConfig.from_parameters(params), **extra)
        load_seconds = time.perf_counter() - load_start
    engine = endpoint.service.engine
    log(f"gpu-served: loaded in {load_seconds:.1f} s: {engine.dtype}, backend {engine.backend.name}, graphs "
        f"{engine.graphs is not None}, max_batch_tokens {endpoint.service.max_batch_tokens}, self-check cosine "
        f"{engine.self_check_cosine:.6f}")
    entries = []
    try:
        concurrency = concurrent_check(endpoint, reference, sizes, shape["vocab_size"])
        log(f"gpu-served: concurrency check {concurrency}"[:400])
        for cell in select(cells(sizes), args.cells, args.scale):
            if cell.seq_len > engine.max_positions:
                continue
            result = time_cell(endpoint, cell, shape["vocab_size"])
            entries.append(cell.entry({"rose": {**result, "mean_tokens_per_text": float(cell.seq_len)}}))
            log(f"  {cell.key}: p50 {result['p50_ms']:.2f} ms, {result.get('embeddings_per_s', 0):.1f} emb/s")
    finally:
        endpoint.close(30)
    stats = vars(engine.stats)
    ceiling = None if args.no_gemm else gemm_flops(1.0 if args.dry_run else 3.0)
    for entry in entries:
        rose = entry["results"]["rose"]
        if ceiling and entry["mode"] == "load":
            flops = rose["embeddings_per_s"] * entry["seq_len"] * flops_per_token(
                {**shape, "model_type": "qwen3"}, entry["seq_len"])
            rose["model_flops_fraction_of_gemm"] = flops / ceiling["flops_per_s"]
    graphs_ok = engine.graphs is not None and stats["replays"] > 0 and stats["capture_failures"] == 0
    return {
        "profile": "gpu-served" + ("-dry-run" if args.dry_run else ""),
        "description": "The served path (Endpoint over BatchingService, CUDA graphs, max_batch_tokens=auto) on a "
                       "random-weight Qwen3-Embedding-0.6B-shaped model; pre-tokenized requests.",
        "notes": [f"dtype {engine.dtype}, attention {engine.backend.name}, max_batch_tokens=auto -> "
                  f"{endpoint.service.max_batch_tokens}; load (incl. self-check and budget) {load_seconds:.1f} s",
                  f"self-check ({engine.dtype} vs float32, built-in probes): min cosine {engine.self_check_cosine:.6f}",
                  f"concurrent mixed-length check: {concurrency['requests']} requests from {sizes['threads']} threads, "
                  f"min cosine vs fp32 eager {concurrency['min_cosine_vs_fp32']:.6f}, errors "
                  f"{len(concurrency['errors'])}",
                  f"graph counters: {stats}"],
        "check": CHECK, "machine": machine,
        "model": model_record(shape, args.dry_run),
        "gemm_ceiling": ceiling,
        "targets": {"rose": {"label": "ours: Endpoint + BatchingService + ModelRunner in-process (no Triton)",
                             "versions": {"torch": torch.__version__, "cuda": torch.version.cuda}}},
        "started": started, "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "cells": entries, "self_check_cosine": engine.self_check_cosine, "concurrency": concurrency,
        "graph_stats": stats, "max_batch_tokens": endpoint.service.max_batch_tokens, "dry_run": args.dry_run,
        "ok": concurrency["ok"] and engine.self_check_cosine >= MIN_COSINE and graphs_ok,
    }
