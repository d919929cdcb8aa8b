"""Server peers (vLLM, Infinity) started from their own venvs on loopback, stopped at the end of the run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from rose_triton.server import free_port

from ..measure import log
from ..targets import openai_target, peer_python

SERVED_NAME = "bench-model"


def _versions(python: str, names: list[str]) -> dict:
    code = ("import importlib.metadata as m, json\nout = {}\nfor n in %r:\n    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: pass\nprint(json.dumps(out))" % names)
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)


def _command(name: str, python: str, model_dir: str, port: int) -> tuple[list[str], dict]:
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1"}
    if name.startswith("vllm"):
        env.update(VLLM_TARGET_DEVICE="cpu", VLLM_HOST_IP="127.0.0.1", VLLM_NO_USAGE_STATS="1")
        if name == "vllm-2cores":  # the default computes on one core and reserves the other
            env.update(VLLM_CPU_OMP_THREADS_BIND=f"0-{os.cpu_count() - 1}", VLLM_CPU_NUM_OF_RESERVED_CPU="0")
        # The vllm console script is broken in vllm-cpu 0.32.0: start the module.
        return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                "--served-model-name", SERVED_NAME, "--runner", "pooling", "--convert", "embed",
                "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port),
                # On CPU this is the fraction of host memory reserved (default 0.92); embeddings need little.
                "--gpu-memory-utilization", "0.1"], env
    bin_dir = Path(python).parent
    return [str(bin_dir / "infinity_emb"), "v2", "--model-id", model_dir, "--served-model-name", SERVED_NAME,
            "--engine", "torch", "--device", "cpu", "--dtype", "float32", "--host", "127.0.0.1",
            "--port", str(port), "--no-model-warmup", "--log-level", "warning"], env


def start_openai_peer(name: str, model: dict, stack: list, ready_timeout: float = 600):
    venv = "vllm" if name.startswith("vllm") else name
    python = peer_python(venv)
    port = free_port()
    cmd, env = _command(name, python, model["dir"], port)
    log_path = Path(tempfile.mkdtemp(prefix=f"perf-{name}-")) / "server.log"
    log(f"starting {name} on 127.0.0.1:{port} (log {log_path})")
    out = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
                            start_new_session=True, cwd=tempfile.gettempdir())

    def stop():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        out.close()

    stack.append(stop)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}: {log_path.read_bytes()[-3000:].decode(errors='replace')}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        time.sleep(1)
    else:
        raise RuntimeError(f"{name} not ready after {ready_timeout:.0f}s (log {log_path})")
    packages = ["vllm-cpu", "vllm", "torch", "transformers"] if venv == "vllm" else ["infinity-emb", "torch",
                                                                                       "transformers"]
    path = "/v1/embeddings" if venv == "vllm" else "/embeddings"
    return openai_target(name, f"http://127.0.0.1:{port}", path, SERVED_NAME, venv == "vllm",
                         _versions(python, packages))
