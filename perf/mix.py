"""`--profile mix`: a bulk backfill and an interactive stream on one encoder, priority classes on and off
in the same run (docs/benchmarks.md, "mix")."""
from __future__ import annotations

import datetime
import random
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from engine_lib.options import BATCH, INTERACTIVE, PRIORITY_PARAMETER
from engine_lib.runner.self_check import MIN_COSINE
from rose_triton.server import TritonServer

from .machine import machine_line
from .measure import closed_loop, combine, latency_stats, log, min_cosine
from .profiles import Cell
from .runner import Reference, model_info, server_env
from .targets import RoseStream
from .texts import Request, TextMaker

SIZES = dict(bulk_clients=4, bulk_texts=64, bulk_tokens=256, interactive_clients=4, query_tokens=32,
             phase_s=90.0, idle_s=20.0, batch_repeats=5, rounds=2)
TARGET_P99_BATCHES = 2.0   # p99 on <= idle p99 + this many batch durations
TARGET_P99_RATIO = 5.0     # p99 off / p99 on >= this
TARGET_BULK_RATIO = 0.9    # bulk emb/s on / off >= this


def stream_caller(grpc_url: str, priority: str):
    """call(request) -> rows: one gRPC stream to rose_encoder, pre-tokenized, in class `priority`."""
    return RoseStream(grpc_url, pre_tokenized=True, parameters=((PRIORITY_PARAMETER, priority),)).connect()


def run_clients(grpc_url: str, groups: dict[str, tuple[int, str, list[Request]]], duration: float) -> dict:
    """Closed-loop client threads per group {name: (clients, class, requests)}, all for `duration` s;
    -> {name: combined stats + every latency}. Each client finishes the request in flight at the deadline."""
    start_at = time.time() + 0.5
    parts: dict[str, list] = {name: [] for name in groups}
    errors: list[str] = []

    def client(name, k, priority, requests):
        call = stream_caller(grpc_url, priority)
        try:
            parts[name].append(closed_loop(call, requests, start_at, duration, offset=k * 3))
        except Exception as exc:  # reported in the results; the phase fails
            errors.append(f"{name} client {k}: {exc!r}")
        finally:
            call.close()

    threads = [threading.Thread(target=client, args=(name, k, priority, requests), daemon=True)
               for name, (clients, priority, requests) in groups.items() for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return {name: {**combine(p), "latencies": [x for part in p for x in part["latencies_ms"]]}
            for name, p in parts.items()}


def server_metrics(metrics_url: str) -> dict[str, float]:
    """The encoder's step and promotion counters (rose_encoder only)."""
    body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    samples = {}
    for line in body.splitlines():
        if line.startswith("rose_") and 'model="rose_encoder"' in line:
            key, value = line.rsplit(" ", 1)
            samples[key.split("{")[0]] = float(value)  # the series read here have one label set each
    return {"step_seconds_sum": samples["rose_step_seconds_sum"], "steps": samples["rose_step_seconds_count"],
            "step_tokens_sum": samples["rose_step_tokens_sum"], "promoted": samples["rose_promoted_sequences_total"],
            "budget": samples["rose_batch_token_budget"]}


def _delta(before: dict, after: dict) -> dict:
    steps = after["steps"] - before["steps"]
    return {"steps": int(steps), "mean_step_s": (after["step_seconds_sum"] - before["step_seconds_sum"]) / steps
            if steps else None, "mean_step_tokens": (after["step_tokens_sum"] - before["step_tokens_sum"]) / steps
            if steps else None, "promoted_sequences": int(after["promoted"] - before["promoted"])}


def check_answers(grpc_url: str, reference: Reference, cell: Cell, requests: list[Request]) -> float:
    """Min cosine of the served rows of `requests` against sentence-transformers (both classes)."""
    worst = 1.0
    for priority, request in zip((BATCH, INTERACTIVE) * len(requests), requests):
        call = stream_caller(grpc_url, priority)
        try:
            worst = min(worst, min_cosine(call(request), reference.embed(cell, request)))
        finally:
            call.close()
    return worst


def summarize(idle: dict, batch_s: float, on: dict, off: dict, step_s: float | None = None) -> dict:
    """`batch_s`: a full batch alone; `step_s`: the mean engine step while priority was on (the batches the
    queries actually waited for, on a machine the clients share); the p99 bound uses the larger."""
    bound = idle["p99_ms"] + TARGET_P99_BATCHES * max(batch_s, step_s or 0.0) * 1e3
    ratio = off["interactive"]["p99_ms"] / on["interactive"]["p99_ms"]
    bulk = on["bulk"]["embeddings_per_s"] / off["bulk"]["embeddings_per_s"]
    return {"idle_p99_ms": idle["p99_ms"], "batch_s": batch_s, "on_step_s": step_s, "p99_bound_ms": bound,
            "interactive_p99_on_ms": on["interactive"]["p99_ms"], "interactive_p99_off_ms": off["interactive"]["p99_ms"],
            "interactive_p50_on_ms": on["interactive"]["p50_ms"], "interactive_p50_off_ms": off["interactive"]["p50_ms"],
            "p99_off_over_on": ratio, "bulk_on_over_off": bulk,
            "targets": {"p99_on_within_idle_plus_two_batches": on["interactive"]["p99_ms"] <= bound,
                        f"p99_off_over_on_at_least_{TARGET_P99_RATIO:g}": ratio >= TARGET_P99_RATIO,
                        "bulk_within_10_percent": bulk >= TARGET_BULK_RATIO}}


def _pool(latencies: list[dict], key: str) -> dict:
    """Rounds of one phase pooled: latency stats over every request, throughput over the summed spans."""
    parts = [r[key] for r in latencies]
    stats = latency_stats([x for p in parts for x in p["latencies"]])
    seconds = sum(p["seconds"] for p in parts)
    return {**stats, "embeddings_per_s": sum(p["embeddings"] for p in parts) / seconds, "seconds": seconds}


def measure(args, out_json, machine: dict) -> dict:
    sizes = {**SIZES, "phase_s": max(10.0, SIZES["phase_s"] * args.scale),
             "idle_s": max(5.0, SIZES["idle_s"] * args.scale)}
    model = model_info(args.model_dir)
    maker = TextMaker(str(Path(model["dir"]) / "tokenizer.json"), model["max_positions"])
    rng = random.Random(20)
    bulk_tokens = min(sizes["bulk_tokens"], model["max_positions"])
    bulk = [maker.request([maker.text(bulk_tokens, rng) for _ in range(sizes["bulk_texts"])]) for _ in range(8)]
    queries = [maker.request([maker.text(sizes["query_tokens"], rng)]) for _ in range(32)]
    env = {**({"ROSE_MODEL_DIR": model["dir"]} if args.model_dir else {}), **server_env(args)}
    log_dir = Path(tempfile.mkdtemp(prefix="perf-mix-"))
    log(f"mix: starting tritonserver (log {log_dir / 'server.log'}), environment {env}")
    started = datetime.datetime.now().isoformat(timespec="seconds")
    server = TritonServer(log_dir / "server.log", env=env, ready_timeout=600)
    try:
        url = server.grpc_url
        budget = int(server_metrics(server.metrics_url)["budget"])
        per_batch = max(1, budget // bulk_tokens)
        full_batch = maker.request([maker.text(bulk_tokens, rng) for _ in range(per_batch)])
        cell = Cell("mix", "mix", "load", "tokens", bulk_tokens, sizes["bulk_texts"])
        cosine = check_answers(url, Reference(model["dir"], model["max_positions"]), cell,
                               [bulk[0], queries[0], full_batch, queries[1]])
        log(f"mix: answers checked against sentence-transformers, min cosine {cosine:.6f}")
        if cosine < MIN_COSINE:
            raise SystemExit(f"mix: served rows differ from sentence-transformers (min cosine {cosine:.5f})")
        idle = run_clients(url, {"interactive": (sizes["interactive_clients"], INTERACTIVE, queries)},
                           sizes["idle_s"])["interactive"]
        log(f"mix: idle interactive p50 {idle['p50_ms']:.1f} ms, p99 {idle['p99_ms']:.1f} ms")
        call = stream_caller(url, BATCH)
        try:
            batch_times = []
            for _ in range(sizes["batch_repeats"]):
                t0 = time.perf_counter()
                call(full_batch)
                batch_times.append(time.perf_counter() - t0)
        finally:
            call.close()
        batch_s = float(np.median(batch_times))
        log(f"mix: a full batch ({per_batch} x {bulk_tokens} = {per_batch * bulk_tokens} tokens) alone: "
            f"median {batch_s:.2f} s")
        rounds = []
        for number in range(sizes["rounds"]):
            order = (("on", BATCH), ("off", INTERACTIVE))
            for phase, bulk_class in order if number % 2 == 0 else order[::-1]:
                before = server_metrics(server.metrics_url)
                stats = run_clients(url, {"bulk": (sizes["bulk_clients"], bulk_class, bulk),
                                          "interactive": (sizes["interactive_clients"], INTERACTIVE, queries)},
                                    sizes["phase_s"])
                server_side = _delta(before, server_metrics(server.metrics_url))
                rounds.append({"round": number, "phase": phase, "server": server_side, **stats})
                log(f"mix: round {number} priority {phase}: interactive p50 {stats['interactive']['p50_ms']:.0f} ms "
                    f"p99 {stats['interactive']['p99_ms']:.0f} ms ({stats['interactive']['n']} queries); "
                    f"bulk {stats['bulk']['embeddings_per_s']:.1f} emb/s; steps {server_side}")
    finally:
        server.stop()
    phases = {phase: {key: _pool([r for r in rounds if r["phase"] == phase], key) for key in ("bulk", "interactive")}
              for phase in ("on", "off")}
    for r in rounds:  # keep the per-round figures, not every latency twice
        for key in ("bulk", "interactive"):
            r[key].pop("latencies", None)
    on_steps = [r["server"] for r in rounds if r["phase"] == "on" and r["server"]["steps"]]
    step_s = sum(d["mean_step_s"] * d["steps"] for d in on_steps) / sum(d["steps"] for d in on_steps) \
        if on_steps else None
    summary = summarize(idle, batch_s, phases["on"], phases["off"], step_s)
    idle.pop("latencies", None)
    return {
        "profile": "mix", "machine": machine, "model": model, "started": started,
        "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "description": "A bulk backfill and an interactive stream on one encoder, priority classes on and off in "
                       "the same run (pre-tokenized gRPC streaming to rose_encoder).",
        "settings": {**sizes, "bulk_tokens": bulk_tokens, "max_batch_tokens": budget, "server_env": env,
                     "full_batch": f"{per_batch} x {bulk_tokens}"},
        "check": {"min_cosine_vs_sentence_transformers": cosine},
        "idle": idle, "batch_times_s": batch_times, "rounds": rounds, "phases": phases, "summary": summary,
        "ok": True,
    }


def markdown(results: dict) -> str:
    s, m, st = results["summary"], results["machine"], results["settings"]
    on, off = results["phases"]["on"], results["phases"]["off"]
    lines = [f"# Benchmark `mix`: {m['date']}", "", results["description"], "",
             f"- Machine: {machine_line(m)}", f"- Commit: `{m['git_commit']}`; model: {results['model']['name']}",
             f"- Settings: {st['bulk_clients']} bulk clients x {st['bulk_texts']} texts x {st['bulk_tokens']} tokens; "
             f"{st['interactive_clients']} interactive clients, single queries of {st['query_tokens']} tokens; "
             f"max_batch_tokens {st['max_batch_tokens']}; {st['rounds']} rounds of on/off, "
             f"{st['phase_s']:.0f} s each; server environment {st['server_env'] or 'default'}",
             f"- Checked first: served rows of both classes vs sentence-transformers, min cosine "
             f"{results['check']['min_cosine_vs_sentence_transformers']:.6f}", "",
             "| phase | interactive p50 ms | interactive p99 ms | queries | bulk emb/s |", "|---|---|---|---|---|",
             f"| idle (no bulk) | {results['idle']['p50_ms']:.0f} | {results['idle']['p99_ms']:.0f} | "
             f"{results['idle']['n']} | - |"]
    for name, phase in (("priority on", on), ("priority off (one class, FCFS)", off)):
        lines.append(f"| {name} | {phase['interactive']['p50_ms']:.0f} | {phase['interactive']['p99_ms']:.0f} | "
                     f"{phase['interactive']['n']} | {phase['bulk']['embeddings_per_s']:.1f} |")
    lines += ["", f"A full batch ({st['full_batch']} tokens) alone: median {s['batch_s']:.2f} s "
              f"(runs: {', '.join(f'{t:.2f}' for t in results['batch_times_s'])}); mean engine step while "
              f"priority was on: {s.get('on_step_s') or 0:.2f} s. The bound below takes the larger.", "",
              "Targets:", "",
              f"- interactive p99 on {s['interactive_p99_on_ms']:.0f} ms <= idle p99 + 2 batch durations "
              f"{s['p99_bound_ms']:.0f} ms: {'met' if s['targets']['p99_on_within_idle_plus_two_batches'] else 'NOT met'}",
              f"- p99 off / on = {s['p99_off_over_on']:.1f}x (target >= {TARGET_P99_RATIO:g}x): "
              f"{'met' if s['p99_off_over_on'] >= TARGET_P99_RATIO else 'NOT met'}",
              f"- bulk emb/s on / off = {s['bulk_on_over_off']:.2f} (target >= {TARGET_BULK_RATIO}): "
              f"{'met' if s['targets']['bulk_within_10_percent'] else 'NOT met'}", ""]
    lines += [f"- round {r['round']} {r['phase']}: interactive p50 / p99 {r['interactive']['p50_ms']:.0f} / "
              f"{r['interactive']['p99_ms']:.0f} ms, bulk {r['bulk']['embeddings_per_s']:.1f} emb/s, engine {r['server']}"
              for r in results["rounds"]]
    return "\n".join(lines) + "\n"
