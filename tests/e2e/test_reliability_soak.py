"""Bounded soak on the session server: mixed request sizes on all four paths,
several requests in flight per gRPC stream. Every answer is checked row by
row against its own texts' reference: zero lost, duplicated or misrouted.
It ends after ROSE_SOAK_REQUESTS answers (default 24, whatever the machine's
pace); ROSE_SOAK_SECONDS runs it for a time instead (the long form, e.g. 600)."""
from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from engine_lib.runner.self_check import MIN_COSINE
from testing.embed_clients import embed_generate, embed_unary_grpc, embed_unary_http
from testing.reliability_helpers import children
from testing.texts import LONG_TEXTS, MEDIUM_TEXTS, VARIED_TEXTS

SOAK_REQUESTS = int(os.environ.get("ROSE_SOAK_REQUESTS", "24"))
SOAK_SECONDS = float(os.environ.get("ROSE_SOAK_SECONDS", "0"))  # > 0: time-bound instead
STREAM_DEPTH = 4  # requests in flight on one stream
WORDS = ("index query ranking vector shard replica latency cache batch token graph kernel model "
         "router tenant quota region failover snapshot compaction").split()


def make_pool(reference_model, size=120, seed=0):
    """(texts, normalised reference rows): distinct enough that a misrouted row cannot pass."""
    rng = random.Random(seed)
    vocabulary = sorted({w for t in VARIED_TEXTS for w in t.split()} | set(WORDS))
    candidates = list(dict.fromkeys(VARIED_TEXTS + MEDIUM_TEXTS + LONG_TEXTS))
    candidates += [" ".join(rng.choice(vocabulary) for _ in range(rng.choice((3, 8, 20, 60, 200))))
                   for _ in range(size)]
    embedded = reference_model.encode(candidates, normalize_embeddings=True)
    chosen = []
    for i in range(len(candidates)):
        if len(chosen) < size and (not chosen or (embedded[chosen] @ embedded[i]).max() < 0.98):
            chosen.append(i)
    return [candidates[i] for i in chosen], embedded[chosen]


class Ledger:
    """What was sent and what came back, across all workers."""

    def __init__(self, reference, stop: threading.Event, target: int | None):
        self.reference = reference
        self.stop, self.target = stop, target  # `stop` is set once `target` requests are answered
        self.lock = threading.Lock()
        self.sent = 0
        self.ok = 0
        self.answers: Counter = Counter()
        self.misrouted_rows = 0
        self.errors: Counter = Counter()

    def check(self, indices, dims, rows):
        expected = self.reference[indices][:, :dims] if dims else self.reference[indices]
        expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
        bad = rows.shape != expected.shape or int(((rows * expected).sum(1) < MIN_COSINE).sum())
        with self.lock:
            self.ok += 1
            self.misrouted_rows += len(indices) if rows.shape != expected.shape else bad
        self._answered()

    def error(self, exc):
        with self.lock:
            self.errors[str(exc)[:120]] += 1
        self._answered()

    def _answered(self):
        if self.target is not None and self.ok + sum(self.errors.values()) >= self.target:
            self.stop.set()


def random_request(rng, pool_size):
    count = rng.choice((1, 1, 2, 4, 8, 16, 32, 64))
    indices = rng.sample(range(pool_size), count)
    dims = rng.choice((0, 0, 0, 128))
    return indices, dims, ({"dimensions": dims} if dims else None)


def unary_worker(way, url, pool, ledger, stop, seed):
    rng = random.Random(seed)
    while not stop.is_set():
        indices, dims, params = random_request(rng, len(pool))
        with ledger.lock:
            ledger.sent += 1
        try:
            rows = way(url, [pool[i] for i in indices], params)
        except Exception as exc:  # counted and reported, never swallowed
            ledger.error(exc)
            continue
        ledger.check(indices, dims, rows)


def stream_worker(url, pool, ledger, stop, seed):
    """One stream, STREAM_DEPTH requests in flight, answers matched by request id."""
    rng = random.Random(seed)
    client = grpcclient.InferenceServerClient(url)
    pending: dict[str, tuple] = {}
    slots = threading.Semaphore(STREAM_DEPTH)

    def on_answer(result, error):
        if error is not None:
            ledger.error(error)
        else:
            request_id = result.get_response().id
            with ledger.lock:
                ledger.answers[request_id] += 1
                entry = pending.pop(request_id, None)
            if entry is not None:
                ledger.check(entry[0], entry[1], result.as_numpy("EMBEDDINGS"))
        slots.release()

    client.start_stream(callback=on_answer)
    number = 0
    while not stop.is_set():
        if not slots.acquire(timeout=0.5):
            continue
        indices, dims, params = random_request(rng, len(pool))
        request_id = f"{seed}-{number}"
        number += 1
        text = grpcclient.InferInput("TEXT", [len(indices)], "BYTES")
        text.set_data_from_numpy(np.array([pool[i].encode() for i in indices], dtype=object))
        with ledger.lock:
            ledger.sent += 1
            pending[request_id] = (indices, dims)
        client.async_stream_infer("ensemble", [text], request_id=request_id, parameters=params)
    client.stop_stream()  # waits for the answers still outstanding
    client.close()


def peak_rss_mib(serve_pid):
    """Peak resident memory (VmHWM) of tritonserver and its model stubs, in MiB."""
    total = 0
    (triton_pid, _), = [c for c in children(serve_pid) if "bin/tritonserver" in c[1]]
    for pid in [triton_pid] + [p for p, _ in children(triton_pid)]:
        with open(f"/proc/{pid}/status") as f:
            total += next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    return total / 1024


def test_soak_loses_duplicates_and_misroutes_nothing(server, reference_model, record_property):
    pool, reference = make_pool(reference_model)
    assert len(pool) >= 80
    stop = threading.Event()
    ledger = Ledger(reference, stop, None if SOAK_SECONDS > 0 else SOAK_REQUESTS)
    workers = [threading.Thread(target=stream_worker, args=(server.grpc_url, pool, ledger, stop, s), daemon=True)
               for s in (1, 2)]
    workers += [threading.Thread(target=unary_worker, args=(way, url, pool, ledger, stop, s), daemon=True)
                for s, (way, url) in enumerate([(embed_unary_grpc, server.grpc_url),
                                                (embed_unary_http, server.http_url),
                                                (embed_generate, server.http_url)], start=3)]
    started = time.monotonic()
    for w in workers:
        w.start()
    reached = stop.wait(SOAK_SECONDS if SOAK_SECONDS > 0 else 240)  # request-bound: the ledger sets it
    stop.set()
    assert reached or SOAK_SECONDS > 0, f"only {ledger.ok} of {SOAK_REQUESTS} requests answered in 240 s: a hang"
    for w in workers:
        w.join(120)
    assert not any(w.is_alive() for w in workers), "a worker hung: requests lost"
    elapsed = time.monotonic() - started
    errors = sum(ledger.errors.values())
    lost = ledger.sent - ledger.ok - errors
    duplicated = sum(n - 1 for n in ledger.answers.values() if n > 1)
    summary = (f"soak {elapsed:.0f}s: {ledger.sent} requests, {ledger.ok} ok, {errors} errors, {lost} lost, "
               f"{duplicated} duplicated, {ledger.misrouted_rows} misrouted rows; "
               f"server peak RSS {peak_rss_mib(server.process.pid):.0f} MiB")
    print(summary, dict(ledger.errors))
    record_property("soak", summary)
    assert (lost, duplicated, ledger.misrouted_rows) == (0, 0, 0), summary
    assert errors == 0, (summary, dict(ledger.errors))
    if SOAK_SECONDS > 0 and ledger.sent < 20:
        pytest.fail(f"too little traffic to mean anything: {summary}")
