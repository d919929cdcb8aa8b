"""ModelRunner-level CPU ratios in one run (issue 11): `python -m perf.engine_bench [--out FILE]`.

- all-MiniLM-L6-v2 `ModelRunner.step` at 1 x 128 tokens vs ONNX Runtime's optimum O2 export
  (same token ids, in its own venv: `python -m perf setup ort` first);
- model FLOP/s at 32 x 256 tokens as a fraction of the dense-GEMM FLOP/s measured in the same run;
- the same for a random-weight Qwen3 of the 0.6B shape cut to a few layers (no ORT export of it).
Ours and ORT run in alternating blocks (median and best per system), so a busy machine slows both
alike; GEMM is measured before and after; load average and CPU busy are recorded.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from perf.machine import cpu_busy, describe, gemm_flops, wait_until_quiet

QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=1000000.0)

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


def flops_per_token(cfg: dict, seq_len: int) -> float:
    """Forward FLOPs per token: every projection GEMM plus attention scores and values (causal: half)."""
    hidden, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    kv_heads = cfg.get("num_key_value_heads") or heads
    gated = cfg.get("model_type") == "qwen3"
    dense = 2 * (hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
                 + (3 if gated else 2) * hidden * inter)
    attention = 2 * 2 * heads * head_dim * seq_len * (0.5 if gated else 1.0)
    return float(layers * (dense + attention))


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


def ort_timer(model_dir: str, batch: int, length: int):
    """A persistent ORT worker in its own venv, or None when the export is missing."""
    from perf.setup_peers import PEERS, onnx_export_dir

    export, python = onnx_export_dir(model_dir), PEERS / "ort" / "bin" / "python"
    if not (export / "model.onnx").exists() or not python.exists():
        print("[engine_bench] no ORT export: run `python -m perf setup ort` first; ORT skipped", file=sys.stderr)
        return None
    worker = subprocess.Popen([str(python), "-c", ORT_WORKER, str(export / "model.onnx")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)

    def run(reps: int) -> list[float]:
        worker.stdin.write(f"{batch} {length} {reps}\n")
        worker.stdin.flush()
        return json.loads(worker.stdout.readline())
    run(2)  # warm-up
    run.worker = worker
    return run


def interleaved(timers: dict, rounds: int, reps: int) -> dict:
    """Alternate the systems in short blocks so a busy machine slows them alike; median and best per system."""
    samples = {name: [] for name in timers}
    for _ in range(rounds):
        for name, run in timers.items():
            samples[name] += run(reps)
    return {name: {"median_ms": statistics.median(t) * 1e3, "best_ms": min(t) * 1e3, "n": len(t)}
            for name, t in samples.items()}


def with_flops(figures: dict, cfg: dict, tokens: int, seq_len: int, gemm: float) -> dict:
    for fig in figures.values():
        fig["gemm_fraction_median"] = tokens * flops_per_token(cfg, seq_len) / (fig["median_ms"] / 1e3) / gemm
        fig["gemm_fraction_best"] = tokens * flops_per_token(cfg, seq_len) / (fig["best_ms"] / 1e3) / gemm
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10, help="1 x 128 steps per block")
    parser.add_argument("--rounds", type=int, default=5, help="alternating blocks per system")
    parser.add_argument("--qwen3-layers", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch
    from transformers import Qwen3Model

    from engine_lib.model_folder import resolve_model_dir
    from engine_lib.runner.model_runner import ModelRunner
    from testing.tiny_models import qwen3_config, save_random_model

    report = {"machine": describe(), "cpu_busy_before": wait_until_quiet(0.3, 90.0),
              "load_avg_at_start": list(os.getloadavg()),
              "torch_threads": torch.get_num_threads()}
    report["gemm"] = gemm_flops(3.0)
    minilm_dir = resolve_model_dir("default")
    minilm_cfg = json.loads(Path(minilm_dir, "config.json").read_text())
    engine = ModelRunner(minilm_dir, device="cpu")
    small = {"rose": engine_timer(engine, 1, 128)}
    large = {"rose": engine_timer(engine, 32, 256)}
    ort_small, ort_large = ort_timer(minilm_dir, 1, 128), ort_timer(minilm_dir, 32, 256)
    if ort_small is not None:
        small["ort_o2"], large["ort_o2"] = ort_small, ort_large
    report["minilm_1x128"] = interleaved(small, args.rounds, args.reps)
    report["minilm_32x256"] = interleaved(large, args.rounds, 1)
    with tempfile.TemporaryDirectory() as folder:
        config = qwen3_config(vocab_size=32768, num_hidden_layers=args.qwen3_layers, **QWEN3_06B)
        save_random_model(Qwen3Model, config, folder, seed=0)
        qwen3_cfg = json.loads(Path(folder, "config.json").read_text())
        qwen3 = ModelRunner(folder, device="cpu")
        report["qwen3_0.6b_shape"] = {"layers": args.qwen3_layers,
                                      "1x128": interleaved({"rose": engine_timer(qwen3, 1, 128)}, args.rounds, args.reps),
                                      "32x256": interleaved({"rose": engine_timer(qwen3, 32, 256)}, 2, 1)}
    report["gemm_at_end"] = gemm_flops(3.0)
    gemm = max(report["gemm"]["flops_per_s"], report["gemm_at_end"]["flops_per_s"])  # the less disturbed reading
    with_flops(report["minilm_32x256"], minilm_cfg, 32 * 256, 256, gemm)
    with_flops(report["qwen3_0.6b_shape"]["32x256"], qwen3_cfg, 32 * 256, 256, gemm)
    if "ort_o2" in report["minilm_1x128"]:
        report["rose_vs_ort_1x128"] = {k: report["minilm_1x128"]["ort_o2"][k] / report["minilm_1x128"]["rose"][k]
                                       for k in ("median_ms", "best_ms")}
        for timer in (ort_small, ort_large):
            timer.worker.stdin.close()
            timer.worker.wait(10)
    report["load_avg_at_end"] = list(os.getloadavg())
    report["cpu_busy_after"] = cpu_busy(1.0)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
