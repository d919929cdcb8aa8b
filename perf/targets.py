"""What the harness measures, behind one interface: ours and each peer, served or in-process. A client spec
is picklable; `connect()` gives `call(request) -> rows [N, D]` on its own connection (one per client process)."""
from __future__ import annotations

import http.client
import json
import multiprocessing as mp
import os
import pickle
import queue
import struct
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient

from . import PEERS, REPO
from .machine import versions
from .measure import Progress, closed_loop, combine, latency_loop
from .texts import Request

BASELINES = REPO / "perf" / "baselines" / "model_repository"


def _text_array(texts) -> np.ndarray:
    return np.array([t.encode("utf-8") for t in texts], dtype=object)


@dataclass(frozen=True)
class RoseStream:
    """Ours: gRPC streaming on `ensemble` (text in) or `rose_encoder` (token ids in); `model` overrides,
    `parameters` ((name, value), ...) go with every request. `call.close()` ends the stream."""
    grpc_url: str
    pre_tokenized: bool = False
    model: str = ""
    parameters: tuple = ()

    def connect(self):
        client = grpcclient.InferenceServerClient(self.grpc_url)
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))

        def tensor(name, values, datatype="INT64"):
            t = grpcclient.InferInput(name, list(values.shape), datatype)
            t.set_data_from_numpy(values)
            return t

        def call(request: Request) -> np.ndarray:
            if self.pre_tokenized:
                inputs = [tensor("INPUT_IDS", request.input_ids), tensor("SEQ_LENS", request.seq_lens)]
                model = self.model or "rose_encoder"
            else:
                inputs, model = [tensor("TEXT", _text_array(request.texts), "BYTES")], self.model or "ensemble"
            client.async_stream_infer(model, inputs, parameters=dict(self.parameters) or None)
            result, error = results.get(timeout=900)
            if error is not None:
                raise RuntimeError(f"{model}: {error}")
            return result.as_numpy("EMBEDDINGS")

        call.close = lambda: (client.stop_stream(), client.close())
        return call


@dataclass(frozen=True)
class TritonUnary:
    """Plain `client.infer` over gRPC or HTTP: TEXT [N] (or [N, 1] with `batch_dim`, a model behind
    Triton's dynamic batcher such as the padded baseline)."""
    url: str
    model: str
    protocol: str = "grpc"
    batch_dim: bool = False

    def connect(self):
        if self.protocol == "grpc":
            lib = grpcclient
            client = lib.InferenceServerClient(self.url)
        else:
            import tritonclient.http as lib  # here: its gevent client library is not on the GPU machine

            client = lib.InferenceServerClient(self.url, network_timeout=600)

        def call(request: Request) -> np.ndarray:
            shape = [len(request.texts), 1] if self.batch_dim else [len(request.texts)]
            text = lib.InferInput("TEXT", shape, "BYTES")
            text.set_data_from_numpy(_text_array(request.texts).reshape(shape))
            return client.infer(self.model, [text]).as_numpy("EMBEDDINGS")

        return call


@dataclass(frozen=True)
class HttpJson:
    """JSON over one kept-alive HTTP connection: an OpenAI-style /embeddings endpoint (vLLM, Infinity,
    our gateway; `token_ids`: send pre-tokenized ids) or Triton's `generate` (`path` ending in /generate)."""
    host: str
    port: int
    path: str
    model: str = ""
    token_ids: bool = False

    def connect(self):
        state = {"conn": None}

        def post(body: dict) -> dict:
            for attempt in range(2):  # Infinity drops idle keep-alive sockets: reconnect once
                if state["conn"] is None:
                    state["conn"] = http.client.HTTPConnection(self.host, self.port, timeout=600)
                try:
                    state["conn"].request("POST", self.path, json.dumps(body), {"Content-Type": "application/json"})
                    response = state["conn"].getresponse()
                    data = response.read()
                except (http.client.HTTPException, ConnectionError):
                    state["conn"].close()
                    state["conn"] = None
                    if attempt:
                        raise
                    continue
                if response.status != 200:
                    raise RuntimeError(f"{self.path}: HTTP {response.status}: {data[:300]!r}")
                return json.loads(data)

        def call(request: Request) -> np.ndarray:
            if self.path.endswith("/generate"):
                rows = post({"TEXT": request.texts})["EMBEDDINGS"]
                return np.asarray(rows, dtype=np.float32).reshape(len(request.texts), -1)
            payload = request.texts
            if self.token_ids:
                bounds = np.concatenate([[0], np.cumsum(request.seq_lens)])
                payload = [request.input_ids[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])]
            rows = sorted(post({"model": self.model, "input": payload})["data"], key=lambda d: d["index"])
            return np.asarray([r["embedding"] for r in rows], dtype=np.float32)

        return call


def _client_process(spec, requests, duration, offset, barrier, results):
    try:
        call = spec.connect()
        call(requests[offset % len(requests)])  # connect + first-call costs stay out of the window
        barrier.wait()
        cpu_before = time.process_time()  # this client's process: every thread of its library
        part = closed_loop(call, requests, time.time(), duration, offset)
        results.put({**part, "client_cpu_s": time.process_time() - cpu_before})
    except Exception as exc:  # reported to the parent, which fails the cell
        barrier.abort()
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def process_loop(spec, requests: list[Request], concurrency: int, duration: float, label: str) -> dict:
    """`concurrency` client processes, each with its own connection, closed loop for `duration` s."""
    ctx = mp.get_context("spawn")  # gRPC does not survive fork
    barrier, results = ctx.Barrier(concurrency + 1), ctx.Queue()
    procs = [ctx.Process(target=_client_process, args=(spec, requests, duration, k * 7, barrier, results), daemon=True)
             for k in range(concurrency)]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=600)
    except Exception:  # a client failed before the start: its error is in `results`
        pass
    progress, start, parts = Progress(label, duration, "s"), time.monotonic(), []
    while len(parts) < concurrency:
        try:
            parts.append(results.get(timeout=0.2))
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and results.empty():
                break
        progress.update(min(duration, time.monotonic() - start))
    progress.close()
    for p in procs:
        p.join(5)
    errors = [p["error"] for p in parts if "error" in p]
    if errors or len(parts) < concurrency:
        raise RuntimeError(f"{label}: client failed: {errors or 'a client process died'}")
    combined = combine(parts)
    combined["client_cpu_ms_per_request"] = (1e3 * sum(p["client_cpu_s"] for p in parts)
                                             / max(1, sum(p["requests"] for p in parts)))
    return combined


class ServedTarget:
    """A server reached through client specs; load cells use one client process per concurrent client."""
    in_process = False

    def __init__(self, name: str, text_spec, token_spec=None, versions: dict | None = None, checks_rows: bool = True):
        self.name, self.text_spec, self.token_spec = name, text_spec, token_spec
        self.checks_rows = checks_rows  # warm-up rows checked against the reference (a floor's zeros: only counted)
        self.versions = versions or {}
        self._calls: dict = {}

    def spec(self, cell):
        return self.token_spec if cell.input == "tokens" and self.token_spec is not None else self.text_spec

    def input_used(self, cell) -> str:
        return "tokens" if self.spec(cell) is self.token_spec else "text"

    def _call(self, cell):
        spec = self.spec(cell)
        if spec not in self._calls:
            self._calls[spec] = spec.connect()
        return self._calls[spec]

    def embed(self, cell, requests):
        return [self._call(cell)(r) for r in requests]

    def sequential(self, cell, requests, label):
        return latency_loop(self._call(cell), requests, cell.num_requests, cell.max_seconds, label)

    def load(self, cell, requests, label):
        return process_loop(self.spec(cell), requests, cell.concurrency, cell.duration_s, label)

    def close(self):
        self._calls.clear()


class InprocTarget:
    """A library running in a worker process of its own venv (perf.peers.inproc), length-prefixed pickles."""
    in_process = True

    def __init__(self, name: str, python: str, backend: str, model_dir: str, max_length: int):
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.name = name
        self.proc = subprocess.Popen([python, "-m", "perf.peers.inproc", backend, model_dir,
                                      "--max-length", str(max_length)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO, env=env)
        self.versions = self._ask("info")["versions"]

    def _ask(self, *message):
        data = pickle.dumps(message)
        self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
        self.proc.stdin.flush()
        header = self.proc.stdout.read(8)
        if len(header) < 8:
            raise RuntimeError(f"{self.name}: worker exited with {self.proc.wait()}")
        reply = pickle.loads(self.proc.stdout.read(struct.unpack("<Q", header)[0]))
        if isinstance(reply, Exception):
            raise reply
        return reply

    def input_used(self, cell) -> str:
        return "text"

    def embed(self, cell, requests):
        return self._ask("embed", requests)

    def sequential(self, cell, requests, label):
        return self._ask("latency", requests, cell.num_requests, cell.max_seconds, label)

    def load(self, cell, requests, label):
        return self._ask("throughput", requests, cell.concurrency, cell.duration_s, label)

    def close(self):
        if self.proc.poll() is None:
            try:
                self._ask("quit")
            except (RuntimeError, BrokenPipeError, ValueError):
                pass
            self.proc.wait(30)


def peer_python(name: str) -> str:
    python = PEERS / name / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"peer {name!r} is not installed: run `python -m perf setup {name}`")
    return str(python)


def rose_target(grpc_url: str) -> ServedTarget:
    return ServedTarget("rose", RoseStream(grpc_url), RoseStream(grpc_url, pre_tokenized=True),
                        versions(["nvidia-pytriton", "tritonclient", "torch"]))


def rose_floor_target(grpc_url: str) -> ServedTarget:
    """`floor_ensemble` (perf/overhead.py's floor repository, served beside ours): the ensemble's shape, no work."""
    return ServedTarget("rose-floor", RoseStream(grpc_url, model="floor_ensemble"), None,
                        versions(["nvidia-pytriton", "tritonclient"]), checks_rows=False)


def rose_batched_target(grpc_url: str) -> ServedTarget:
    """`embed_batched`: plain gRPC infer, one text a batch row, behind Triton's dynamic batcher."""
    return ServedTarget("rose-batched", TritonUnary(grpc_url, "embed_batched", batch_dim=True), None,
                        versions(["nvidia-pytriton", "tritonclient", "torch"]))


def openai_target(name: str, url: str, path: str, model: str, token_ids: bool, package_versions: dict):
    parts = urllib.parse.urlsplit(url)
    text = HttpJson(parts.hostname, parts.port, path, model)
    return ServedTarget(name, text, HttpJson(parts.hostname, parts.port, path, model, True) if token_ids else None,
                        package_versions)


def gateway_target(gateway_url: str) -> ServedTarget:
    """The launcher's gateway: text in (tokenized by the gateway) or token ids in, JSON over HTTP."""
    with urllib.request.urlopen(f"{gateway_url}/v1/models", timeout=10) as response:
        model = json.load(response)["data"][0]["id"]
    return openai_target("gateway", gateway_url, "/v1/embeddings", model, True,
                         versions(["starlette", "uvicorn", "orjson", "tritonclient", "nvidia-pytriton", "torch"]))


def triton_padded_target(grpc_url: str) -> ServedTarget:
    return ServedTarget("triton-padded", TritonUnary(grpc_url, "hf_padded", batch_dim=True),
                        versions=versions(["nvidia-pytriton", "transformers", "torch"]))
