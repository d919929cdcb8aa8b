"""`--profile soak`: perf_analyzer at 64 and 128 concurrent on each entry for minutes, counting what breaks
(docs/benchmarks.md, "soak")."""
from __future__ import annotations

import json
import re
import secrets
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from rose_triton.server import TritonServer
from testing.crashes import kernel_log, new_lines, segfaults, stub_pids
from testing.tiny_rerankers import CORPUS, save_bert_cross_encoder

from .measure import log
from .overhead import build_tiny_model
from .perf_analyzer.sweep import ENTRIES, ensure_installed, input_data
from .serverstats import triton_stats

ENTRIES = {**ENTRIES, "score": []}
MINUTES, CONCURRENCY = 10.0, (64, 128)
WATCHDOG_RESTART = "[serve] a model stub died or hung"
UNHEALTHY = "is not healthy"
STUB_NAMED = re.compile(r"(\S+) \(pid (\d+)\)")


def score_data(path: Path, documents: int = 4, num_entries: int = 16) -> Path:
    data = [{"QUERY": {"content": [CORPUS[i % len(CORPUS)]], "shape": [1]},
             "DOCUMENTS": {"content": [CORPUS[(i + j + 1) % len(CORPUS)] for j in range(documents)],
                           "shape": [documents]}} for i in range(num_entries)]
    path.write_text(json.dumps({"data": data}))
    return path


def request_counts(http_url: str, admin_key: str) -> dict:
    """{model: (success, fail)} from Triton's statistics API ({} while the server is down)."""
    try:
        return {name: (stats["success"][0], stats["fail"][0]) for name, stats in triton_stats(http_url, admin_key).items()}
    except OSError:
        return {}


class Watch:
    """Polls the server during a cell: request counts of `model` (summing increases; a drop is a
    fresh server) and its stub processes: one that is gone at a poll while the server is ready
    died (stubs come and go while a server loads or stops)."""

    def __init__(self, server, model: str, admin_key: str, interval: float = 2.0):
        self.server, self.model, self.admin_key, self.interval = server, model, admin_key, interval
        self.requests = self.errors = 0
        self.stubs: dict[int, str] = {}  # every stub seen: pid -> model instance
        self.died: dict[int, str] = {}
        self._alive: set[int] = set()
        self._last = request_counts(server.http_url, admin_key).get(model)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._poll_stubs()
        self._thread.start()

    def _poll_stubs(self) -> None:
        ready = self.server.is_ready()
        now = stub_pids(self.server.process.pid)
        self.stubs.update(now)
        if ready:
            self.died.update({pid: self.stubs[pid] for pid in self._alive - set(now)})
            self._alive = set(now)
        else:
            self._alive &= set(now)

    def _poll_counts(self) -> None:
        counts = request_counts(self.server.http_url, self.admin_key).get(self.model)
        if counts is None:
            return
        last = self._last or (0, 0)
        fresh = counts[0] < last[0] or counts[1] < last[1]
        self.requests += counts[0] + counts[1] - (0 if fresh else sum(last))
        self.errors += counts[1] - (0 if fresh else last[1])
        self._last = counts

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll_counts()
            self._poll_stubs()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._poll_counts()
        self._poll_stubs()


def soak_cell(server, launcher: Path, model: str, data: Path, concurrency: int, seconds: float,
              admin_key: str) -> dict:
    """perf_analyzer on `model` at `concurrency` for `seconds` (started again after a failure)."""
    log_before = server.log_tail(10**9)
    dmesg_before = kernel_log()
    watch = Watch(server, model, admin_key)
    runs, failures = 0, []
    started = time.monotonic()
    deadline = started + seconds
    while (left := deadline - time.monotonic()) > 1:
        if not server.is_ready():
            time.sleep(1)
            continue
        window_ms = int(max(2.0, min(20.0, left / 3)) * 1000)  # perf_analyzer measures >= 3 windows
        cmd = [str(launcher), "-m", model, "-u", server.grpc_url, "-i", "grpc", *ENTRIES[model],
               "--input-data", str(data), "--concurrency-range", str(concurrency),
               "--measurement-mode", "time_windows", "--measurement-interval", str(window_ms),
               "--stability-percentage", "1000", "--max-trials", "3",
               "-H", f"triton-grpc-protocol-rose-admin-key:{admin_key}"]
        runs += 1
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=window_ms / 1000 * 5 + 120)
        if out.returncode != 0:
            lines = (out.stdout + out.stderr).splitlines()
            first = [ln for ln in lines if "had error" in ln] or [ln for ln in lines if "rror" in ln or "ailed" in ln]
            failures.append(first[0].strip()[:200] if first else f"exit status {out.returncode}")
    watch.close()
    elapsed = time.monotonic() - started
    log = server.log_tail(10**9)[len(log_before):]
    for line in log.splitlines():  # the watchdog names a stub that died between two polls of ours
        if "[watchdog]" in line and "ended while the server was ready" in line:
            watch.died.update({int(pid): name for name, pid in STUB_NAMED.findall(line)})
    dmesg_after = kernel_log()
    crashed = None if dmesg_before is None or dmesg_after is None else \
        segfaults(new_lines(dmesg_before, dmesg_after), watch.stubs)
    return {"model": model, "concurrency": concurrency, "seconds": round(elapsed, 1), "requests": watch.requests,
            "errors": watch.errors, "perf_analyzer_runs": runs, "perf_analyzer_failures": failures,
            "stubs_died": [f"{name} (pid {pid})" for pid, name in watch.died.items()], "watchdog_restarts": log.count(WATCHDOG_RESTART),
            "unhealthy_lines": log.count(UNHEALTHY), "segfault_lines": crashed}


def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [f"# Soak: perf_analyzer at high concurrency ({results['minutes']:g} min per cell)", "",
             f"{m.get('date', '')}, {m.get('cpu', '')} ({m.get('cores', '?')} cores), GPU {m.get('gpu')}, "
             f"commit `{m.get('git_commit', '')}`; model folder: {results['model']}; perf_analyzer 2.60.0, gRPC "
             "(`ensemble` --streaming); server through scripts/serve.sh with its watchdog.", "",
             "| model | concurrency | requests | req/s | errors | perf_analyzer runs (failed) | stubs died "
             "| watchdog restarts | `not healthy` lines | stub segfaults (dmesg) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        dmesg = "unreadable" if r["segfault_lines"] is None else len(r["segfault_lines"])
        lines.append(f"| {r['model']} | {r['concurrency']} | {r['requests']} | {r['requests'] / r['seconds']:.1f} "
                     f"| {r['errors']} | {r['perf_analyzer_runs']} ({len(r['perf_analyzer_failures'])}) "
                     f"| {len(r['stubs_died'])} | {r['watchdog_restarts']} | {r['unhealthy_lines']} | {dmesg} |")
    details = [f"- {r['model']} c{r['concurrency']}: " + "; ".join(
        r["perf_analyzer_failures"][:3] + r["stubs_died"] + (r["segfault_lines"] or []))
        for r in results["rows"] if r["perf_analyzer_failures"] or r["stubs_died"] or r["segfault_lines"]]
    return "\n".join(lines + ([""] + details if details else [])) + "\n"


def measure(args, out_json, machine: dict) -> dict:
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    model_dir, rerank_dir = args.model_dir, args.rerank_model_dir
    if model_dir == "near-free":
        model_dir = str(build_tiny_model(work / "near-free"))
    if rerank_dir == "tiny":
        rerank_dir = str(work / "tiny-reranker")
        save_bert_cross_encoder(rerank_dir)
    models = args.cells.split(",") if args.cells else ["embed", "ensemble"] + (["score"] if rerank_dir else [])
    launcher = ensure_installed()
    data = {"score": score_data(work / "score.json")} if "score" in models else {}
    data.update({m: input_data(work / "text.json", 1, 32) for m in models if m != "score"})
    admin_key = secrets.token_hex(16)
    log(f"soak: server log {work / 'server.log'}")
    env = {**({"ROSE_MODEL_DIR": model_dir} if model_dir else {}),
           **dict(kv.split("=", 1) for kv in (args.server_env or []))}
    server = TritonServer(work / "server.log", env=env, serve_args=["--rerank-model-dir", rerank_dir] if rerank_dir else [],
                          ready_timeout=600, admin_key=admin_key)
    results = {"profile": "soak", "minutes": MINUTES * args.scale, "machine": machine,
               "model": "near-free (1 layer, 32 wide)" if args.model_dir == "near-free" else model_dir or "all-MiniLM-L6-v2",
               "rows": []}
    try:
        for model in models:
            for concurrency in CONCURRENCY:
                log(f"soak: {model} at concurrency {concurrency} for {results['minutes']:g} min")
                results["rows"].append(soak_cell(server, launcher, model, data[model], concurrency,
                                                 results["minutes"] * 60, admin_key))
    finally:
        server.stop()
    return results
