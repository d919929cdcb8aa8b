"""`--profile perf_analyzer`: Triton's perf_analyzer, concurrency (--clients, default 1,4,16,64,128) x 1 and 8 texts
of 128 tokens a request on `ensemble` (--streaming), `embed` and `embed_batched` (one text a batch row, `-b`); other sizes: `python -m perf.perf_analyzer.sweep --concurrency 1,2,4,8 --sizes 1,8,32`."""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from engine_lib.model_folder import resolve_model_dir
from rose_triton.server import TritonServer

from .. import REPO
from ..machine import describe
from ..overhead import variants_for
from ..runner import model_info
from ..texts import TextMaker

LAUNCHER = REPO / "perf" / ".peers" / "perf-analyzer" / "perf_analyzer"
# The decoupled ensemble needs streaming; embed is unary; embed_batched is unary with a batch dimension:
# N texts a request are `-b N` rows of one text each.
ENTRIES = {"ensemble": ["--streaming"], "embed": [], "embed_batched": []}
BATCHED = ("embed_batched",)


def ensure_installed() -> Path:
    subprocess.run([str(REPO / "perf" / "perf_analyzer" / "install.sh")], check=True)
    return LAUNCHER


def input_data(path: Path, texts_per_request: int, seq_len: int, num_entries: int = 16, rows: bool = False) -> Path:
    """perf_analyzer --input-data JSON: `num_entries` requests of real texts of ~seq_len tokens; `rows`:
    entries of one text each (a batch row; perf_analyzer's `-b` puts several in a request)."""
    maker = TextMaker(os.path.join(resolve_model_dir("default"), "tokenizer.json"), 512)
    rng = random.Random(f"pa-{texts_per_request}-{seq_len}")
    per_entry = 1 if rows else texts_per_request
    data = [{"TEXT": {"content": [maker.text(seq_len, rng) for _ in range(per_entry)],
                      "shape": [per_entry]}} for _ in range(num_entries * (texts_per_request if rows else 1))]
    path.write_text(json.dumps({"data": data}))
    return path


def run_one(launcher: Path, grpc_url: str, model: str, data: Path, concurrency: int,
            request_count: int, timeout: float, stability: float, max_trials: int,
            admin_key: str | None = None, batch_size: int = 1) -> dict:
    """One perf_analyzer run; `batch_size` > 1: `-b` (a model with a batch dimension)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "pa.csv"
        cmd = [str(launcher), "-m", model, "-u", grpc_url, "-i", "grpc", *ENTRIES[model],
               *(["-b", str(batch_size)] if batch_size > 1 else []),
               "--input-data", str(data), "--concurrency-range", str(concurrency),
               "--measurement-mode", "count_windows", "--measurement-request-count", str(request_count),
               "--stability-percentage", str(stability), "--max-trials", str(max_trials), "-f", str(report)]
        if admin_key:  # perf_analyzer reads the statistics API, which serve.sh restricts
            cmd += ["-H", f"triton-grpc-protocol-rose-admin-key:{admin_key}"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0 or not report.exists():
            raise RuntimeError(f"perf_analyzer failed ({out.returncode}): {out.stdout[-2000:]}{out.stderr[-2000:]}")
        with open(report) as f:
            row = list(csv.DictReader(f))[-1]
    return {"concurrency": int(row["Concurrency"]), "infer_per_s": float(row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1e3, "p90_ms": float(row["p90 latency"]) / 1e3,
            "p99_ms": float(row["p99 latency"]) / 1e3}


def sweep(servers: dict[str, str], concurrency: list[int], sizes: list[int], seq_len: int, entries: list[str],
          request_count: int = 50, timeout: float = 600, stability: float = 20, max_trials: int = 10,
          admin_key: str | None = None) -> dict:
    """`servers`: name -> gRPC url; with several, each cell runs on each in turn (same run, drift hits
    all alike). A window holds at least `request_count` and 4 x concurrency requests. `stability`:
    perf_analyzer's allowed % spread between its 3 windows (on a shared machine the profile demands
    none: a figure is the mean of 3 windows, and servers alternate cell by cell)."""
    launcher = ensure_installed()
    results = {"profile": "perf_analyzer", "grpc_url": next(iter(servers.values())), "servers": list(servers),
               "seq_len": seq_len, "machine": describe(), "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            data = input_data(Path(tmp) / f"data-{size}.json", size, seq_len)
            rows = input_data(Path(tmp) / f"rows-{size}.json", size, seq_len, rows=True)
            for model in entries:
                batched = model in BATCHED
                print(f"[perf_analyzer] {model}: {size} texts/request, concurrency {concurrency}", file=sys.stderr)
                for c in concurrency:
                    for name, url in servers.items():
                        cell = {"server": name, "model": model, "texts_per_request": size, "concurrency": c}
                        try:
                            row = run_one(launcher, url, model, rows if batched else data, c,
                                          max(request_count, 4 * c), timeout, stability, max_trials, admin_key,
                                          size if batched else 1)
                        except RuntimeError as exc:  # the cell failed (e.g. a queue refused): say so, go on
                            said = [line for line in str(exc).splitlines() if line.strip()]
                            reason = next((line for line in reversed(said) if "error" in line), said[-1])
                            results["rows"].append({**cell, "failed": reason.strip()[:200]})
                            continue
                        # perf_analyzer counts a request of `-b N` as N inferences
                        per_second = row["infer_per_s"] * (1 if batched else size)
                        results["rows"].append({**cell, **row, "embeddings_per_s": per_second})
    return results


def markdown(results: dict) -> str:
    m = results.get("machine", {})
    lines = [f"# perf_analyzer sweep ({results['seq_len']}-token texts)", "",
             f"{m.get('date', '')}, {m.get('cpu', '')} ({m.get('cores', '?')} cores), GPU {m.get('gpu')}, "
             f"commit `{m.get('git_commit', '')}`; perf_analyzer 2.60.0 (PyPI), gRPC; `ensemble` with "
             f"--streaming, `embed` unary, `embed_batched` unary with `-b` texts/request; model: {results.get('served_model', 'not recorded')}.", "",
             "| server | entry | texts/request | concurrency | embeddings/s | p50 ms | p90 ms | p99 ms |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        cell = f"| {r.get('server', 'current')} | {r['model']} | {r['texts_per_request']} | {r['concurrency']} "
        if "failed" in r:
            lines.append(cell + f"| failed: {r['failed']} | | | |")
            continue
        lines.append(cell + f"| {r['embeddings_per_s']:.1f} | {r['p50_ms']:.1f} | {r['p90_ms']:.1f} | {r['p99_ms']:.1f} |")
    return "\n".join(lines) + "\n"


def measure(args, out_json, machine: dict) -> dict:
    """This checkout's server (or --grpc-url), and with --compare one server per git ref, the same sweep on each."""
    admin_key = args.admin_key or os.environ.get("ROSE_ADMIN_KEY")
    compare = args.compare.split(",") if args.compare else []
    servers, started = ({"current": args.grpc_url} if args.grpc_url else {}), []
    if not args.grpc_url or compare:
        admin_key = admin_key if args.grpc_url else secrets.token_hex(16)
        work = Path(tempfile.mkdtemp(prefix="pa-triton-"))
        for variant in variants_for(compare, work)[1 if args.grpc_url else 0:]:
            started.append(TritonServer(work / f"{variant.name}.log", ready_timeout=600, admin_key=admin_key,
                                        env={"ROSE_MODEL_DIR": args.model_dir} if args.model_dir else {},
                                        root=variant.root))
            servers[variant.name] = started[-1].grpc_url
    clients = [int(c) for c in args.clients.split(",")] if args.clients else [1, 4, 16, 64, 128]
    try:
        results = sweep(servers, clients, [1, 8], 128, args.cells.split(",") if args.cells else list(ENTRIES),
                        max(4, int(50 * args.scale)), stability=1000, admin_key=admin_key)
        results["served_model"] = model_info(args.model_dir)["name"]
        return results
    finally:
        for server in started:
            server.stop()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf.perf_analyzer.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc-url", help="a running server (default: start one with scripts/serve.sh)")
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--sizes", default="1,8,32", help="texts per request")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--entries", default="ensemble,embed")
    parser.add_argument("--request-count", type=int, default=50)
    parser.add_argument("--stability", type=float, default=20, help="allowed %% spread between windows")
    parser.add_argument("--out", type=Path, help="folder for perf_analyzer.json/.md")
    parser.add_argument("--admin-key", default=os.environ.get("ROSE_ADMIN_KEY"),
                        help="the server's admin key (perf_analyzer reads statistics); default $ROSE_ADMIN_KEY")
    args = parser.parse_args(argv)
    server = None
    if not args.grpc_url:
        args.admin_key = args.admin_key or secrets.token_hex(16)
        server = TritonServer(Path(tempfile.mkdtemp(prefix="pa-triton-")) / "server.log", ready_timeout=600,
                              admin_key=args.admin_key)
        args.grpc_url = server.grpc_url
    try:
        results = sweep({"current": args.grpc_url}, [int(c) for c in args.concurrency.split(",")],
                        [int(s) for s in args.sizes.split(",")], args.seq_len, args.entries.split(","),
                        args.request_count, stability=args.stability, admin_key=args.admin_key)
    finally:
        if server is not None:
            server.stop()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "perf_analyzer.json").write_text(json.dumps(results, indent=1))
        (args.out / "perf_analyzer.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
