"""The cells profiles: every target (ours served, peers) on the same requests, each response of the
warm-up checked against sentence-transformers on the same weights, then timed."""
from __future__ import annotations

import datetime
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from sentence_transformers import SentenceTransformer

from engine_lib.model_folder import ModelFolder
from engine_lib.runner.self_check import MIN_COSINE
from rose_triton.server import TritonServer

from . import targets as lineup
from .machine import gemm_flops, wait_until_quiet
from .measure import latency_stats, log, min_cosine
from .overhead import TINY_SHAPE, write_floor_repository
from .peers.servers import start_openai_peer
from .peers.setup import ensure_onnx_export
from .profiles import LABELS, PROFILES, Cell, Profile, select
from .report import markdown  # noqa: F401 (the renderer of this module's profiles)
from .texts import TextMaker


class Reference:
    """sentence-transformers on the same weights: what every response is checked against."""

    def __init__(self, model_dir: str, max_positions: int):
        self.model = SentenceTransformer(model_dir)  # fp32, CUDA where there is one
        self.text_max = self.model.max_seq_length
        self.max_positions = max_positions

    def embed(self, cell: Cell, request) -> np.ndarray:
        # Token cells send ids up to the model's positions; text cells are truncated like the server does.
        self.model.max_seq_length = self.max_positions if cell.input == "tokens" else self.text_max
        return self.model.encode(request.texts, batch_size=len(request.texts), normalize_embeddings=True)


def model_info(model_dir: str | None) -> dict:
    """The model under test: its folder, a name for the results, its limits and sizes."""
    folder = ModelFolder.open(model_dir or os.environ.get("ROSE_MODEL_DIR") or "default")
    path, config = folder.path, folder.config
    name = "all-MiniLM-L6-v2 (embedded)" if not model_dir else os.path.basename(path.rstrip("/"))
    if all(config.get(k) == v for k, v in TINY_SHAPE.items()):
        name = "near-free model (1 layer, 64 wide)"
    return {"dir": path, "name": name, "max_positions": int(config["max_position_embeddings"]),
            "config": {k: config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                              "num_attention_heads") if k in config}}


def skip_reason(cell: Cell, target, max_positions: int, text_max: int) -> str | None:
    if cell.served_only and target.in_process:
        return "in-process library: no server, no concurrent clients"
    limit = max_positions if cell.input == "tokens" and target.input_used(cell) == "tokens" else text_max
    if isinstance(cell.seq_len, int) and cell.seq_len > limit:
        return f"longer than the served model's maximum ({limit} tokens)"
    return None


def check_target(cell: Cell, target, requests, reference_rows, warmup: int) -> dict:
    """Warm-up, every response checked: {"min_cosine": ...}, or {"error": ...} (then no timing). A floor
    (`checks_rows` False) answers zeros: its responses need a row per text, and have no cosine."""
    try:
        got = target.embed(cell, requests[:warmup])
        if not getattr(target, "checks_rows", True):
            counts = [(len(g), len(w)) for g, w in zip(got, reference_rows)]
            if any(g != w for g, w in counts):
                return {"error": f"warm-up check failed: rows per response {counts}, texts sent differ"}
            return {"min_cosine": None}
        cosine = min(min_cosine(g, w) for g, w in zip(got, reference_rows))
    except Exception as exc:  # any failure of a target is its cell's result, not the run's end
        return {"error": f"warm-up failed: {type(exc).__name__}: {exc}"}
    if cosine < MIN_COSINE:
        return {"error": f"warm-up check failed: min cosine {cosine:.5f} < {MIN_COSINE}", "min_cosine": cosine}
    return {"min_cosine": cosine}


def sequential_stats(cell: Cell, latencies: list[float]) -> dict:
    stats = latency_stats(latencies)
    stats["embeddings_per_s"] = stats["n"] * cell.batch / (sum(latencies) / 1e3)
    return stats


def cell_facts(cell: Cell, target, requests) -> dict:
    tokens = sum(r.num_tokens for r in requests) / sum(len(r.seq_lens) for r in requests)
    return {"input_used": target.input_used(cell), "mean_tokens_per_text": tokens}


def run_cell(cell: Cell, target, requests, reference_rows, warmup: int) -> dict:
    """Warm-up (every response checked), then timing; a failed check reports no timing."""
    checked = check_target(cell, target, requests, reference_rows, warmup)
    if "error" in checked:
        return checked
    label = f"{cell.key} {target.name}"
    try:
        if cell.mode == "sequential":
            stats = sequential_stats(cell, target.sequential(cell, requests, label))
        else:
            stats = target.load(cell, requests, label)
    except Exception as exc:  # as above
        return {"error": f"timing failed: {type(exc).__name__}: {exc}", **checked}
    return {**stats, **checked, **cell_facts(cell, target, requests)}


def run_rounds(cell: Cell, targets: dict, requests, reference_rows, warmup: int, rounds: int,
               quiet: tuple[float, float]) -> dict:
    """A sequential cell's requests in `rounds` parts, the targets taking turns each round, so that the
    machine's drift over the cell hits every target alike; each target's latencies pooled."""
    part = replace(cell, num_requests=-(-cell.num_requests // rounds), max_seconds=cell.max_seconds / rounds)
    outcomes = {name: check_target(cell, t, requests, reference_rows, warmup) for name, t in targets.items()}
    latencies: dict[str, list[float]] = {name: [] for name in targets}
    busy: dict[str, list[float]] = {name: [] for name in targets}
    for number in range(rounds):
        for name, target in targets.items():
            if "error" in outcomes[name]:
                continue
            busy[name].append(wait_until_quiet(*quiet))
            try:
                latencies[name] += target.sequential(part, requests, f"{cell.key} {name} round {number + 1}/{rounds}")
            except Exception as exc:  # a failed target is its cell's result, not the run's end
                outcomes[name] = {"error": f"timing failed: {type(exc).__name__}: {exc}", **outcomes[name]}
    for name, target in targets.items():
        if "error" not in outcomes[name]:
            outcomes[name] = {**sequential_stats(cell, latencies[name]), **outcomes[name], "rounds": rounds,
                              **cell_facts(cell, target, requests), "machine_busy_before": round(max(busy[name]), 3)}
    return outcomes


def _summary(outcome: dict) -> str:
    return (outcome.get("skipped") or outcome.get("error")
            or f"p50 {outcome.get('p50_ms', 0):.1f} ms, {outcome.get('embeddings_per_s', 0):.1f} emb/s")


def run_profile(profile: Profile, cells: list[Cell], targets: dict, model: dict, machine: dict,
                out_json: Path, extra: dict, quiet: tuple[float, float] = (0.25, 0.0), rounds: int = 1) -> dict:
    """`quiet` = (busy threshold, max wait s): before each target's timing, wait for other work to calm down.
    `rounds` > 1: sequential cells take the targets in turns (`run_rounds`)."""
    maker = TextMaker(os.path.join(model["dir"], "tokenizer.json"), model["max_positions"])
    reference = Reference(model["dir"], model["max_positions"])
    model["text_max_length"] = reference.text_max
    results = {"profile": profile.name, "description": profile.description, "notes": list(profile.notes),
               "machine": machine, "model": model, **extra,
               "started": datetime.datetime.now().isoformat(timespec="seconds"),
               "targets": {name: {"versions": t.versions} for name, t in targets.items()}, "cells": []}
    for number, cell in enumerate(cells, 1):
        log(f"cell {number}/{len(cells)} [{cell.scenario}] {cell.label}")
        entry = cell.entry()
        requests = maker.requests(profile.pool_requests, cell.batch, cell.seq_len, reference.text_max)
        warmup = min(profile.warmup_requests, len(requests))
        reference_rows = [reference.embed(cell, r) for r in requests[:warmup]]
        skipped = {name: skip_reason(cell, t, model["max_positions"], reference.text_max) for name, t in targets.items()}
        if cell.mode == "sequential" and rounds > 1:
            timed = run_rounds(cell, {n: t for n, t in targets.items() if not skipped[n]}, requests, reference_rows,
                               warmup, rounds, quiet)
            entry["results"] = {name: timed.get(name) or {"skipped": skipped[name]} for name in targets}
            for name, outcome in entry["results"].items():
                log(f"  {name}: {_summary(outcome)}")
        else:
            for name, target in targets.items():
                start = time.monotonic()
                busy = wait_until_quiet(*quiet) if not skipped[name] else None
                outcome = ({"skipped": skipped[name]} if skipped[name]
                           else run_cell(cell, target, requests, reference_rows, warmup))
                if busy is not None:
                    outcome["machine_busy_before"] = round(busy, 3)
                entry["results"][name] = outcome
                log(f"  {name}: {_summary(outcome)} ({time.monotonic() - start:.0f}s)")
        results["cells"].append(entry)
        results["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
        out_json.write_text(json.dumps(results, indent=1))
        gc.collect()
    results["machine"]["load_avg_at_end"] = os.getloadavg()
    return results


def server_env(args) -> dict:
    """--server-env KEY=VALUE ... as a dict (the environment of the server this run starts)."""
    pairs = args.server_env or []
    if bad := [kv for kv in pairs if "=" not in kv]:
        raise SystemExit(f"--server-env takes KEY=VALUE, got {bad}")
    return dict(kv.split("=", 1) for kv in pairs)


def start_targets(names: list[str], args, model: dict, stack: list) -> dict:
    """Targets by name; ours served by a tritonserver started here unless --grpc-url/--gateway-url."""
    grpc_url, gateway_url = args.grpc_url, args.gateway_url
    if not grpc_url and {"rose", "rose-batched", "rose-floor", "triton-padded"} & set(names) or \
            not gateway_url and "gateway" in names:
        extra = ["--model-repository", str(lineup.BASELINES)] if "triton-padded" in names else []
        log_dir = Path(tempfile.mkdtemp(prefix="perf-triton-"))
        if "rose-floor" in names:
            floor = write_floor_repository(log_dir / "floor", int(model["config"]["hidden_size"]))
            extra += ["--model-repository", str(floor)]
        log(f"starting tritonserver (log {log_dir / 'server.log'})")
        env = {**({"ROSE_MODEL_DIR": model["dir"]} if args.model_dir else {}), **server_env(args)}
        server = TritonServer(log_dir / "server.log", env=env, extra_args=extra, ready_timeout=600,
                              gateway="gateway" in names)
        stack.append(server.stop)
        grpc_url, gateway_url = grpc_url or server.grpc_url, gateway_url or server.gateway_url
    targets = {}
    for name in names:
        try:
            if name == "rose":
                targets[name] = lineup.rose_target(grpc_url)
            elif name == "rose-batched":
                targets[name] = lineup.rose_batched_target(grpc_url)
            elif name == "rose-floor":
                targets[name] = lineup.rose_floor_target(grpc_url)
            elif name == "gateway":
                targets[name] = lineup.gateway_target(gateway_url)
            elif name == "triton-padded":
                targets[name] = lineup.triton_padded_target(grpc_url)
            elif name == "rose-inproc":
                targets[name] = lineup.InprocTarget(name, sys.executable, "rose", model["dir"], model["max_positions"])
            elif name == "st":
                targets[name] = lineup.InprocTarget(name, sys.executable, "st", model["dir"], model["max_positions"])
            elif name == "ort":
                targets[name] = lineup.InprocTarget(name, lineup.peer_python("ort"), "ort",
                                                    str(ensure_onnx_export(model["dir"])), model["max_positions"])
            elif name in ("vllm", "vllm-2cores", "infinity"):
                targets[name] = start_openai_peer(name, model, stack)
            else:
                raise SystemExit(f"unknown target {name!r}; known: {', '.join(LABELS)}")
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            log(f"target {name} not available, left out: {exc}")
            continue
        stack.append(targets[name].close)
    return targets


def measure(args, out_json: Path, machine: dict) -> dict:
    profile = PROFILES[args.profile]
    names = args.targets.split(",") if args.targets else list(profile.default_targets)
    cells, model = select(profile.cells, args.cells, args.scale), model_info(args.model_dir)
    log(f"profile {profile.name}: {len(cells)} cells, targets {names} -> {out_json}")
    gemm = gemm_flops() if not args.no_gemm else None
    stack: list = []
    try:
        targets = start_targets(names, args, model, stack)
        results = run_profile(profile, cells, targets, model, machine, out_json, {"gemm": gemm, "scale": args.scale},
                              (args.quiet_busy, args.quiet_wait), args.rounds)
        for name in results["targets"]:
            results["targets"][name]["label"] = LABELS.get(name, name)
        if env := server_env(args):
            results["notes"].append("Our server's environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    finally:
        for stop in reversed(stack):
            try:
                stop()
            except Exception as exc:  # shutting down: report, keep closing the rest
                log(f"while stopping: {exc}")
    return results
