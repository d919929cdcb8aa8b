"""Batch API numbers, as ratios measured in one run on one machine (docs/benchmarks.md, "Batch jobs"):
a job's throughput against the bulk CLI (python -m rose_client.bulk) on the same texts, and the
interactive p99 through the gateway with and without a job running (the `mix` profile's method:
idle and loaded phases in ABBA order, the loaded p99 against idle p99 plus one batch duration).

    python -m perf.batch_job [--texts 3000] [--phase 30] [--out FILE.md]

It starts its own server (Triton and the gateway, its Batch API in a temporary folder)."""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import statistics
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

MODEL = "all-MiniLM-L6-v2"
LINE_TEXTS = 64     # texts per batch line (one /v1/embeddings request)
DOC_TOKENS = 128
QUERY_TOKENS = 32
INTERACTIVE_CLIENTS = 2
TERMINAL = ("completed", "failed", "expired", "cancelled")


def make_texts(count: int, tokens: int, seed: int) -> list[str]:
    model = model_info(None)
    maker = TextMaker(os.path.join(model["dir"], "tokenizer.json"), model["max_positions"])
    rng = random.Random(seed)
    return [maker.text(tokens, rng) for _ in range(count)]


def bulk_cli(server: TritonServer, texts: list[str], folder: Path) -> float:
    """texts/s of the bulk CLI, in process (no interpreter start), its model probe included."""
    source, out = folder / "bulk.txt", folder / "bulk.npy"
    source.write_text("\n".join(texts) + "\n")
    started = time.perf_counter()
    status = bulk.main([str(source), str(out), "--url", server.grpc_url, "--no-progress", "--overwrite"])
    elapsed = time.perf_counter() - started
    assert status == 0, f"bulk CLI exited {status}"
    return len(texts) / elapsed


def job_lines(texts: list[str]) -> bytes:
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": MODEL, "input": texts[i:i + LINE_TEXTS]}} for i in range(0, len(texts), LINE_TEXTS)]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def submit(client: openai.OpenAI, texts: list[str]):
    upload = client.files.create(file=("job.jsonl", job_lines(texts)), purpose="batch")
    return client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")


def wait_finished(client: openai.OpenAI, batch_id: str):
    while (batch := client.batches.retrieve(batch_id)).status not in TERMINAL:
        time.sleep(0.1)
    return batch


def batch_job(client: openai.OpenAI, texts: list[str]) -> float:
    """texts/s of a job, from its creation (the file uploaded) to `completed`."""
    upload = client.files.create(file=("job.jsonl", job_lines(texts)), purpose="batch")
    started = time.perf_counter()
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    done = wait_finished(client, batch.id)
    elapsed = time.perf_counter() - started
    assert done.status == "completed" and done.request_counts.completed == done.request_counts.total, done
    return len(texts) / elapsed


def interactive(gateway_url: str, queries: list[str], seconds: float) -> list[float]:
    """Latencies (ms) of single-query /v1/embeddings calls, INTERACTIVE_CLIENTS closed loops."""
    host, port = gateway_url.removeprefix("http://").split(":")
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    def client(k: int) -> None:
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        i = k
        while time.perf_counter() < deadline:
            body = json.dumps({"model": MODEL, "input": [queries[i % len(queries)]]})
            started = time.perf_counter()
            connection.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            assert response.status == 200, response.status
            latencies.append((time.perf_counter() - started) * 1000)
            i += INTERACTIVE_CLIENTS
        connection.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(INTERACTIVE_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def start_background(kind: str, client: openai.OpenAI, server: TritonServer, texts: list[str], folder: Path):
    """Start the phase's bulk work, running once this returns; -> a call that stops it (None: idle)."""
    if kind == "job":
        batch = submit(client, texts)
        while client.batches.retrieve(batch.id).request_counts.completed < 1:
            time.sleep(0.1)

        def stop():
            running = client.batches.retrieve(batch.id)
            assert running.status == "in_progress", f"the job ended inside the phase: {running.status}"
            client.batches.cancel(batch.id)
            wait_finished(client, batch.id)
        return stop
    if kind == "bulk":
        source = folder / "background.txt"
        source.write_text("\n".join(texts) + "\n")
        started = batch_tokens(server)
        process = subprocess.Popen([sys.executable, "-m", "rose_client.bulk", str(source), str(folder / "bg.npy"),
                                    "--url", server.grpc_url, "--no-progress", "--overwrite"],
                                   stderr=subprocess.DEVNULL)
        while batch_tokens(server) == started:  # it runs once the encoder has run some of its tokens
            assert process.poll() is None, "the bulk CLI failed"
            time.sleep(0.1)

        def stop():
            assert process.poll() is None, "the bulk CLI ended inside the phase"
            process.send_signal(signal.SIGINT)
            process.wait()
            for leftover in folder.glob("bg.*"):
                leftover.unlink()
        return stop
    return None


def batch_tokens(server: TritonServer) -> float:
    page = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
               if line.startswith("rose_priority_tokens_total{") and 'priority="batch"' in line)


def p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(prog="python -m perf.batch_job", description=__doc__.splitlines()[0])
    args.add_argument("--texts", type=int, default=3000)
    args.add_argument("--phase", type=float, default=30.0, help="seconds of each interactive phase")
    args.add_argument("--out", default="")
    args.add_argument("--no-throughput", action="store_true", help="the interactive phases only")
    args = args.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="rose-batch-perf-"))
    texts, queries = make_texts(args.texts, DOC_TOKENS, 0), make_texts(200, QUERY_TOKENS, 1)
    server = TritonServer(folder / "server.log", gateway=True, env={"ROSE_GATEWAY_DATA_DIR": str(folder / "data")})
    try:
        client = openai.OpenAI(base_url=f"{server.gateway_url}/v1", api_key="unused", max_retries=0)
        client.embeddings.create(model=MODEL, input=texts[:64])  # warm
        throughput = {"bulk": [], "job": []}
        for kind in ("bulk", "job", "job", "bulk")[:0 if args.no_throughput else 4]:  # ABBA
            rate = bulk_cli(server, texts, folder) if kind == "bulk" else batch_job(client, texts)
            throughput[kind].append(rate)
            print(f"{kind}: {rate:.0f} texts/s", flush=True)
        phases = {"idle": [], "job": [], "bulk": []}
        steps = {"job": [], "bulk": []}
        for kind in ("idle", "job", "bulk", "bulk", "job", "idle"):
            background = start_background(kind, client, server, texts * 8, folder)
            before = server_metrics(server.metrics_url)
            phases[kind] += interactive(server.gateway_url, queries, args.phase)
            after = server_metrics(server.metrics_url)
            if background is not None:
                steps[kind].append((after["step_seconds_sum"] - before["step_seconds_sum"]) /
                                   max(1, after["steps"] - before["steps"]) * 1000)
                background()
            print(f"{kind}: p50 {p(phases[kind], 50):.1f} ms p99 {p(phases[kind], 99):.1f} ms", flush=True)
    finally:
        server.kill()
    bulk_rate = statistics.mean(throughput["bulk"] or [float("nan")])
    job_rate = statistics.mean(throughput["job"] or [float("nan")])
    batch_ms, bulk_batch_ms = statistics.mean(steps["job"]), statistics.mean(steps["bulk"])
    idle99, job99, bulk99 = p(phases["idle"], 99), p(phases["job"], 99), p(phases["bulk"], 99)
    report = [
        "# Batch API: job throughput and interactive latency (`python -m perf.batch_job`)", "",
        f"Machine: {machine_line(describe())}; shared with other work while measured, so only the ratios "
        "of this one run mean anything.", "",
        f"{args.texts} texts of {DOC_TOKENS} tokens, {LINE_TEXTS} texts a line; ABBA order.", "",
        "| what | value |", "| --- | --- |",
        *([] if args.no_throughput else [
            f"| bulk CLI | {bulk_rate:.0f} texts/s ({', '.join(f'{r:.0f}' for r in throughput['bulk'])}) |",
            f"| Batch API job | {job_rate:.0f} texts/s ({', '.join(f'{r:.0f}' for r in throughput['job'])}) |",
            f"| job / bulk CLI | {job_rate / bulk_rate:.2f}x (target >= 0.9) |"]),
        f"| interactive p50 / p99, idle | {p(phases['idle'], 50):.1f} / {idle99:.1f} ms ({len(phases['idle'])} calls) |",
        f"| interactive p50 / p99, a job running | {p(phases['job'], 50):.1f} / {job99:.1f} ms "
        f"({len(phases['job'])} calls) |",
        f"| interactive p50 / p99, the bulk CLI running | {p(phases['bulk'], 50):.1f} / {bulk99:.1f} ms "
        f"({len(phases['bulk'])} calls) |",
        f"| encoder batch duration while the job / the bulk CLI runs | {batch_ms:.1f} / {bulk_batch_ms:.1f} ms |",
        f"| p99 with a job / (1.5 x idle p99 + one batch) | {job99 / (1.5 * idle99 + batch_ms):.2f} (target <= 1) |",
        f"| p99 with a job / p99 with the bulk CLI | {job99 / bulk99:.2f} |",
    ]
    text = "\n".join(report) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
