"""`python -m perf.gateway_cost`: the gateway's own cost per request, measured.

Batch-1 requests of 128-token texts, strictly sequential: p50 through the
gateway (text in, and token ids in) vs straight to Triton (`rose_encoder` with
the same ids, `ensemble` with the same text), and the gateway process's CPU
time per request (from /proc), sequential and under concurrent clients.
`--tiny` serves a near-zero-compute copy of the model (same tokenizer, one
layer 32 wide, random weights) so that the serving overhead is not buried
under model compute. Writes perf/results/<date>-<machine>/gateway-cost[-tiny].{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from . import machine
from .lineup import REPO, gateway_target, rose_target
from .measure import latency_loop, latency_stats
from .profiles import Cell
from .targets import process_loop
from .texts import TextMaker

TICKS = os.sysconf("SC_CLK_TCK")


def gateway_pid(port: int) -> int:
    """The process serving the gateway on `port` (started by the launcher)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"gateway" in args and b"-m" in args and str(port).encode() in args:
                return int(entry)
    raise RuntimeError(f"no gateway process on port {port}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def tiny_copy(src: str, dst: Path) -> str:
    """The model folder with its tokenizer and sentence-transformers files, but a 1-layer 32-wide BERT."""
    import shutil

    from transformers import BertConfig, BertModel

    dst.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if os.path.isfile(path) and not name.endswith((".safetensors", ".bin", ".onnx", ".h5", ".msgpack")):
            shutil.copy(path, dst / name)
        elif name == "1_Pooling":
            shutil.copytree(path, dst / name, dirs_exist_ok=True)
    config = BertConfig.from_pretrained(src, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=64)
    BertModel(config).save_pretrained(dst, safe_serialization=True)
    return str(dst)


def sequential(target, cell, requests, num: int, pid: int | None) -> dict:
    call = target._call(cell)
    for r in requests[:5]:  # warm-up
        call(r)
    cpu0 = cpu_seconds(pid) if pid else 0.0
    latencies = latency_loop(call, requests, num, 120.0, f"{target.name} {cell.input}")
    result = latency_stats(latencies)
    if pid:
        result["gateway_cpu_ms_per_request"] = (cpu_seconds(pid) - cpu0) * 1e3 / len(latencies)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf.gateway_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="sequential requests per path")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="of the concurrent run")
    parser.add_argument("--out", help="output folder (default: perf/results/<date>-<machine>)")
    parser.add_argument("--tiny", action="store_true", help="serve a near-zero-compute copy of the model")
    args = parser.parse_args(argv)

    from engine_lib.model_folder import ModelFolder
    from rose_triton.server import TritonServer

    desc = machine.describe()
    folder = ModelFolder.open(os.environ.get("ROSE_MODEL_DIR") or "default")
    maker = TextMaker(folder.tokenizer_path, folder.max_length)
    requests = maker.requests(32, 1, 128)
    work = Path(tempfile.mkdtemp(prefix="perf-gateway-"))
    env = {"ROSE_MODEL_DIR": tiny_copy(folder.path, work / "tiny-minilm")} if args.tiny else {}
    server = TritonServer(work / "server.log", env=env, gateway=True, ready_timeout=600)
    try:
        pid = gateway_pid(int(server.gateway_url.rsplit(":", 1)[1]))
        rose, gateway = rose_target(server.grpc_url), gateway_target(server.gateway_url)
        text, tokens = (Cell("cost", k, "sequential", k, 128, 1) for k in ("text", "tokens"))
        busy = machine.cpu_busy(2.0)
        results = {
            "gateway_text": sequential(gateway, text, requests, args.requests, pid),
            "gateway_tokens": sequential(gateway, tokens, requests, args.requests, pid),
            "triton_ensemble_text": sequential(rose, text, requests, args.requests, None),
            "triton_encoder_tokens": sequential(rose, tokens, requests, args.requests, None),
        }
        cpu0 = cpu_seconds(pid)
        load = process_loop(gateway.spec(text), requests, args.concurrency, args.seconds,
                            f"gateway text, {args.concurrency} clients")
        load["gateway_cpu_ms_per_request"] = (cpu_seconds(pid) - cpu0) * 1e3 / load["requests_per_s"] / load["seconds"]
        results[f"gateway_text_{args.concurrency}_clients"] = {k: v for k, v in load.items() if k != "latencies_ms"}
        busy_after = machine.cpu_busy(2.0)
    finally:
        server.stop()
    added = {"text_vs_ensemble_ms": results["gateway_text"]["p50_ms"] - results["triton_ensemble_text"]["p50_ms"],
             "tokens_vs_encoder_ms": results["gateway_tokens"]["p50_ms"] - results["triton_encoder_tokens"]["p50_ms"],
             "text_vs_encoder_ms": results["gateway_text"]["p50_ms"] - results["triton_encoder_tokens"]["p50_ms"]}
    model = "near-zero-compute copy (1 layer, 32 wide, random weights)" if args.tiny else "the model"
    report = {"machine": desc, "busy_before": busy, "busy_after": busy_after,
              "requests": f"batch 1, 128 tokens, {model}",
              "results": results, "added_p50": added, "flags": " --tiny" if args.tiny else "", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out_dir = Path(args.out) if args.out else REPO / "perf" / "results" / machine.slug(desc)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "gateway-cost-tiny" if args.tiny else "gateway-cost"
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=1))
    (out_dir / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))


def markdown(report: dict) -> str:
    rows = ["| path | p50 ms | p90 ms | p99 ms | gateway CPU ms/request |", "| --- | --- | --- | --- | --- |"]
    for name, r in report["results"].items():
        cpu = r.get("gateway_cpu_ms_per_request")
        rows.append(f"| {name} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | "
                    f"{'' if cpu is None else f'{cpu:.2f}'} |")
    added = report["added_p50"]
    m = report["machine"]
    return "\n".join([
        f"# Gateway cost ({report['date']}, {m['cpu']}, {m['cores']} cores, no GPU)" if not m.get("gpu") else
        f"# Gateway cost ({report['date']}, {m['gpu']})",
        "", f"Requests: {report['requests']}, strictly sequential unless the name says clients. "
        f"Machine busy (all cores, anyone's work): {report['busy_before']:.0%} before, "
        f"{report['busy_after']:.0%} after. Command: `python -m perf.gateway_cost{report.get('flags', '')}`.",
        "", *rows, "",
        f"Gateway's added p50: token ids in vs `rose_encoder` direct {added['tokens_vs_encoder_ms']:+.2f} ms "
        f"(HTTP + JSON + gRPC client); text in vs `rose_encoder` direct {added['text_vs_encoder_ms']:+.2f} ms "
        f"(adds tokenization); text in vs the `ensemble` {added['text_vs_ensemble_ms']:+.2f} ms "
        "(the gateway replaces the tokenizer model's hop).", ""])


if __name__ == "__main__":
    main()
