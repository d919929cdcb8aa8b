"""`python -m perf run --profile overhead`: served batch-1 latency per client path minus the same model
in-process, server CPU per request, per-hop breakdown, the Python backend's floor; optionally the same
for older commits in the same run (`--compare REF`), rounds interleaved so that drift hits all alike."""
from __future__ import annotations

import datetime
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engine_lib.runner.self_check import MIN_COSINE

from .. import machine
from ..measure import latency_loop, latency_stats
from ..runner import log, min_cosine
from ..targets import process_loop
from ..texts import TextMaker
from . import clients, hops, procstat, servers
from .floor import write_floor_repository
from .folder import SHAPE, build_tiny_model

REPO = servers.REPO
BASELINES = REPO / "perf" / "baselines" / "model_repository"
OURS = ("tokens", "ensemble", "generate", "unary_grpc", "unary_http")
ONLY_CURRENT = ("floor_execute", "floor_thread", "floor_batched", "padded")  # do not depend on our code


@dataclass(frozen=True)
class Settings:
    seq_len: int = 128
    rounds: int = 4
    per_round: int = 50             # sequential requests per path, server and round
    load_seconds: float = 6.0
    load_rounds: int = 2            # windows per server and load cell, alternating order
    concurrencies: tuple = (1, 8)
    load_paths: tuple = ("ensemble", "tokens", "padded", "floor_execute", "floor_batched")
    paths: tuple = OURS + ONLY_CURRENT
    metrics_lag_s: float = 0.6      # the encoder publishes its counters every 0.5 s

    def only(self, paths: list[str]) -> "Settings":
        from dataclasses import replace

        unknown = sorted(set(paths) - set(clients.PATHS))
        if unknown:
            raise SystemExit(f"unknown path(s) {unknown}; known: {', '.join(clients.PATHS)}")
        return replace(self, paths=tuple(p for p in self.paths if p in paths),
                       load_paths=tuple(p for p in self.load_paths if p in paths))

    def scaled(self, factor: float) -> "Settings":
        from dataclasses import replace

        return replace(self, per_round=max(5, int(self.per_round * factor)),
                       rounds=max(1, round(self.rounds * min(1.0, factor * 2))),
                       load_seconds=max(1.5, self.load_seconds * factor),
                       load_rounds=max(1, round(self.load_rounds * min(1.0, factor * 2))))


class Window:
    """Server CPU, client CPU, Triton statistics and encoder hop counters around one timed loop."""

    def __init__(self, variant: servers.Variant, with_stats: bool = True):
        self.variant, self.with_stats = variant, with_stats

    def __enter__(self):
        server = self.variant.server
        self.cpu0 = procstat.tree_cpu_seconds(self.variant.triton_pid)
        self.client0 = time.process_time()
        if self.with_stats:
            self.stats0 = hops.triton_stats(server.http_url, self.variant.admin_key)
            self.hops0 = hops.encoder_hops(server.metrics_url)
        return self

    def __exit__(self, *exc):
        if exc[0] is not None:
            return False
        self.cpu = procstat.diff(procstat.tree_cpu_seconds(self.variant.triton_pid), self.cpu0)
        self.client = time.process_time() - self.client0
        if self.with_stats:
            server = self.variant.server
            self.stats = hops.triton_delta(hops.triton_stats(server.http_url, self.variant.admin_key), self.stats0)
        return False

    def encoder_hops(self, lag_s: float) -> dict:
        """Endpoint hop means over the window; call after the loop (its counters are published every 0.5 s)."""
        time.sleep(lag_s)
        return hops.hops_delta(hops.encoder_hops(self.variant.server.metrics_url), self.hops0)


def _check(call, requests, reference, want_model: bool) -> float | None:
    """Min cosine of the first responses against sentence-transformers (None for the floor)."""
    got = [call(r) for r in requests[:4]]
    if not want_model:
        return None
    cosine = min(min_cosine(g, reference.encode(r.texts, normalize_embeddings=True))
                 for g, r in zip(got, requests[:4]))
    if cosine < MIN_COSINE:
        raise RuntimeError(f"warm-up check failed: min cosine {cosine:.5f} < {MIN_COSINE}")
    return cosine


def _merge(windows: list[dict]) -> dict:
    """Sum the window records of one (path, server) over rounds."""
    out = {"latencies_ms": [], "requests": 0, "server_cpu_s": {}, "client_cpu_s": 0.0, "stats": {}, "hops": {}}
    for w in windows:
        out["latencies_ms"] += w["latencies_ms"]
        hops.add(out, {k: w[k] for k in ("requests", "server_cpu_s", "client_cpu_s", "stats", "hops")})
    return out


def summarize(merged: dict) -> dict:
    n = max(1, merged["requests"])
    cpu = merged["server_cpu_s"]
    return {**latency_stats(merged["latencies_ms"]),
            "server_cpu_ms_per_request": 1e3 * sum(cpu.values()) / n,
            "server_cpu_ms_by_process": {k: 1e3 * v / n for k, v in sorted(cpu.items()) if v > 0},
            "client_cpu_ms_per_request": 1e3 * merged["client_cpu_s"] / n,
            "triton_stats": hops.triton_means(merged["stats"]), "encoder_hops_us": hops.hops_means(merged["hops"])}


def sequential(settings: Settings, variants, requests, reference, inproc) -> tuple[dict, dict]:
    calls = {}
    checks = {}
    for variant in variants:
        for path in settings.paths:
            if variant.name != "current" and path in ONLY_CURRENT:
                continue
            spec = clients.spec(path, variant.server.grpc_url, variant.server.http_url)
            calls[(path, variant.name)] = call = spec.connect()
            checks[(path, variant.name)] = _check(call, requests, reference, clients.PATHS[path][2])
    windows: dict = {key: [] for key in calls}
    local = {"engine_step": [], "engine_step_1_thread": [], "tokenizer": [], "service": []}
    busy = []
    for r in range(settings.rounds):
        busy.append(machine.cpu_busy(0.5))
        order = variants if r % 2 == 0 else variants[::-1]
        for path in settings.paths:
            for variant in order:
                if (path, variant.name) not in calls:
                    continue
                with Window(variant) as w:
                    lat = latency_loop(calls[(path, variant.name)], requests, settings.per_round, 120,
                                       f"round {r + 1}/{settings.rounds} {path} {variant.name}")
                windows[(path, variant.name)].append(
                    {"latencies_ms": lat, "requests": len(lat), "server_cpu_s": w.cpu, "client_cpu_s": w.client,
                     "stats": w.stats, "hops": w.encoder_hops(settings.metrics_lag_s)})
        cycle = [requests[i % len(requests)] for i in range(settings.per_round)]
        local["engine_step"] += inproc.step_ms(cycle)
        local["engine_step_1_thread"] += inproc.step_ms(cycle, threads=1)
        local["tokenizer"] += inproc.tokenizer_ms(cycle)
        local["service"] += inproc.service_ms(cycle)
    paths: dict = {}
    for (path, name), items in windows.items():
        paths.setdefault(path, {})[name] = {**summarize(_merge(items)), "min_cosine": checks[(path, name)]}
    local_stats = {k: latency_stats(v) for k, v in local.items()}
    local_stats["torch_threads"] = inproc.threads
    return paths, {"inproc": local_stats, "machine_busy_before_rounds": busy}


def load(settings: Settings, variants, requests) -> list[dict]:
    """Closed-loop cells; `load_rounds` windows per server, alternating order, summed (p50/p99: round means)."""
    cells = []
    for path in settings.load_paths:
        for concurrency in settings.concurrencies:
            cell = {"path": path, "concurrency": concurrency, "results": {}}
            mine = [v for v in variants if v.name == "current" or path not in ONLY_CURRENT]
            windows: dict = {v.name: [] for v in mine}
            triton: dict = {}  # variant -> summed Triton statistics of its windows
            for r in range(settings.load_rounds):
                for variant in (mine if r % 2 == 0 else mine[::-1]):
                    spec = clients.spec(path, variant.server.grpc_url, variant.server.http_url)
                    busy = machine.cpu_busy(0.5)
                    with Window(variant) as w:
                        label = f"load {path} x{concurrency} {variant.name} ({r + 1}/{settings.load_rounds})"
                        stats = process_loop(spec, requests, concurrency, settings.load_seconds, label)
                    windows[variant.name].append((stats, w.cpu, busy))
                    hops.add(triton.setdefault(variant.name, {}), w.stats)
            for name, items in windows.items():
                seconds = sum(s["seconds"] for s, _, _ in items)
                requests_done = sum(s["requests_per_s"] * s["seconds"] for s, _, _ in items)
                served = requests_done + concurrency * len(items)  # + each client's warm-up request
                cpu: dict = {}
                for _, window_cpu, _ in items:
                    hops.add(cpu, window_cpu)
                cell["results"][name] = {
                    "requests_per_s": requests_done / seconds, "seconds": seconds, "requests": requests_done,
                    "p50_ms": float(np.mean([s["p50_ms"] for s, _, _ in items])),
                    "p99_ms": float(np.mean([s["p99_ms"] for s, _, _ in items])),
                    "server_cpu_ms_per_request": 1e3 * sum(cpu.values()) / served,
                    "server_cpu_ms_by_process": {k: 1e3 * v / served for k, v in sorted(cpu.items()) if v > 0},
                    "machine_busy_before": round(float(np.mean([b for _, _, b in items])), 3),
                    "rounds": len(items),
                    # > 1 where Triton handed a model several requests per execute (its dynamic batcher)
                    "requests_per_execution": {m: v["requests"] / v["executions"]
                                               for m, v in hops.triton_means(triton.get(name, {})).items()
                                               if v["executions"]}}
            cells.append(cell)
    return cells


def overheads(paths: dict, inproc: dict) -> None:
    """served p50 - (in-process ModelRunner.step p50 [+ tokenizer p50 where the server tokenizes])."""
    step, tok = inproc["engine_step"]["p50_ms"], inproc["tokenizer"]["p50_ms"]
    for path, by_variant in paths.items():
        _, tokenizes, is_model = clients.PATHS[path]
        model = (step + (tok if tokenizes else 0.0)) if is_model else 0.0
        for result in by_variant.values():
            result["model_ms"] = model
            result["overhead_p50_ms"] = result["p50_ms"] - model
            result["overhead_p99_ms"] = result["p99_ms"] - model


def run(model_dir: str | None, compare: list[str], settings: Settings, out_json: Path, desc: dict,
        variant_specs: list[str] = ()) -> dict:
    from sentence_transformers import SentenceTransformer

    from .inproc import InProcess

    work = Path(tempfile.mkdtemp(prefix="perf-overhead-"))
    tiny = REPO / "perf" / ".peers" / "overhead-tiny"
    model_dir = os.path.abspath(model_dir) if model_dir else str(build_tiny_model(tiny))
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    floor = write_floor_repository(work / "floor", int(config["hidden_size"]))
    variants = servers.variants_for(compare, list(variant_specs), work)
    reference = SentenceTransformer(model_dir, device="cpu")
    maker = TextMaker(os.path.join(model_dir, "tokenizer.json"), int(config["max_position_embeddings"]))
    requests = maker.requests(16, 1, settings.seq_len, reference.max_seq_length)
    inproc = InProcess(model_dir)
    results = {"profile": "overhead", "description": __doc__.split("\n\n")[0].replace("\n", " "),
               "machine": desc, "settings": asdict(settings), "env": servers.machine_env(),
               "model": {"dir": model_dir, "config": {k: config[k] for k in SHAPE}, "tiny_shape": SHAPE},
               "variants": [v.name for v in variants],
               "variant_env": {v.name: v.env for v in variants if v.env},
               "variant_roots": {v.name: str(v.root) for v in variants},
               "paths_described": {p: clients.PATHS[p][0] for p in settings.paths},
               "started": datetime.datetime.now().isoformat(timespec="seconds")}
    try:
        servers.start(variants, model_dir, [floor, BASELINES], work, log)
        results["paths"], extra = sequential(settings, variants, requests, reference, inproc)
        results.update(extra)
        overheads(results["paths"], results["inproc"])
        out_json.write_text(json.dumps(results, indent=1))
        results["load"] = load(settings, variants, requests)
    finally:
        inproc.close()
        servers.stop(variants, log)
    results["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    results["machine"]["load_avg_at_end"] = os.getloadavg()
    out_json.write_text(json.dumps(results, indent=1))
    return results


def measure(args, out_json: Path, desc: dict) -> dict:
    """`python -m perf run --profile overhead`: `--cells` names client paths; `--compare`, `--variant` add servers."""
    settings = Settings().scaled(args.scale) if args.scale != 1 else Settings()
    if args.cells:
        settings = settings.only(args.cells.split(","))
    return run(args.model_dir, args.compare.split(",") if args.compare else [], settings, out_json, desc,
               args.variant or [])
