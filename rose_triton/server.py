"""Start and stop a real tritonserver through scripts/serve.sh (the README's command)."""
from __future__ import annotations

import glob
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


PORT_ATTEMPTS = 4  # launches on fresh ports when another process took one before Triton bound it


class PortTakenError(RuntimeError):
    """The server exited because a port it was given was already in use."""


def _ephemeral_ports_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A loopback port no process holds, drawn from just below the kernel's ephemeral range: the
    ports outgoing connections get come from that range, so none of them can take this one between
    this check and the server's bind (another listener still can: `TritonServer` then retries)."""
    top = _ephemeral_ports_start()
    for _ in range(100):
        port = random.randrange(max(1024, top - 10000), top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # that whole band is held: let the kernel pick one
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TritonServer:
    """One tritonserver on loopback with free ports; `stop()` waits for a graceful exit, `kill()`
    ends it at once. Either way, what the process tree leaves behind goes with it: the Python
    backend's shared-memory regions (their names carry this server's own prefix) and its TMPDIR
    (the launcher's assembled model repository)."""

    def __init__(self, log_path: Path, env: dict | None = None, extra_args: list[str] | None = None,
                 ready_timeout: float = 240.0, serve_args: list[str] | None = None,
                 admin_key: str | None = None, gateway: bool = False, root: Path = REPO):
        """`admin_key`: the secret for the restricted admin APIs (None: refused to everyone).
        `gateway`: also start the OpenAI-compatible gateway (`gateway_url`; ready counts it).
        `root`: the checkout whose launcher and models to serve (perf compares two commits)."""
        self.admin_key = admin_key
        self.log_path = log_path
        env = {**(env or {}), **({"ROSE_ADMIN_KEY": admin_key} if admin_key else {})}
        for attempt in range(PORT_ATTEMPTS):
            self._launch(env, extra_args, serve_args, gateway, root)
            try:
                self._wait_ready(ready_timeout)
                return
            except PortTakenError:
                if attempt == PORT_ATTEMPTS - 1:
                    raise

    def _launch(self, env: dict, extra_args: list[str] | None, serve_args: list[str] | None,
                gateway: bool, root: Path) -> None:
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.http_url = f"127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.gateway_url = f"http://127.0.0.1:{free_port()}" if gateway else None
        self.shm_prefix = f"rose_server_{os.getpid()}_{secrets.token_hex(4)}_"
        self.tmpdir = tempfile.mkdtemp(prefix="rose-server.")
        cmd = [str(Path(root) / "scripts" / "serve.sh"), "--http-port", str(self.http_port),
               "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port),
               *(["--gateway-port", self.gateway_url.rsplit(":", 1)[1]] if gateway else ["--no-gateway"]),
               *(serve_args or [])]
        cmd += ["--", f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}", *(extra_args or [])]
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "TMPDIR": self.tmpdir, **env},
                                        start_new_session=True, cwd=root)

    def is_ready(self) -> bool:
        urls = [f"http://{self.http_url}/v2/health/ready"] + ([f"{self.gateway_url}/health"] if self.gateway_url else [])
        try:
            for url in urls:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status != 200:
                        return False
            return True
        except OSError:
            return False

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_tail()
                self.kill()  # what the launcher's tree left behind
                error = PortTakenError if "already in use" in tail.lower() else RuntimeError
                raise error(f"tritonserver exited with {self.process.returncode}:\n{tail}")
            if self.is_ready() and self._bound_its_port():
                return
            time.sleep(0.5)
        tail = self.log_tail()
        self.kill()  # never ready: nothing to drain
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f}s:\n{tail}")

    def _bound_its_port(self) -> bool:
        """Triton logged that it listens on this server's HTTP port: the ready answer was its own,
        not another process's that took the port after `free_port` let it go."""
        self._log.flush()
        said = f':{self.http_port}"'.encode()
        return any(b"Started HTTPService at " in line and line.endswith(said)
                   for line in self.log_path.read_bytes().splitlines())

    def log_tail(self, num_bytes: int = 6000) -> str:
        self._log.flush()
        return self.log_path.read_bytes()[-num_bytes:].decode(errors="replace")

    def terminate(self) -> None:
        """Ask the launcher to stop (SIGTERM to its process group); `stop()` waits for it."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                return self.kill()
        self._release()
        return self.process.returncode

    def kill(self) -> int:
        """SIGKILL to the launcher's process group (Triton, its stubs, the gateway, the watchdog):
        no drain, no per-instance unload (Triton waits a second for each Python model instance)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._release()
        return self.process.returncode

    def _release(self) -> None:
        for region in glob.glob(f"/dev/shm/{self.shm_prefix}*"):
            try:
                os.unlink(region)
            except FileNotFoundError:
                pass
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        self._log.close()

