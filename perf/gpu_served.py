"""The served path on one GPU: Endpoint (BatchingService + a CUDA engine with graphs) under concurrent load.

Random-weight Qwen3-Embedding-0.6B-shaped model (timing does not depend on weight
values), built with `build_endpoint` exactly as the Triton model builds it
(bf16, graphs auto, max_batch_tokens=auto, self-check on). Then:
1. correctness under concurrency: threads submit mixed-length requests at once;
   every row is checked against a float32 eager engine (cosine >= 0.999);
2. the seed's scenarios 1-3 through the Endpoint (pre-tokenized): batch 1 at
   128/512/4096 tokens sequential; 512 tokens at batch 5/25/50 sequential;
   batches of 100 at 512/1024/4096 tokens from 4 client threads;
3. bf16 vs fp32 (the self-check figure and the rows above), graph counters.
Writes the benchmark harness's JSON (+ markdown) to --out. `--dry-run`: a tiny
model on CPU with a capture stand-in, small sizes, to check the script (CI).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from engine_lib.config import EncoderConfig
from engine_lib.contract import PackedBatch
from engine_lib.options import RequestOptions
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.runner.self_check import MIN_COSINE
from engine_lib.service.build import build_endpoint
from perf import report
from perf.engine_bench import flops_per_token
from perf.gpu_latency import QWEN3_EMBEDDING_0_6B, TINY, build_model_folder, rerun_capture
from perf.machine import describe, gemm_flops
from perf.measure import latency_stats

FULL = dict(s1=(128, 512, 4096), s2_len=512, s2=(5, 25, 50), s3_batch=100, s3=(512, 1024, 4096), s3_seconds=6.0,
            iters=100, s2_iters=30, threads=8, per_thread=12, max_mixed=1024)
DRY = dict(s1=(8, 40), s2_len=40, s2=(2, 5), s3_batch=8, s3=(40, 100), s3_seconds=1.0,
           iters=3, s2_iters=2, threads=3, per_thread=3, max_mixed=100)


def embed(encoder, sequences: list[np.ndarray], timeout: float = 120.0) -> np.ndarray:
    """One request through the Endpoint; blocks until answered (normalised rows)."""
    done, box = threading.Event(), {}

    def on_done(rows, error):
        box["rows"], box["error"] = rows, error
        done.set()

    ids = np.concatenate(sequences).astype(np.int64)
    lens = np.array([len(s) for s in sequences], dtype=np.int64)
    encoder.submit(ids, lens, RequestOptions(), on_done)
    if not done.wait(timeout):
        raise TimeoutError("request not answered")
    if box["error"] is not None:
        raise box["error"]
    return box["rows"]


def reference_rows(engine: ModelRunner, sequences: list[np.ndarray]) -> np.ndarray:
    rows = engine.step(PackedBatch.from_sequences(sequences)).wait()
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def min_cosine(rows: np.ndarray, expected: np.ndarray) -> float:
    return float(np.min(np.sum(rows.astype(np.float64) * expected, axis=1)))


def concurrent_check(encoder, reference: ModelRunner, sizes: dict, vocab: int) -> dict:
    """Threads submit mixed-length requests at once; every row vs the fp32 eager reference."""
    rng = np.random.default_rng(1)
    work = [[[rng.integers(0, vocab, size=int(n)) for n in rng.integers(1, sizes["max_mixed"], size=rng.integers(1, 7))]
             for _ in range(sizes["per_thread"])] for _ in range(sizes["threads"])]
    expected = [[reference_rows(reference, request) for request in thread] for thread in work]
    results: list[list] = [[] for _ in work]
    barrier = threading.Barrier(len(work))

    def client(i):
        barrier.wait()
        for request in work[i]:
            try:
                results[i].append(embed(encoder, request))
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


def sequential(encoder, requests: list, iters: int) -> dict:
    for request in requests[:3]:  # warm-up: eager, capture, replay of the bucket
        embed(encoder, request)
    samples = []
    for i in range(iters):
        start = time.perf_counter()
        embed(encoder, requests[i % len(requests)])
        samples.append((time.perf_counter() - start) * 1e3)
    return latency_stats(samples)


def throughput(encoder, requests: list, clients: int, seconds: float) -> dict:
    embed(encoder, requests[0])
    counts, latencies, stop = [0] * clients, [], time.monotonic() + seconds

    def client(i):
        j = i
        while time.monotonic() < stop:
            start = time.perf_counter()
            embed(encoder, requests[j % len(requests)])
            latencies.append((time.perf_counter() - start) * 1e3)
            counts[i] += len(requests[j % len(requests)])
            j += clients

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {**latency_stats(latencies), "embeddings_per_s": sum(counts) / (time.perf_counter() - started)}


def scenario_cells(encoder, sizes: dict, vocab: int, max_len: int) -> list[dict]:
    rng = np.random.default_rng(2)
    seqs = lambda n, length: [rng.integers(0, vocab, size=length) for _ in range(n)]
    cells = []

    def cell(scenario, key, mode, seq_len, batch, concurrency, metric, result):
        cells.append({"scenario": scenario, "key": key, "mode": mode, "input": "tokens", "seq_len": seq_len,
                      "batch": batch, "concurrency": concurrency, "metric": metric,
                      "label": f"tokens len {seq_len}, batch {batch}" + (f", {concurrency} clients" if mode == "load"
                                                                           else ""),
                      "results": {"rose": {**result, "mean_tokens_per_text": float(seq_len)}}})
        print(f"[served] {key}: " + ", ".join(f"{k} {v:.2f}" for k, v in result.items()
                                              if isinstance(v, float)), flush=True)

    for length in (n for n in sizes["s1"] if n <= max_len):
        result = sequential(encoder, [seqs(1, length) for _ in range(8)], sizes["iters"])
        cell("1 low-latency embedding", f"s1-len{length}", "sequential", length, 1, 1, "p50_ms", result)
    for batch in sizes["s2"]:
        result = sequential(encoder, [seqs(batch, sizes["s2_len"]) for _ in range(4)], sizes["s2_iters"])
        cell("2 low-latency scoring", f"s2-batch{batch}", "sequential", sizes["s2_len"], batch, 1, "p50_ms", result)
    for length in (n for n in sizes["s3"] if n <= max_len):
        result = throughput(encoder, [seqs(sizes["s3_batch"], length) for _ in range(4)], 4, sizes["s3_seconds"])
        cell("3 high-throughput embedding", f"s3-len{length}", "load", length, sizes["s3_batch"], 4,
             "embeddings_per_s", result)
    return cells


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_served: no CUDA device (use --dry-run on CPU)", file=sys.stderr)
        return 2
    device, sizes = ("cpu", DRY) if args.dry_run else ("cuda", FULL)
    shape = TINY if args.dry_run else QWEN3_EMBEDDING_0_6B
    started = datetime.datetime.now().isoformat(timespec="seconds")
    machine = {**describe(), "load_avg_at_start": list(os.getloadavg())}
    with tempfile.TemporaryDirectory() as folder:
        build_model_folder(shape, folder, torch.device(device))  # the HF model it returns is not needed
        reference = ModelRunner(folder, device=device, dtype="float32", cuda_graphs="off")
        params = {"model_dir": folder, "device": device, "dtype": "float32" if args.dry_run else "bfloat16",
                  "max_batch_tokens": "auto", "max_queued_tokens": str(4 << 20)}
        extra = {}
        if args.dry_run:  # graphs on CPU through the capture stand-in
            params.update(attention_backend="masked", cuda_graphs="on")
            extra = {"graph_capture": rerun_capture}
        load_start = time.perf_counter()
        encoder = build_endpoint(EncoderConfig.from_parameters(params), **extra)
        load_seconds = time.perf_counter() - load_start
    engine = encoder.service.engine
    print(f"[served] loaded in {load_seconds:.1f} s: {engine.dtype}, backend {engine.backend.name}, graphs "
          f"{engine.graphs is not None}, max_batch_tokens {encoder.service.max_batch_tokens}, self-check cosine "
          f"{engine.self_check_cosine:.6f}", flush=True)
    try:
        concurrency = concurrent_check(encoder, reference, sizes, shape["vocab_size"])
        print(f"[served] concurrency: {json.dumps(concurrency)[:400]}", flush=True)
        cells = scenario_cells(encoder, sizes, shape["vocab_size"], engine.max_positions)
    finally:
        encoder.close(30)
    stats = vars(engine.stats)
    ceiling = gemm_flops(1.0 if args.dry_run else 3.0)
    for cell in cells:
        rose = cell["results"]["rose"]
        if "embeddings_per_s" in rose and cell["mode"] == "load":
            flops = rose["embeddings_per_s"] * cell["seq_len"] * flops_per_token(
                {**shape, "model_type": "qwen3"}, cell["seq_len"])
            rose["model_flops_fraction_of_gemm"] = flops / ceiling["flops_per_s"]
    graphs_ok = engine.graphs is not None and stats["replays"] > 0 and stats["capture_failures"] == 0
    results = {
        "profile": "gpu-served" + ("-dry-run" if args.dry_run else ""),
        "description": "The served path (Endpoint over BatchingService, CUDA graphs, max_batch_tokens=auto) on a "
                       "random-weight Qwen3-Embedding-0.6B-shaped model; pre-tokenized requests.",
        "notes": [f"dtype {engine.dtype}, attention {engine.backend.name}, max_batch_tokens=auto -> "
                  f"{encoder.service.max_batch_tokens}; load (incl. self-check and budget) {load_seconds:.1f} s",
                  f"self-check ({engine.dtype} vs float32, built-in probes): min cosine {engine.self_check_cosine:.6f}",
                  f"concurrent mixed-length check: {concurrency['requests']} requests from {sizes['threads']} threads, "
                  f"min cosine vs fp32 eager {concurrency['min_cosine_vs_fp32']:.6f}, errors "
                  f"{len(concurrency['errors'])}",
                  f"graph counters: {stats}"],
        "machine": {**machine, "load_avg_at_end": list(os.getloadavg()),
                    "git_commit": os.environ.get("GIT_COMMIT") or machine["git_commit"]},
        "model": {"name": "random Qwen3-Embedding-0.6B shape" if not args.dry_run else "random tiny Qwen3",
                  "config": {k: shape[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                   "num_attention_heads")}},
        "gemm_ceiling": ceiling,
        "targets": {"rose": {"label": "ours: Endpoint + BatchingService + ModelRunner in-process (no Triton)",
                             "versions": {"torch": torch.__version__}}},
        "started": started, "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "cells": cells, "self_check_cosine": engine.self_check_cosine, "concurrency": concurrency,
        "graph_stats": stats, "max_batch_tokens": encoder.service.max_batch_tokens, "dry_run": args.dry_run,
        "ok": concurrency["ok"] and engine.self_check_cosine >= MIN_COSINE and graphs_ok,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_served.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "gpu_served.md").write_text(report.markdown(results))
    print(f"[served] wrote {args.out / 'gpu_served.json'}; ok: {results['ok']}", flush=True)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
