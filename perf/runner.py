"""Run a profile: same requests for every target, warm-up checked against the reference, then timed."""
from __future__ import annotations

import datetime
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from engine_lib.runner.self_check import MIN_COSINE

from .machine import wait_until_quiet
from .measure import latency_stats
from .profiles import Cell, Profile
from .scoring import MAX_SCORE_DIFF, check_scores
from .texts import TextMaker


def log(message: str) -> None:
    print(f"[perf] {message}", file=sys.stderr, flush=True)


class Reference:
    """sentence-transformers on the same weights: what every response is checked against."""

    def __init__(self, model_dir: str, max_positions: int):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model_dir)  # fp32, CUDA where there is one
        self.text_max = self.model.max_seq_length
        self.max_positions = max_positions

    def embed(self, cell: Cell, request) -> np.ndarray:
        # Token cells send ids up to the model's positions; text cells are truncated like the server does.
        self.model.max_seq_length = self.max_positions if cell.input == "tokens" else self.text_max
        return self.model.encode(request.texts, batch_size=len(request.texts), normalize_embeddings=True)


def min_cosine(got: np.ndarray, want: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape:
        raise ValueError(f"shape {got.shape}, expected {want.shape}")
    num = (got * want).sum(1)
    return float((num / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))).min())


def skip_reason(cell: Cell, target, max_positions: int, text_max: int) -> str | None:
    if cell.served_only and target.in_process:
        return "in-process library: no server, no concurrent clients"
    limit = max_positions if cell.input == "tokens" and target.input_used(cell) == "tokens" else text_max
    if isinstance(cell.seq_len, int) and cell.seq_len > limit:
        return f"longer than the served model's maximum ({limit} tokens)"
    return None


def run_cell(cell: Cell, target, requests, reference_rows, warmup: int) -> dict:
    """Warm-up (every response checked), then timing; a failed check reports no timing."""
    check = requests[:warmup]
    try:
        got = target.embed(cell, check)
        if cell.task == "score":
            diff = check_scores(got, reference_rows)
            checked = {"max_score_diff": diff}
            failed = diff > MAX_SCORE_DIFF and f"max |score - CrossEncoder| {diff:.2e} > {MAX_SCORE_DIFF}"
        else:
            cosine = min(min_cosine(g, w) for g, w in zip(got, reference_rows))
            checked = {"min_cosine": cosine}
            failed = cosine < MIN_COSINE and f"min cosine {cosine:.5f} < {MIN_COSINE}"
    except Exception as exc:
        return {"error": f"warm-up failed: {type(exc).__name__}: {exc}"}
    if failed:
        return {"error": f"warm-up check failed: {failed}", **checked}
    label = f"{cell.key} {target.name}"
    try:
        if cell.mode == "sequential":
            latencies = target.sequential(cell, requests, label)
            stats = latency_stats(latencies)
            seconds = sum(latencies) / 1e3
            stats["embeddings_per_s"] = stats["n"] * cell.batch / seconds
        else:
            stats = target.load(cell, requests, label)
    except Exception as exc:
        return {"error": f"timing failed: {type(exc).__name__}: {exc}", **checked}
    tokens = sum(r.num_tokens for r in requests) / sum(len(r.seq_lens) for r in requests)
    return {**stats, **checked, "input_used": target.input_used(cell), "mean_tokens_per_text": tokens}


def run_profile(profile: Profile, cells: list[Cell], targets: dict, model: dict, machine: dict,
                out_json: Path, extra: dict, quiet: tuple[float, float] = (0.25, 0.0),
                scoring: dict | None = None) -> dict:
    """`quiet` = (busy threshold, max wait s): before each target's timing, wait for other work to calm down.
    `scoring`: {"dir", "requests": PairRequests, "reference": ScoreReference, "targets"} for score
    cells (perf/scoring.py); without it they are skipped."""
    maker = TextMaker(os.path.join(model["dir"], "tokenizer.json"), model["max_positions"])
    reference = Reference(model["dir"], model["max_positions"])
    model["text_max_length"] = reference.text_max
    results = {"profile": profile.name, "description": profile.description, "notes": list(profile.notes),
               "machine": machine, "model": model, **extra,
               "started": datetime.datetime.now().isoformat(timespec="seconds"),
               "targets": {name: {"versions": t.versions} for name, t in targets.items()}, "cells": []}
    if scoring is not None:
        results["reranker"] = scoring["info"]
    for number, cell in enumerate(cells, 1):
        log(f"cell {number}/{len(cells)} [{cell.scenario}] {cell.label}")
        entry = cell.entry()
        cell_targets, limit = targets, model["max_positions"]
        if cell.task == "score":
            if scoring is None:
                entry["results"] = {name: {"skipped": "no reranker (--rerank-model-dir)"} for name in targets}
                results["cells"].append(entry)
                continue
            cell_targets, limit = scoring["targets"], scoring["requests"].pairs.max_length
            requests = scoring["requests"].requests(profile.pool_requests, cell.batch, cell.seq_len)
            warmup = min(profile.warmup_requests, len(requests))
            reference_rows = [scoring["reference"].scores(r) for r in requests[:warmup]]
        else:
            requests = maker.requests(profile.pool_requests, cell.batch, cell.seq_len, reference.text_max)
            warmup = min(profile.warmup_requests, len(requests))
            reference_rows = [reference.embed(cell, r) for r in requests[:warmup]]
        for name, target in cell_targets.items():
            reason = skip_reason(cell, target, limit, limit if cell.task == "score" else reference.text_max)
            start = time.monotonic()
            busy = wait_until_quiet(*quiet) if not reason else None
            entry["results"][name] = {"skipped": reason} if reason else run_cell(
                cell, target, requests, reference_rows, warmup)
            outcome = entry["results"][name]
            if busy is not None:
                outcome["machine_busy_before"] = round(busy, 3)
            summary = (outcome.get("skipped") or outcome.get("error")
                       or f"p50 {outcome.get('p50_ms', 0):.1f} ms, {outcome.get('embeddings_per_s', 0):.1f} emb/s")
            log(f"  {name}: {summary} ({time.monotonic() - start:.0f}s)")
        results["cells"].append(entry)
        results["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
        out_json.write_text(json.dumps(results, indent=1))
        gc.collect()
    results["machine"]["load_avg_at_end"] = os.getloadavg()
    out_json.write_text(json.dumps(results, indent=1))
    return results
