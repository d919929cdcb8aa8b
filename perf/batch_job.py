"""Batch API numbers as ratios of one run (docs/benchmarks.md): a job's texts/s against the bulk CLI's
on the same texts, and interactive p50/p99 through the gateway idle, beside a job and beside the bulk
CLI (the `mix` profile's method: phases in ABBA order, p99 against idle p99 plus one batch duration).
    python -m perf.batch_job [--texts 3000] [--phase 30] [--rounds 1] [--no-throughput]   (starts its own server)"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import openai

from rose_client import bulk
from rose_triton.server import TritonServer

from .machine import describe, machine_line
from .mix import server_metrics
from .runner import model_info
from .texts import TextMaker

MODEL, LINE_TEXTS, DOC_TOKENS, QUERY_TOKENS, CLIENTS = "all-MiniLM-L6-v2", 64, 128, 32, 2
ALONE_S = 3.0  # seconds of bulk work alone before each phase's interactive clients: its step is "one batch"
TERMINAL = ("completed", "failed", "expired", "cancelled")


def make_texts(count: int, tokens: int, seed: int) -> list[str]:
    model, rng = model_info(None), random.Random(seed)
    maker = TextMaker(os.path.join(model["dir"], "tokenizer.json"), model["max_positions"])
    return [maker.text(tokens, rng) for _ in range(count)]


def bulk_cli(server: TritonServer, texts: list[str], folder: Path) -> float:
    """texts/s of the bulk CLI in process (its model probe included)."""
    (folder / "bulk.txt").write_text("\n".join(texts) + "\n")
    started = time.perf_counter()
    assert bulk.main([str(folder / "bulk.txt"), str(folder / "bulk.npy"), "--url", server.grpc_url, "--no-progress",
                      "--overwrite"]) == 0
    return len(texts) / (time.perf_counter() - started)


def submit(client: openai.OpenAI, texts: list[str]):
    lines = "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/embeddings",
                                "body": {"model": MODEL, "input": texts[i:i + LINE_TEXTS]}}) + "\n"
                    for i in range(0, len(texts), LINE_TEXTS))
    upload = client.files.create(file=("job.jsonl", lines.encode()), purpose="batch")
    return client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")


def finished(client: openai.OpenAI, batch_id: str):
    while (batch := client.batches.retrieve(batch_id)).status not in TERMINAL:
        time.sleep(0.1)
    return batch


def batch_job(client: openai.OpenAI, texts: list[str]) -> float:
    """texts/s of a job, upload to `completed`."""
    started = time.perf_counter()
    done = finished(client, submit(client, texts).id)
    assert done.status == "completed" and done.request_counts.completed == done.request_counts.total, done
    return len(texts) / (time.perf_counter() - started)


def interactive(gateway_url: str, queries: list[str], seconds: float) -> list[float]:
    """Latencies (ms) of single-query /v1/embeddings calls from CLIENTS closed loops."""
    host, port = gateway_url.removeprefix("http://").split(":")
    latencies, deadline = [], time.perf_counter() + seconds

    def client(i: int) -> None:
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        while time.perf_counter() < deadline:
            started, i = time.perf_counter(), i + CLIENTS
            connection.request("POST", "/v1/embeddings", json.dumps({"model": MODEL, "input": [queries[i % 200]]}),
                               {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            assert response.status == 200, response.status
            latencies.append((time.perf_counter() - started) * 1000)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies


def mean_step_ms(before: dict, after: dict) -> float:
    return (after["step_seconds_sum"] - before["step_seconds_sum"]) * 1000 / max(1, after["steps"] - before["steps"])


def batch_tokens(server: TritonServer) -> float:
    page = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
               if line.startswith("rose_priority_tokens_total{") and 'priority="batch"' in line)


def start_background(kind: str, client: openai.OpenAI, server: TritonServer, texts: list[str], folder: Path):
    """Start the phase's bulk work (a job or the bulk CLI), running once this returns; -> its stop call."""
    started = batch_tokens(server)
    if kind == "job":
        batch = submit(client, texts)
    else:
        (folder / "bg.txt").write_text("\n".join(texts) + "\n")
        process = subprocess.Popen([sys.executable, "-m", "rose_client.bulk", str(folder / "bg.txt"),
                                    str(folder / "bg.npy"), "--url", server.grpc_url, "--no-progress", "--overwrite"],
                                   stderr=subprocess.DEVNULL)
    while batch_tokens(server) == started:  # the encoder runs some of its tokens
        time.sleep(0.1)

    def stop():
        if kind == "job":
            assert client.batches.retrieve(batch.id).status == "in_progress", "the job ended inside the phase"
            client.batches.cancel(batch.id)
            finished(client, batch.id)
        else:
            assert process.poll() is None, "the bulk CLI ended inside the phase"
            process.send_signal(signal.SIGINT)
            process.wait()
            [leftover.unlink() for leftover in folder.glob("bg.*")]
    return stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.batch_job", description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=3000)
    parser.add_argument("--phase", type=float, default=30.0, help="seconds of each interactive phase")
    parser.add_argument("--rounds", type=int, default=1,
                        help="throughput rounds (bulk CLI, job, job, bulk CLI each): on a shared machine the load "
                             "moves between runs, more rounds give more pairs to compare")
    parser.add_argument("--no-throughput", action="store_true", help="the interactive phases only")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="rose-batch-perf-"))
    texts, queries = make_texts(args.texts, DOC_TOKENS, 0), make_texts(200, QUERY_TOKENS, 1)
    server = TritonServer(folder / "server.log", gateway=True, env={"ROSE_GATEWAY_DATA_DIR": str(folder / "data")})
    rates, phases = {"bulk": [], "job": []}, {"idle": [], "job": [], "bulk": []}
    steps, alone_steps, bulk_rates = {"job": [], "bulk": []}, {"job": [], "bulk": []}, {"job": [], "bulk": []}
    try:
        client = openai.OpenAI(base_url=f"{server.gateway_url}/v1", api_key="unused", max_retries=0)
        client.embeddings.create(model=MODEL, input=texts[:64])  # warm
        for kind in () if args.no_throughput else ("bulk", "job", "job", "bulk") * args.rounds:
            rates[kind].append(bulk_cli(server, texts, folder) if kind == "bulk" else batch_job(client, texts))
        for kind in ("idle", "job", "bulk", "bulk", "job", "idle"):
            stop = start_background(kind, client, server, texts * 8, folder) if kind != "idle" else None
            if stop is not None:  # its steps alone, before the interactive clients start: one batch
                alone = server_metrics(server.metrics_url)
                time.sleep(ALONE_S)
                alone_steps[kind].append(mean_step_ms(alone, server_metrics(server.metrics_url)))
            before, tokens_before, phase_start = server_metrics(server.metrics_url), batch_tokens(server), time.perf_counter()
            phases[kind] += interactive(server.gateway_url, queries, args.phase)
            after = server_metrics(server.metrics_url)
            if kind != "idle":
                bulk_rates[kind].append((batch_tokens(server) - tokens_before) / (time.perf_counter() - phase_start))
            if stop is not None:
                steps[kind].append(mean_step_ms(before, after))
                stop()
    finally:
        server.kill()
    p99 = {kind: float(np.percentile(values, 99)) for kind, values in phases.items()}
    rows = [f"| interactive p50 / p99, {kind} | {np.percentile(phases[kind], 50):.1f} / {p99[kind]:.1f} ms "
            f"({len(phases[kind])} calls) |" for kind in phases]
    if rates["job"]:
        job, cli = np.mean(rates["job"]), np.mean(rates["bulk"])
        rows[:0] = [f"| texts/s: bulk CLI {cli:.0f} {np.round(rates['bulk'])}, job {job:.0f} {np.round(rates['job'])} | job / bulk CLI "
                    f"{job / cli:.2f}x (target >= 0.9) |"]
        if args.rounds > 1:  # each round's two jobs against its two bulk CLI runs
            per_round = [np.mean(rates["job"][i:i + 2]) / np.mean(rates["bulk"][i:i + 2])
                         for i in range(0, len(rates["job"]), 2)]
            rows[1:1] = [f"| job / bulk CLI by round (median) | {' '.join(f'{r:.2f}' for r in per_round)} "
                         f"({np.median(per_round):.2f}x) |"]
    batch_ms = {kind: np.mean(values) for kind, values in steps.items()}
    alone_ms = {kind: np.mean(values) for kind, values in alone_steps.items()}
    rows += [f"| encoder step, mean over the phase beside the job / the bulk CLI | {batch_ms['job']:.1f} / "
             f"{batch_ms['bulk']:.1f} ms |",
             f"| one batch: encoder step of the job / the bulk CLI alone ({ALONE_S:.0f} s before the phase) | "
             f"{alone_ms['job']:.1f} / {alone_ms['bulk']:.1f} ms |",
             f"| p99 beside a job / (1.5 x idle p99 + one batch: the larger of the two above, as `mix`) | "
             f"{p99['job'] / (1.5 * p99['idle'] + max(alone_ms['job'], batch_ms['job'])):.2f} (target <= 1) |",
             f"| the same with the phase's mean step as the batch | "
             f"{p99['job'] / (1.5 * p99['idle'] + batch_ms['job']):.2f} |",
             f"| p99 beside a job / p99 beside the bulk CLI | {p99['job'] / p99['bulk']:.2f} |",
             f"| batch-class tokens/s beside the interactive clients: job / bulk CLI | "
             f"{np.mean(bulk_rates['job']):.0f} / {np.mean(bulk_rates['bulk']):.0f} |"]
    print(f"Machine: {machine_line(describe())}\n\n{args.texts} texts of {DOC_TOKENS} tokens, {LINE_TEXTS} a line\n\n"
          "| what | value |\n| --- | --- |\n" + "\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
