"""`--profile gpu-latency`: the seed's low-latency embedding scenario on one GPU, engine only:
ROSE with graphs (`rose`) vs ROSE eager vs HF transformers.

Random-weight Qwen3-Embedding-0.6B-shaped model (timing does not depend on
weight values; results are labelled random-weight). Pre-tokenized, batch 1,
strictly sequential; each timed run includes the host->device copy of the ids
and the device->host copy of the pooled row. Warm-up first checks every
system's output against an fp32 reference (cosine >= MIN_COSINE).
`--dry-run` does all of it at a tiny size on CPU, one step each (graphs via
a capture stand-in that re-runs the step), to check the profile itself.
"""
from __future__ import annotations

import datetime
import json
import tempfile

import numpy as np

from engine_lib.contract import PackedBatch
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.runner.self_check import MIN_COSINE

from ..measure import latency_loop, latency_stats
from ..profiles import S1, Cell, select
from ..runner import log, min_cosine
from .common import QWEN3_EMBEDDING_0_6B, TINY_QWEN3, model_record, rerun_capture, save_random_qwen3

LENGTHS, ITERS, WARMUP = (128, 512, 4096), 200, 5  # warm-up >= 3: eager, capture, replay; timed runs are replays
DRY_LENGTHS, DRY_ITERS, DRY_WARMUP = (8, 40), 1, 3
OURS = ("rose", "rose-eager")  # judged by the cosine check; the peers' figures are only reported
LABELS = {"rose": "ours: ModelRunner.step with CUDA graphs", "rose-eager": "ours: ModelRunner.step, eager",
          "hf-transformers": "HF transformers Qwen3Model forward, last token"}


def cells(lengths, iters: int) -> tuple[Cell, ...]:
    return tuple(Cell(S1, f"s1-len{n}", "sequential", "tokens", n, 1, num_requests=iters) for n in lengths)


def graph_engine(folder: str, max_tokens: int, common: dict, options: dict) -> ModelRunner:
    """Graphs with the auto backend, or with `masked` where the auto one cannot be captured."""
    try:
        return ModelRunner(folder, cuda_graphs="on", max_graph_tokens=max_tokens, **common, **options)
    except ValueError as exc:
        log(f"gpu-latency: {exc}; graphs use attention_backend=masked")
        return ModelRunner(folder, cuda_graphs="on", max_graph_tokens=max_tokens, attention_backend="masked", **common)


def hf_embed(model, device):
    """HF transformers baseline: ids to the device, forward, last token, back to the host."""
    import torch

    @torch.inference_mode()
    def embed(ids: np.ndarray) -> np.ndarray:
        hidden = model(input_ids=torch.from_numpy(ids)[None].to(device)).last_hidden_state
        return hidden[0, -1:].float().cpu().numpy()
    return embed


def engine_embed(engine: ModelRunner):
    def embed(ids: np.ndarray) -> np.ndarray:
        return engine.step(PackedBatch.from_sequences([ids])).wait()
    return embed


def time_cell(cell: Cell, systems: dict, ids: np.ndarray, expected: np.ndarray, warmup: int, sync) -> dict:
    results = {}
    for name, embed in systems.items():
        worst = min(min_cosine(embed(ids), expected) for _ in range(warmup))
        sync()
        samples = latency_loop(embed, [ids], cell.num_requests, cell.max_seconds, f"{cell.key} {name}")
        results[name] = {**latency_stats(samples), "min_cosine": worst, "mean_tokens_per_text": float(cell.seq_len)}
        log(f"  {name:>15} {cell.seq_len:>5} tokens: p50 {results[name]['p50_ms']:.3f} ms "
            f"p99 {results[name]['p99_ms']:.3f} ms  cosine {worst:.6f}")
    return results


def measure(args, out_json, machine: dict) -> dict:
    import torch

    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu-latency: no CUDA device (use --dry-run on CPU)")
    shape = TINY_QWEN3 if args.dry_run else QWEN3_EMBEDDING_0_6B
    warmup = DRY_WARMUP if args.dry_run else WARMUP
    chosen = select(cells(DRY_LENGTHS, DRY_ITERS) if args.dry_run else cells(LENGTHS, ITERS), args.cells,
                    args.scale)
    rng = np.random.default_rng(0)
    inputs = {c.key: rng.integers(0, shape["vocab_size"], size=c.seq_len).astype(np.int64) for c in chosen}
    started = datetime.datetime.now().isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory() as folder:
        model = save_random_qwen3(shape, folder, device.type)
        reference = hf_embed(model, device)  # fp32 transformers: the accuracy reference
        expected = {key: reference(ids) for key, ids in inputs.items()}
        hf_model = model.to(torch.float32 if args.dry_run else torch.bfloat16)
        common = dict(device=device.type, dtype="float32" if args.dry_run else "bfloat16")
        graph_options = dict(attention_backend="masked", graph_capture=rerun_capture) if args.dry_run else {}
        common["self_check"] = False  # the warm-up checks every system against fp32 transformers instead
        eager = ModelRunner(folder, cuda_graphs="off", **common)
        graphs = graph_engine(folder, max([4096, *(c.seq_len for c in chosen)]), common, graph_options)
    systems = {"rose": engine_embed(graphs), "rose-eager": engine_embed(eager),
               "hf-transformers": hf_embed(hf_model, device)}
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    entries = []
    for cell in chosen:  # each finished cell is on disk at once: a run cut short keeps what it measured
        entries.append(cell.entry(time_cell(cell, systems, inputs[cell.key], expected[cell.key], warmup, sync)))
        out_json.write_text(json.dumps({"profile": "gpu-latency", "partial": True, "machine": machine,
                                        "cells": entries}, indent=1))
    worst = {name: min(e["results"][name]["min_cosine"] for e in entries) for name in systems}
    return {
        "profile": "gpu-latency" + ("-dry-run" if args.dry_run else ""),
        "description": "The seed's low-latency embedding scenario, engine only: pre-tokenized, batch 1, strictly "
                       "sequential, on a random-weight Qwen3-Embedding-0.6B-shaped model.",
        "notes": [f"dtype {common['dtype']}; attention {eager.backend.name} (eager), {graphs.backend.name} (graphs); "
                  f"graph counters {vars(graphs.stats)}",
                  "min warm-up cosine vs fp32 transformers: " + ", ".join(f"{n} {c:.6f}" for n, c in worst.items()),
                  f"{warmup} warm-up runs per system and length, then timed runs"],
        "check": (f"Every system's warm-up output was checked against fp32 transformers; ours must reach cosine >= "
                  f"{MIN_COSINE} (a failed check still times the cell and fails the run); bf16 transformers' own "
                  "figure is reported, not judged."),
        "machine": machine,
        "model": model_record(shape, args.dry_run),
        "targets": {name: {"label": LABELS[name], "versions": {"torch": torch.__version__, "cuda": torch.version.cuda}}
                    for name in systems},
        "started": started, "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "cells": entries, "graph_stats": vars(graphs.stats), "dry_run": args.dry_run,
        "ok": all(worst[name] >= MIN_COSINE for name in OURS),
    }
