"""`--profile gpu-served`: the served path (Endpoint, BatchingService, CUDA graphs) in-process on one GPU, on a
random-weight Qwen3-Embedding-0.6B-shaped model (docs/benchmarks.md), against transformers' own Qwen3Model on
padded batches in the same dtype (the off-the-shelf peer), after an output check of both against the float32
model; `--dry-run`: tiny, on CPU."""
from __future__ import annotations

import copy
import datetime
import functools
import tempfile
import threading
import time

import numpy as np
import torch
import transformers
from transformers import Qwen3Config, Qwen3Model

from engine_lib.config import EncoderConfig
from engine_lib.contract import RaggedTokens
from engine_lib.options import RequestOptions
from engine_lib.runner.self_check import MIN_COSINE
from engine_lib.service.build import build_endpoint
from rose_wire import EMBEDDINGS

from .measure import latency_loop, latency_stats, log, min_cosine, threaded_loop
from .profiles import S1, S2, S3, Cell, select
from .report import markdown  # noqa: F401 (the renderer of these profiles: the cells format)
from .texts import Request

QWEN3_EMBEDDING_0_6B = dict(vocab_size=151669, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                            num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                            max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                            tie_word_embeddings=True)
TINY_QWEN3 = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=128, max_position_embeddings=1024, rms_norm_eps=1e-6,
                  rope_theta=10000.0)


def save_random_qwen3(shape: dict, folder: str, device: str = "cpu"):
    """Random Qwen3 weights (seed 0, initialised on `device`) saved as safetensors; returns the fp32 HF model.
    Timing does not depend on weight values; results say random-weight."""
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3Model(Qwen3Config(**shape)).eval()
    model.save_pretrained(folder)
    return model


def model_record(shape: dict, dry_run: bool) -> dict:
    """The results' `model` entry for a random-weight Qwen3 of `shape`."""
    return {"name": "random tiny Qwen3" if dry_run else "random Qwen3-Embedding-0.6B shape",
            "config": {k: shape[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                             "num_attention_heads")}}


def rerun_capture(fn):
    """CPU stand-in for CUDA graph capture: replay re-runs the step over the static buffers."""
    output = fn()
    return (lambda: output.copy_(fn())), output


def token_request(sequences) -> Request:
    """Pre-tokenized sequences as the harness's request (no texts)."""
    return Request([], np.concatenate(sequences).astype(np.int64),
                   np.array([len(s) for s in sequences], dtype=np.int64))


def token_requests(rng, num_requests: int, batch: int, length: int, vocab_size: int) -> list[Request]:
    """`num_requests` requests of `batch` random sequences of `length` token ids."""
    return [token_request([rng.integers(0, vocab_size, size=length) for _ in range(batch)])
            for _ in range(num_requests)]


FULL = dict(s1=(128, 512, 4096), s2_len=512, s2=(5, 25, 50), s3_batch=100, s3=(512, 1024, 4096), s3_seconds=6.0,
            iters=100, s2_iters=30)
DRY = dict(s1=(8, 40), s2_len=40, s2=(2, 5), s3_batch=8, s3=(40, 100), s3_seconds=1.0,
           iters=3, s2_iters=2)
CHECK_LENGTHS = (1, 17, 128, 300, 64, 512, 5)  # mixed lengths, a 1-token sequence among them
CHECK_RUNS = 3  # eager, capture, replay of the check batch's bucket
CHECK = (f"Output check before timing: the check batch (lengths {list(CHECK_LENGTHS)}) through the served path "
         f"{CHECK_RUNS} times (eager, graph capture, replay) and through the peer, each row against the float32 "
         f"model's (transformers, last-token pooling): cosine >= {MIN_COSINE} for ours; the GPU tests check "
         f"batched == alone and graphs == eager.")
PEER, EAGER = "hf", "rose-eager"


class PaddedPeer:
    """transformers' Qwen3Model as users run it off the shelf: a padded batch with an attention mask (right
    padding, so the causal last token sees no padding), last-token pooling, L2-normalised."""

    def __init__(self, model, dtype: torch.dtype, device: str):
        self.model, self.device = model.to(dtype).eval(), device
        self._one_at_a_time = threading.Lock()  # as a single-worker server runs it (4 at once ran out of memory)

    def __call__(self, request: Request) -> np.ndarray:
        with self._one_at_a_time:
            return self._rows(request)

    def _rows(self, request: Request) -> np.ndarray:
        lengths = request.seq_lens
        ids = np.zeros((len(lengths), int(lengths.max())), dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, sequence in enumerate(np.split(request.input_ids, np.cumsum(lengths)[:-1])):
            ids[i, :len(sequence)], mask[i, :len(sequence)] = sequence, 1
        with torch.inference_mode():
            hidden = self.model(input_ids=torch.from_numpy(ids).to(self.device),
                                attention_mask=torch.from_numpy(mask).to(self.device)).last_hidden_state
            last = hidden[torch.arange(len(lengths), device=self.device),
                          torch.from_numpy(lengths - 1).to(self.device)]
            return torch.nn.functional.normalize(last.float(), dim=-1).cpu().numpy()


def output_check(endpoint, peer: PaddedPeer, reference: PaddedPeer, vocab: int, max_positions: int) -> dict:
    """Min cosine per text of each served run and of the peer against the float32 model, on one mixed batch."""
    lengths = [n for n in CHECK_LENGTHS if n <= max_positions]
    rng = np.random.default_rng(1)
    request = token_request([rng.integers(0, vocab, size=n) for n in lengths])
    expected = reference(request)
    served = [min_cosine(embed(endpoint, request), expected) for _ in range(CHECK_RUNS)]
    return {"lengths": lengths, "served_min_cosine": served, "peer_min_cosine": min_cosine(peer(request), expected),
            "ok": min(served) >= MIN_COSINE}


def served_cells(sizes: dict) -> tuple[Cell, ...]:
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

    endpoint.submit(RaggedTokens(request.input_ids, request.seq_lens, options=RequestOptions()), on_done)
    if not done.wait(timeout):
        raise TimeoutError("request not answered")
    if box["error"] is not None:
        raise box["error"]
    return box["rows"][EMBEDDINGS]


def time_cell(call, cell: Cell, vocab: int) -> dict:
    """One cell for one target: `call(request)` answers a request (blocking)."""
    rng = np.random.default_rng(2)
    if cell.mode == "sequential":
        requests = token_requests(rng, 8 if cell.batch == 1 else 4, cell.batch, cell.seq_len, vocab)
        for request in requests[:3]:  # warm-up: eager, capture, replay of the bucket
            call(request)
        return latency_stats(latency_loop(call, requests, cell.num_requests, cell.max_seconds, cell.key))
    requests = token_requests(rng, 4, cell.batch, cell.seq_len, vocab)
    call(requests[0])
    return threaded_loop(call, requests, cell.concurrency, cell.duration_s, cell.key)


def guarded_time_cell(call, cell: Cell, vocab: int, device: str) -> dict:
    """time_cell's result, or {"error": ...} (the report shows the cell as failed; the sweep goes on)."""
    try:
        return {**time_cell(call, cell, vocab), "mean_tokens_per_text": float(cell.seq_len)}
    except Exception as exc:
        if device == "cuda":
            torch.cuda.empty_cache()
        return {"error": f"{type(exc).__name__}: {exc}"[:400]}


def served_setup(dry_run: bool, profile: str) -> tuple[str, dict, dict, dict]:
    """(device, model shape, build_endpoint parameters, engine options) of the GPU profiles: the
    Qwen3-Embedding-0.6B shape in bf16 with graphs on the GPU; a dry run: a tiny Qwen3 in float32 on
    the CPU, graphs through the capture stand-in."""
    if not dry_run and not torch.cuda.is_available():
        raise SystemExit(f"{profile}: no CUDA device (use --dry-run on CPU)")
    params = {"max_queued_tokens": str(4 << 20)}
    if not dry_run:
        return "cuda", QWEN3_EMBEDDING_0_6B, {**params, "device": "cuda", "dtype": "bfloat16"}, {}
    return ("cpu", TINY_QWEN3, {**params, "device": "cpu", "dtype": "float32", "attention_backend": "masked",
                                "cuda_graphs": "on"}, {"graph_capture": rerun_capture})


def measure(args, out_json, machine: dict) -> dict:
    device, shape, params, extra = served_setup(args.dry_run, "gpu-served")
    sizes = DRY if args.dry_run else FULL
    started = datetime.datetime.now().isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory() as folder:  # read while the endpoints load
        fp32_model = save_random_qwen3(shape, folder, device)
        params = {**params, "model_dir": folder, "max_batch_tokens": "auto"}
        load_start = time.perf_counter()
        endpoint = build_endpoint(EncoderConfig.from_parameters(params), **extra)
        load_seconds = time.perf_counter() - load_start
        # The same engine without graphs, same budget, for the sequential cells: what graph replay buys.
        eager = build_endpoint(EncoderConfig.from_parameters(
            {**params, "cuda_graphs": "off", "self_check": "off",
             "max_batch_tokens": str(endpoint.service.max_batch_tokens)}))
    engine = endpoint.service.engine
    reference = PaddedPeer(fp32_model, torch.float32, device)
    peer = PaddedPeer(copy.deepcopy(fp32_model), engine.dtype, device)
    log(f"gpu-served: loaded in {load_seconds:.1f} s: {engine.dtype}, backend {engine.backend.name}, graphs "
        f"{engine.graphs is not None}, max_batch_tokens {endpoint.service.max_batch_tokens}, self-check cosine "
        f"{engine.self_check_cosine:.6f}")
    entries, vocab = [], shape["vocab_size"]
    try:
        check = output_check(endpoint, peer, reference, vocab, engine.max_positions)
        del reference, fp32_model
        log(f"gpu-served: output check {check}")
        for cell in select(served_cells(sizes), args.cells, args.scale):
            if cell.seq_len > engine.max_positions:
                continue
            results, targets = {}, [("rose", endpoint), (PEER, peer)]
            if cell.mode == "sequential":
                targets.append((EAGER, eager))
            for name, target in targets:
                call = target if target is peer else functools.partial(embed, target)
                results[name] = result = guarded_time_cell(call, cell, vocab, device)
                log(f"  {cell.key} {name}: {result}")
            entries.append(cell.entry(results))
    finally:
        endpoint.close(30)
        eager.close(30)
    stats = vars(engine.stats)
    graphs_ok = engine.graphs is not None and stats["replays"] > 0 and stats["capture_failures"] == 0
    return {
        "profile": "gpu-served" + ("-dry-run" if args.dry_run else ""),
        "description": "The served path (Endpoint over BatchingService, CUDA graphs, max_batch_tokens=auto) on a "
                       "random-weight Qwen3-Embedding-0.6B-shaped model; pre-tokenized requests.",
        "notes": [f"dtype {engine.dtype}, attention {engine.backend.name}, max_batch_tokens=auto -> "
                  f"{endpoint.service.max_batch_tokens}; load (incl. self-check and budget) {load_seconds:.1f} s",
                  f"self-check ({engine.dtype} vs float32, built-in probes): min cosine {engine.self_check_cosine:.6f}",
                  f"output check (min cosine per text vs float32): served {check['served_min_cosine']}, "
                  f"peer {check['peer_min_cosine']:.6f}",
                  f"graph counters: {stats}"],
        "check": CHECK, "machine": machine,
        "model": model_record(shape, args.dry_run),
        "targets": {"rose": {"label": "ours: Endpoint + BatchingService + ModelRunner in-process (no Triton)",
                             "versions": {"torch": torch.__version__, "cuda": torch.version.cuda}},
                    PEER: {"label": f"transformers Qwen3Model, {engine.dtype}, padded batches "
                                    f"(attention {peer.model.config._attn_implementation}), last-token pooling",
                           "versions": {"transformers": transformers.__version__}},
                    EAGER: {"label": "ours without CUDA graphs (sequential cells): what graph replay buys",
                            "versions": {}}},
        "started": started, "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "cells": entries, "self_check_cosine": engine.self_check_cosine,
        "graph_stats": stats, "max_batch_tokens": endpoint.service.max_batch_tokens, "dry_run": args.dry_run,
        "output_check": check,
        "ok": engine.self_check_cosine >= MIN_COSINE and graphs_ok and check["ok"],
    }
