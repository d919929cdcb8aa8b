"""Start and stop a gateway process alone (`python -m gateway`), as the
container's gateway role runs it."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from rose_triton.server import REPO, free_port


class GatewayProcess:
    def __init__(self, log_path: Path, triton_urls: list[str], args: list[str] | None = None,
                 env: dict | None = None, wait_ready: bool = True, timeout: float = 60.0, preexec_fn=None):
        """`preexec_fn`: run in the child before the gateway starts (e.g. to lower its limits)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "gateway", "--port", str(self.port), *(args or [])]
        for url in triton_urls:
            cmd += ["--triton", url]
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                                        preexec_fn=preexec_fn)
        self._wait(timeout, wait_ready)

    def health(self) -> int | None:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def _wait(self, timeout: float, ready: bool) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.process.returncode}:\n{self.log_tail()}")
            status = self.health()
            if status == 200 or (status is not None and not ready):
                return
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"gateway not up after {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, num_bytes: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_bytes()[-num_bytes:].decode(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode
