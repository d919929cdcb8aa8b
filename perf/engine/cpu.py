"""`--profile engine-cpu`: ModelRunner-level CPU ratios in one run, no server.

- all-MiniLM-L6-v2 `ModelRunner.step` at 1 x 128 tokens vs ONNX Runtime's optimum O2 export
  (same token ids, in its own venv: `python -m perf setup ort` first, or it is left out);
- ours three ways in the same run: `cpu_linear=auto` (what ships: Linears of >= 2^20 weight elements
  packed for oneDNN) as `rose`, `cpu_linear=onednn` (every Linear packed) as `rose-onednn`,
  `cpu_linear=plain` (F.linear, MKL) as `rose-plain`;
- the Linear GEMMs alone on the models' shapes: F.linear vs the packed oneDNN op, GFLOP/s;
- model FLOP/s at 32 x 256 tokens as a fraction of the dense-GEMM FLOP/s measured in the same run;
- the same for a random-weight Qwen3 of the 0.6B shape cut to a few layers (no ORT export of it).
Ours and ORT run in alternating blocks (p50 and best per system), so a busy machine slows both
alike; GEMM is measured before and after; CPU busy before and after is recorded.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from ..lineup import model_info
from ..machine import cpu_busy, flops_per_token, gemm_flops
from ..measure import latency_stats
from ..profiles import Cell
from ..runner import log
from .common import QWEN3_EMBEDDING_0_6B, save_random_qwen3

QWEN3_LAYERS = 4
# (model, batch, length, alternating blocks per system (scaled by --scale), steps per block);
# cell keys `<model>-<batch>x<length>` (--cells)
CELLS = (("minilm", 1, 128, 5, 10), ("minilm", 32, 256, 5, 1), ("qwen3", 1, 128, 5, 10), ("qwen3", 32, 256, 2, 1))
SCENARIOS = {"minilm": "all-MiniLM-L6-v2, one ModelRunner.step",
             "qwen3": f"random Qwen3 0.6B shape, {QWEN3_LAYERS} layers, one ModelRunner.step"}
LABELS = {"rose": "ours: ModelRunner.step in-process, cpu_linear=auto (large Linears packed for oneDNN)",
          "rose-onednn": "ours: ModelRunner.step in-process, cpu_linear=onednn (every Linear packed)",
          "rose-plain": "ours: ModelRunner.step in-process, cpu_linear=plain (F.linear)",
          "ort": "ONNX Runtime (optimum O2 export), session.run only"}
OURS = {"rose": "auto", "rose-onednn": "onednn", "rose-plain": "plain"}  # target -> cpu_linear
# (name, in_features, out_features, rows): the Linears of all-MiniLM-L6-v2 (q/k/v fused, MLP) and of
# the Qwen3 0.6B shape (gate/up fused, down) at 1 x 128 and 32 x 256 tokens
LINEAR_SHAPES = (("minilm qkv", 384, 1152, 128), ("minilm mlp in", 384, 1536, 128), ("minilm mlp out", 1536, 384, 128),
                 ("minilm qkv", 384, 1152, 8192), ("minilm mlp in", 384, 1536, 8192),
                 ("minilm mlp out", 1536, 384, 8192), ("qwen3 gate/up", 1024, 6144, 128),
                 ("qwen3 down", 3072, 1024, 128), ("qwen3 gate/up", 1024, 6144, 2048))

ORT_WORKER = r"""
import json, sys, time
import numpy as np, onnxruntime as ort
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
names = {i.name for i in session.get_inputs()}
for line in sys.stdin:  # "BATCH LENGTH REPS" -> JSON list of seconds
    batch, length, reps = map(int, line.split())
    ids = np.random.default_rng(0).integers(1000, 20000, size=(batch, length), dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if "token_type_ids" in names:
        feeds["token_type_ids"] = np.zeros_like(ids)
    times = []
    for _ in range(reps):
        start = time.perf_counter(); session.run(None, feeds); times.append(time.perf_counter() - start)
    print(json.dumps(times), flush=True)
"""


def engine_timer(engine, batch: int, length: int):
    from engine_lib.contract import PackedBatch

    rng = np.random.default_rng(0)
    packed = PackedBatch.from_sequences([rng.integers(1000, min(20000, engine.vocab_size), size=length)
                                         for _ in range(batch)])
    engine.step(packed).wait()

    def run(reps: int) -> list[float]:
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            engine.step(packed).wait()
            times.append(time.perf_counter() - start)
        return times
    return run


class OrtWorker:
    """A persistent ONNX Runtime process in the `ort` peer venv, timing `session.run` on given shapes."""

    def __init__(self, model_dir: str):
        from ..setup_peers import PEERS, onnx_export_dir

        export, python = onnx_export_dir(model_dir), PEERS / "ort" / "bin" / "python"
        if not (export / "model.onnx").exists() or not python.exists():
            raise FileNotFoundError("no ORT export: run `python -m perf setup ort` first")
        self.proc = subprocess.Popen([str(python), "-c", ORT_WORKER, str(export / "model.onnx")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def timer(self, batch: int, length: int):
        def run(reps: int) -> list[float]:
            self.proc.stdin.write(f"{batch} {length} {reps}\n")
            self.proc.stdin.flush()
            return json.loads(self.proc.stdout.readline())
        run(2)  # warm-up
        return run

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def interleaved(timers: dict, rounds: int, reps: int) -> dict:
    """Alternate the systems in short blocks so a busy machine slows them alike; p50 and best per system."""
    samples = {name: [] for name in timers}
    for _ in range(rounds):
        for name, run in timers.items():
            samples[name] += run(reps)
    return {name: {**latency_stats([s * 1e3 for s in t]), "best_ms": min(t) * 1e3} for name, t in samples.items()}


def gemm_fractions(entry: dict, config: dict, gemm: float) -> None:
    """Model FLOP/s at the cell's p50 and best step time, as a fraction of the GEMM rate."""
    flops = entry["batch"] * entry["seq_len"] * flops_per_token(config, entry["seq_len"])
    for result in entry["results"].values():
        result["gemm_fraction_p50"] = flops / (result["p50_ms"] / 1e3) / gemm
        result["gemm_fraction_best"] = flops / (result["best_ms"] / 1e3) / gemm


def linear_rates(seconds: float = 0.4) -> list[dict]:
    """GFLOP/s of one Linear per LINEAR_SHAPES row: F.linear against the weight packed for oneDNN
    (`_linear_pointwise`, as cpu_linear=auto runs it), alternating, best of each."""
    import torch
    import torch.nn.functional as F

    from engine_lib.models.cpu_linear import PackedLinear, probe

    if probe(torch.float32) is not None:
        return []
    rates = []
    with torch.inference_mode():
        for name, k, n, m in LINEAR_SHAPES:
            layer, x = torch.nn.Linear(k, n), torch.randn(m, k)
            packed = PackedLinear(layer)
            calls = {"plain": lambda: F.linear(x, layer.weight, layer.bias), "onednn": lambda: packed(x)}
            best = {key: float("inf") for key in calls}
            for _ in range(3):
                for key, call in calls.items():
                    call()
                    reps, start = 0, time.perf_counter()
                    while reps < 2 or time.perf_counter() - start < seconds / 6:
                        t0 = time.perf_counter()
                        call()
                        best[key] = min(best[key], time.perf_counter() - t0)
                        reps += 1
            flops = 2 * m * k * n
            rates.append({"linear": name, "in": k, "out": n, "rows": m,
                          **{f"{key}_gflops": flops / t / 1e9 for key, t in best.items()}})
            log(f"  linear {name} {k}x{n}, {m} rows: F.linear {rates[-1]['plain_gflops']:.0f}, packed oneDNN "
                f"{rates[-1]['onednn_gflops']:.0f} GFLOP/s")
    return rates


def time_cells(engines: dict, ort: OrtWorker | None, keys: str | None, scale: float) -> list[dict]:
    entries = []
    for model, batch, length, rounds, reps in CELLS:
        if keys and f"{model}-{batch}x{length}" not in keys.split(","):
            continue
        rounds = max(1, round(rounds * scale))
        cell = Cell(SCENARIOS[model], f"{model}-{batch}x{length}", "sequential", "tokens", length, batch,
                    num_requests=rounds * reps)
        timers = {name: engine_timer(engine, batch, length) for name, engine in engines[model].items()}
        if ort is not None and model == "minilm":
            timers["ort"] = ort.timer(batch, length)
        entries.append(cell.entry(interleaved(timers, rounds, reps)))
        log(f"  {cell.key}: " + ", ".join(f"{n} p50 {r['p50_ms']:.1f} ms" for n, r in entries[-1]["results"].items()))
    return entries


def measure(args, out_json, machine: dict) -> dict:
    import torch

    from engine_lib.runner.model_runner import ModelRunner

    started = datetime.datetime.now().isoformat(timespec="seconds")
    gemm_start = gemm_flops(3.0)
    model = model_info(args.model_dir)
    ort = None
    wanted = args.targets.split(",") if args.targets else ["rose", "rose-onednn", "rose-plain", "ort"]
    ours = [name for name in OURS if name in wanted]
    if "ort" in wanted:
        try:
            ort = OrtWorker(model["dir"])
        except FileNotFoundError as exc:
            log(f"engine-cpu: {exc}; ORT left out")
    with tempfile.TemporaryDirectory() as folder:
        save_random_qwen3({**QWEN3_EMBEDDING_0_6B, "vocab_size": 32768, "num_hidden_layers": QWEN3_LAYERS,
                           "max_position_embeddings": 1024}, folder)
        configs = {"minilm": model["config"], "qwen3": json.loads(Path(folder, "config.json").read_text())}
        engines = {key: {name: ModelRunner(path, device="cpu", cpu_linear=OURS[name]) for name in ours}
                   for key, path in (("minilm", model["dir"]), ("qwen3", folder))}
        paths = {name: engine.cpu_linear for name, engine in engines["minilm"].items()}
        entries = time_cells(engines, ort, args.cells, args.scale)
    linears = linear_rates()
    if ort is not None:
        ort.close()
    gemm_end = gemm_flops(3.0)
    gemm = max(gemm_start, gemm_end, key=lambda g: g["flops_per_s"])  # the less disturbed reading
    notes = []
    for entry in (e for e in entries if e["batch"] > 1):
        gemm_fractions(entry, configs[entry["key"].split("-")[0]], gemm["flops_per_s"])
        notes.append(f"{entry['scenario']}, {entry['batch']} x {entry['seq_len']} tokens, model FLOP/s as a share "
                     "of the GEMM rate (p50 / best step): " + ", ".join(
                         f"{n} {r['gemm_fraction_p50']:.0%} / {r['gemm_fraction_best']:.0%}"
                         for n, r in entry["results"].items()))
    threads = torch.get_num_threads()
    notes.append("Linear path per target (cpu_linear): " + ", ".join(f"{n} {p}" for n, p in paths.items()))
    if linears:
        notes.append("One Linear alone, F.linear vs packed oneDNN, GFLOP/s (best of alternating blocks): " + "; ".join(
            f"{r['linear']} {r['in']}x{r['out']} at {r['rows']} rows {r['plain_gflops']:.0f} vs "
            f"{r['onednn_gflops']:.0f}" for r in linears))
    notes.append(f"Systems alternate in blocks of steps (`n` = steps timed); torch threads {threads}; GEMM "
                 f"{gemm['flops_per_s'] / 1e9:.1f} GFLOP/s (better of start {gemm_start['flops_per_s'] / 1e9:.1f} "
                 f"and end {gemm_end['flops_per_s'] / 1e9:.1f})")
    return {"profile": "engine-cpu", "description": __doc__.splitlines()[0].split(": ", 1)[1], "notes": notes,
            "check": "No output check: the same token ids go to each system; only step times are compared.",
            "machine": {**machine, "load_avg_at_end": os.getloadavg(), "cpu_busy_after": cpu_busy(1.0)},
            "model": model,
            "targets": {name: {"label": LABELS[name]} for name in (*ours, *(["ort"] if ort else []))},
            "linear_path": paths, "linear_gflops": linears,
            "gemm": gemm, "gemm_at_start": gemm_start, "gemm_at_end": gemm_end, "torch_threads": threads,
            "started": started, "finished": datetime.datetime.now().isoformat(timespec="seconds"), "cells": entries}
