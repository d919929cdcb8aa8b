"""Engine-level CPU ratios in one run (issue 11): `python -m perf.engine_bench [--out FILE]`.

- all-MiniLM-L6-v2 `Engine.step` at 1 x 128 tokens vs ONNX Runtime's optimum O2 export
  (same token ids, in its own venv: `python -m perf setup ort` first);
- model FLOP/s at 32 x 256 tokens as a fraction of the dense-GEMM FLOP/s measured in the same run;
- the same for a random-weight Qwen3 of the 0.6B shape cut to a few layers (no ORT export of it).
Medians of short runs; the machine's load is recorded before and after (shared machines vary).
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

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from perf.machine import cpu_busy, describe, gemm_flops  # noqa: E402

QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=1000000.0)

ORT_TIMER = r"""
import json, statistics, sys, time
import numpy as np, onnxruntime as ort
path, shapes, reps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
names = {i.name for i in session.get_inputs()}
out = {}
for batch, length in shapes:
    ids = np.random.default_rng(0).integers(1000, 20000, size=(batch, length), dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if "token_type_ids" in names:
        feeds["token_type_ids"] = np.zeros_like(ids)
    session.run(None, feeds)
    times = []
    for _ in range(reps if batch == 1 else max(3, reps // 10)):
        start = time.perf_counter(); session.run(None, feeds); times.append(time.perf_counter() - start)
    out[f"{batch}x{length}"] = statistics.median(times)
print(json.dumps(out))
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


def time_engine(engine, batch: int, length: int, reps: int) -> float:
    from engine_lib.batch import PackedBatch

    rng = np.random.default_rng(0)
    packed = PackedBatch.from_sequences([rng.integers(1000, min(20000, engine.vocab_size), size=length)
                                         for _ in range(batch)])
    engine.step(packed).wait()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        engine.step(packed).wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def model_figures(engine, cfg: dict, gemm: float, reps: int) -> dict:
    small, large = time_engine(engine, 1, 128, reps), time_engine(engine, 32, 256, max(3, reps // 10))
    achieved = 32 * 256 * flops_per_token(cfg, 256) / large
    return {"step_1x128_ms": small * 1e3, "step_32x256_ms": large * 1e3, "flops_per_s_32x256": achieved,
            "gemm_fraction_32x256": achieved / gemm}


def ort_figures(model_dir: str, reps: int) -> dict | None:
    from perf.setup_peers import PEERS, onnx_export_dir

    export, python = onnx_export_dir(model_dir), PEERS / "ort" / "bin" / "python"
    if not (export / "model.onnx").exists() or not python.exists():
        print("[engine_bench] no ORT export: run `python -m perf setup ort` first; ORT skipped", file=sys.stderr)
        return None
    run = subprocess.run([str(python), "-c", ORT_TIMER, str(export / "model.onnx"), json.dumps([[1, 128], [32, 256]]),
                          str(reps)], capture_output=True, text=True, check=True)
    times = json.loads(run.stdout)
    return {"step_1x128_ms": times["1x128"] * 1e3, "step_32x256_ms": times["32x256"] * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--qwen3-layers", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch
    from transformers import Qwen3Model

    from engine_lib.model_folder import resolve_model_dir
    from engine_lib.engine import Engine
    from tiny_models import qwen3_config, save_random_model

    report = {"machine": describe(), "load_avg_at_start": list(os.getloadavg()), "cpu_busy_before": cpu_busy(1.0),
              "torch_threads": torch.get_num_threads()}
    report["gemm"] = gemm_flops(3.0)
    gemm = report["gemm"]["flops_per_s"]
    minilm_dir = resolve_model_dir("default")
    minilm_cfg = json.loads(Path(minilm_dir, "config.json").read_text())
    report["minilm"] = {"rose": model_figures(Engine(minilm_dir, device="cpu"), minilm_cfg, gemm, args.reps)}
    ort = ort_figures(minilm_dir, args.reps)
    if ort is not None:
        ort["flops_per_s_32x256"] = 32 * 256 * flops_per_token(minilm_cfg, 256) / (ort["step_32x256_ms"] / 1e3)
        ort["gemm_fraction_32x256"] = ort["flops_per_s_32x256"] / gemm
        report["minilm"]["ort_o2"] = ort
        report["minilm"]["rose_vs_ort_1x128"] = ort["step_1x128_ms"] / report["minilm"]["rose"]["step_1x128_ms"]
    with tempfile.TemporaryDirectory() as folder:
        config = qwen3_config(vocab_size=32768, num_hidden_layers=args.qwen3_layers, **QWEN3_06B)
        save_random_model(Qwen3Model, config, folder, seed=0)
        qwen3_cfg = json.loads(Path(folder, "config.json").read_text())
        report["qwen3_0.6b_shape"] = {"layers": args.qwen3_layers,
                                      "rose": model_figures(Engine(folder, device="cpu"), qwen3_cfg, gemm, args.reps)}
    report["load_avg_at_end"] = list(os.getloadavg())
    report["cpu_busy_after"] = cpu_busy(1.0)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
