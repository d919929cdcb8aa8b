"""`--profile gpu-budget`: what the scheduling settings buy bulk work and cost a waiting query, on one GPU.

The served path of `--profile gpu-served` (Endpoint, BatchingService, bf16, CUDA graphs, random-weight
Qwen3-Embedding-0.6B shape), once as it ships (`rose`: `max_batch_tokens=auto`) and once per variant
of VARIANTS: fixed budgets of 4096, 8192 and 16384 tokens; no batch work beside interactive work in a
step (`max_backfill_tokens=0`); one batch in flight instead of two (`max_inflight_batches=1`). Each
runs scenario 3's bulk load alone (batches of 100 texts of 512 tokens from 4 threads, the batch class
by size), then the same load with one interactive client sending single 128-token texts one after
another. `--dry-run`: tiny, on CPU."""
from __future__ import annotations

import datetime
import functools
import tempfile
import threading
import time

import numpy as np
import torch

from engine_lib.config import EncoderConfig
from engine_lib.service.build import build_endpoint

from .gpu import embed, model_record, save_random_qwen3, served_setup, token_requests
from .measure import latency_stats, log, threaded_loop
from .profiles import Cell
from .report import markdown  # noqa: F401 (the renderer of these profiles: the cells format)

VARIANTS = {  # target -> build_endpoint parameters over the shipped ones, per device
    "cuda": {**{f"budget-{n}": {"max_batch_tokens": str(n)} for n in (4096, 8192, 16384)},
             "no-backfill": {"max_backfill_tokens": "0"}, "one-in-flight": {"max_inflight_batches": "1"}},
    "cpu": {"budget-64": {"max_batch_tokens": "64"}, "one-in-flight": {"max_inflight_batches": "1"}},
}
FULL = dict(bulk_len=512, bulk_batch=100, clients=4, seconds=6.0, query_len=128)
DRY = dict(bulk_len=40, bulk_batch=8, clients=4, seconds=1.0, query_len=8)
ALONE, BESIDE, QUERY = "3 bulk alone", "bulk beside one interactive client", "the interactive client beside bulk"
QUERY_START_S = 0.5  # the interactive client starts once the bulk clients (0.2 s after the start) are sending


def cells(sizes: dict) -> tuple[Cell, Cell, Cell]:
    bulk = dict(mode="load", input="tokens", seq_len=sizes["bulk_len"], batch=sizes["bulk_batch"],
                concurrency=sizes["clients"], duration_s=sizes["seconds"], metric="embeddings_per_s")
    return (Cell(ALONE, "bulk", **bulk), Cell(BESIDE, "bulk-beside-query", **bulk),
            Cell(QUERY, "query-beside-bulk", "sequential", "tokens", sizes["query_len"], 1))


def bulk_and_queries(call, bulk, queries, sizes: dict) -> tuple[dict, dict]:
    """The bulk load in threads while this thread sends one query at a time until the bulk load ends."""
    box: dict = {}

    def run_bulk():
        try:
            box["bulk"] = threaded_loop(call, bulk, sizes["clients"], sizes["seconds"], "bulk")
        except Exception as exc:  # re-raised below
            box["error"] = exc

    thread = threading.Thread(target=run_bulk)
    thread.start()
    time.sleep(QUERY_START_S)
    latencies, i = [], 0
    while thread.is_alive():
        start = time.perf_counter()
        call(queries[i % len(queries)])
        latencies.append((time.perf_counter() - start) * 1e3)
        i += 1
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["bulk"], latency_stats(latencies)


def measure_budget(endpoint, sizes: dict, vocab: int) -> list[dict]:
    """[bulk alone, bulk beside the query client, the query client's latency] for one endpoint."""
    rng = np.random.default_rng(3)
    bulk = token_requests(rng, 4, sizes["bulk_batch"], sizes["bulk_len"], vocab)
    queries = token_requests(rng, 8, 1, sizes["query_len"], vocab)
    call = functools.partial(embed, endpoint)
    for request in (bulk[0], bulk[1], *queries[:3]):  # the buckets' eager run and capture
        call(request)
    try:
        alone = threaded_loop(call, bulk, sizes["clients"], sizes["seconds"], "bulk alone")
        beside, query = bulk_and_queries(call, bulk, queries, sizes)
    except Exception as exc:
        error = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        return [error, error, error]
    return [alone, beside, query]


def measure(args, out_json, machine: dict) -> dict:
    device, shape, params, extra = served_setup(args.dry_run, "gpu-budget")
    sizes = DRY if args.dry_run else FULL
    started = datetime.datetime.now().isoformat(timespec="seconds")
    params = {**params, "self_check": "off"}
    the_cells = cells(sizes)
    results: list[dict] = [{} for _ in the_cells]
    settings: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as folder:
        save_random_qwen3(shape, folder, device)  # only the saved weights are needed
        for name, overrides in (("rose", {}), *VARIANTS[device].items()):
            endpoint = build_endpoint(EncoderConfig.from_parameters({**params, "model_dir": folder, **overrides}),
                                      **extra)
            service = endpoint.service
            settings[name] = (f"max_batch_tokens {service.max_batch_tokens}, backfill {service.max_backfill_tokens}, "
                              f"{service.max_inflight_batches} in flight")
            try:
                for result, measured in zip(results, measure_budget(endpoint, sizes, shape["vocab_size"])):
                    result[name] = measured
            finally:
                endpoint.close(30)
            log(f"gpu-budget: {name} ({settings[name]}): "
                + "; ".join(f"{cell.key} {r[name].get('embeddings_per_s') or r[name].get('p50_ms') or r[name]}"
                            for cell, r in zip(the_cells, results)))
    return {
        "profile": "gpu-budget" + ("-dry-run" if args.dry_run else ""),
        "description": __doc__.split("\n\n", 1)[1].replace("\n", " "),
        "notes": ["`ours vs X` > 1: the shipped settings are better than X's on that cell"],
        "check": "No output check here: `--profile gpu-served` and the GPU tests check the served rows.",
        "machine": machine, "model": model_record(shape, args.dry_run),
        "targets": {name: {"label": ("as shipped: " if name == "rose" else "") + setting,
                           "versions": {"torch": torch.__version__}} for name, setting in settings.items()},
        "started": started, "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "cells": [cell.entry(result) for cell, result in zip(the_cells, results)],
        "settings": settings, "dry_run": args.dry_run,
        "ok": all("error" not in r for result in results for r in result.values()),
    }
