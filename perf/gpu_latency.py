"""The seed's low-latency embedding scenario on one GPU: ROSE eager vs ROSE graphs vs HF transformers.

Random-weight Qwen3-Embedding-0.6B-shaped model (timing does not depend on
weight values; results are labelled random-weight). Pre-tokenized, batch 1,
strictly sequential; each timed run includes the host->device copy of the ids
and the device->host copy of the pooled row. Warm-up first checks every
system's output against an fp32 reference (cosine >= 0.999, the seed's 0.1%).
`--dry-run` does all of it at a tiny size on CPU, one step each (graphs via
a capture stand-in that re-runs the step), to check the script itself.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from engine_lib.contract import PackedBatch
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.runner.self_check import MIN_COSINE

QWEN3_EMBEDDING_0_6B = dict(vocab_size=151669, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                            num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                            max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                            tie_word_embeddings=True)
TINY = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=128, max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=10000.0)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny model on CPU, one step per scenario")
    parser.add_argument("--out", default=os.environ.get("OUT", "perf/results"), help="folder for latency.json")
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 4096])
    parser.add_argument("--iters", type=int, default=200, help="timed requests per system and length")
    parser.add_argument("--warmup", type=int, default=5, help="untimed requests first (>= 3: eager, capture, replay)")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.lengths, args.iters, args.warmup = [8, 40], 1, 3
    if args.warmup < 3:
        parser.error("--warmup must be >= 3 so graph runs are timed as replays")
    return args


def rerun_capture(fn):
    """Dry-run stand-in for CUDA graph capture: replay re-runs the step over the static buffers."""
    output = fn()
    return (lambda: output.copy_(fn())), output


def build_model_folder(shape: dict, folder: str, device: torch.device):
    """Random Qwen3 weights saved as safetensors; returns the fp32 HF model on `device`."""
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3Model(Qwen3Config(**shape)).eval()
    model.save_pretrained(folder)
    return model


def graph_engine(folder: str, max_tokens: int, common: dict, options: dict) -> ModelRunner:
    """Graphs with the auto backend, or with `masked` where the auto one cannot be captured."""
    try:
        return ModelRunner(folder, cuda_graphs="on", max_graph_tokens=max_tokens, **common, **options)
    except ValueError as exc:
        print(f"[latency] {exc}; graphs use attention_backend=masked", flush=True)
        return ModelRunner(folder, cuda_graphs="on", max_graph_tokens=max_tokens, attention_backend="masked", **common)


def percentiles(samples_ms: list[float]) -> dict:
    values = np.asarray(samples_ms)
    return {"n": len(values), "p50_ms": float(np.percentile(values, 50)), "p90_ms": float(np.percentile(values, 90)),
            "p99_ms": float(np.percentile(values, 99)), "max_ms": float(values.max()), "mean_ms": float(values.mean())}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def hf_embed(model, device):
    """HF transformers baseline: ids to the device, forward, last token, back to the host."""
    @torch.inference_mode()
    def embed(ids: np.ndarray) -> np.ndarray:
        hidden = model(input_ids=torch.from_numpy(ids)[None].to(device)).last_hidden_state
        return hidden[0, -1:].float().cpu().numpy()
    return embed


def engine_embed(engine: ModelRunner):
    def embed(ids: np.ndarray) -> np.ndarray:
        return engine.step(PackedBatch.from_sequences([ids])).wait()
    return embed


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_scenario(systems: dict, reference, inputs: dict, args, device) -> dict:
    results = {}
    for length, ids in inputs.items():
        expected = reference(ids)
        for name, embed in systems.items():
            checks = [cosine(embed(ids), expected) for _ in range(args.warmup)]
            synchronize(device)
            samples = []
            for _ in range(args.iters):
                start = time.perf_counter()
                embed(ids)
                samples.append((time.perf_counter() - start) * 1e3)
            results.setdefault(name, {})[str(length)] = {
                **percentiles(samples), "min_warmup_cosine": min(checks), "cosine_ok": min(checks) >= MIN_COSINE}
            print(f"[latency] {name:>11} {length:>5} tokens: p50 {results[name][str(length)]['p50_ms']:.3f} ms "
                  f"p99 {results[name][str(length)]['p99_ms']:.3f} ms  cosine {min(checks):.6f}", flush=True)
    return results


def environment(device: torch.device) -> dict:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": str(device)}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_latency: no CUDA device (use --dry-run on CPU)", file=sys.stderr)
        return 2
    shape = TINY if args.dry_run else QWEN3_EMBEDDING_0_6B
    rng = np.random.default_rng(0)
    inputs = {n: rng.integers(0, shape["vocab_size"], size=n).astype(np.int64) for n in args.lengths}
    with tempfile.TemporaryDirectory() as folder:
        model = build_model_folder(shape, folder, device)
        reference = hf_embed(model, device)  # fp32 transformers: the accuracy reference
        fp32_reference = {n: reference(ids) for n, ids in inputs.items()}
        half = torch.float32 if args.dry_run else torch.bfloat16
        hf_model = model.to(half)
        common = dict(device=device.type, dtype="float32" if args.dry_run else "bfloat16")
        graph_options = dict(attention_backend="masked", graph_capture=rerun_capture) if args.dry_run else {}
        eager = ModelRunner(folder, cuda_graphs="off", **common)
        graphs = graph_engine(folder, max(4096, max(args.lengths)), common, graph_options)
    systems = {"rose_eager": engine_embed(eager), "rose_graphs": engine_embed(graphs),
               "hf_transformers": hf_embed(hf_model, device)}
    results = run_scenario(systems, lambda ids: fp32_reference[len(ids)], inputs, args, device)
    report = {
        "scenario": "low-latency embedding: pre-tokenized, batch 1, strictly sequential",
        "weights": "random (Qwen3-Embedding-0.6B shape)" if not args.dry_run else "random (tiny, dry run)",
        "dry_run": args.dry_run, "dtype": common["dtype"], "attention_backend": eager.backend.name,
        "graph_backend": graphs.backend.name, "graph_stats": vars(graphs.stats), "environment": environment(device),
        "shape": shape, "iters": args.iters, "warmup": args.warmup, "results": results,
        "all_cosines_ok": all(r["cosine_ok"] for system in results.values() for r in system.values()),
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "latency.json").write_text(json.dumps(report, indent=2))
    print(f"[latency] wrote {Path(args.out) / 'latency.json'}; all cosines ok: {report['all_cosines_ok']}")
    return 0 if report["all_cosines_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
