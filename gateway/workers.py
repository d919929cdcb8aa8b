"""`--workers N` (N > 1): N gateway processes on one port. Each worker is a whole gateway
(its own event loop, tokenizer, dispatcher and admission, with the bounds divided by N:
`per_worker`) on a socket of its own bound with SO_REUSEPORT, so the kernel spreads the
connections over them. This process only supervises: it restarts a worker that dies after
it started, stops everything when one cannot start (exit 1), and on SIGTERM/SIGINT stops
the workers (each answers what it holds) and exits 0. Metrics are shared through
PROMETHEUS_MULTIPROC_DIR (gateway/metrics.py)."""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import math
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time

from .config import GatewayConfig

log = logging.getLogger("gateway")
RESTART_DELAY_S = 1.0  # before a worker that died is replaced
STOP_TIMEOUT_S = 30.0  # for the workers to finish what they hold on SIGTERM, then SIGKILL
METRICS_REFRESH_S = 1.0


def per_worker(config: GatewayConfig, workers: int) -> GatewayConfig:
    """Each worker admits its share: the concurrency, pending-token, in-flight, receiving and
    body-memory bounds divided by `workers` (rounded up), so the gateway as a whole keeps about
    the configured bounds (the kernel spreads one address's connections over the workers too)."""
    share = {name: math.ceil(getattr(config, name) / workers)
             for name in ("max_concurrent_requests", "max_pending_tokens", "max_inflight_per_replica",
                          "max_receiving_connections", "max_receiving_per_client", "max_buffered_body_bytes")}
    share["max_buffered_body_bytes"] = max(share["max_buffered_body_bytes"], config.max_body_bytes)
    return dataclasses.replace(config, workers=1, **share)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port that other workers share (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host.strip("[]"), port), family=family, backlog=2048, reuse_port=True)


def _die_with_parent() -> None:
    """SIGTERM when the supervisor dies (Linux), so no worker outlives it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _with_metrics_refresh(app, started) -> None:
    """Refresh this worker's gauges every second (the others read them), and set `started`
    once the app is up (its lifespan startup ran)."""
    inner = app.router.lifespan_context
    gateway = app.state.gateway

    async def refresh() -> None:
        while True:
            await asyncio.sleep(METRICS_REFRESH_S)
            dispatcher = gateway.backend.dispatcher
            with contextlib.suppress(Exception):
                completed = {url: r.completed_chunks for url, r in dispatcher.tasks.replicas.items()}
                gateway.metrics.update(dispatcher.inflight, completed, gateway.backend.ready, gateway.pending_tokens,
                                       dispatcher)

    @contextlib.asynccontextmanager
    async def lifespan(a):
        async with inner(a) as state:
            task = asyncio.create_task(refresh())
            started.set()
            try:
                yield state
            finally:
                task.cancel()

    app.router.lifespan_context = lifespan


def run_worker(config: GatewayConfig, index: int, started) -> None:
    """One worker process (spawned): a whole gateway on its own SO_REUSEPORT socket."""
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format=f"[gateway w{index}] %(asctime)s %(levelname)s %(message)s")
    import uvicorn

    from .app import create_app
    from .http.connections import raise_fd_limit
    from .http.protocol import limited_protocol

    raise_fd_limit()
    sock = listen(config.host, config.port)
    app = create_app(config)
    _with_metrics_refresh(app, started)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, loop="uvloop",
                                           http=limited_protocol(config, app.state.gateway.connections),
                                           timeout_keep_alive=config.keep_alive_timeout_s,
                                           log_level="warning", access_log=False))
    server.run(sockets=[sock])
    sys.exit(0 if server.started else 3)


class Supervisor:
    def __init__(self, config: GatewayConfig):
        self.workers = config.workers
        self.config = per_worker(config, config.workers)
        self.context = multiprocessing.get_context("spawn")
        self.processes: list = [None] * self.workers
        self.started: list = [None] * self.workers
        self.stopping = False

    def _start(self, index: int) -> None:
        started = self.context.Event()
        process = self.context.Process(target=run_worker, args=(self.config, index, started),
                                       name=f"gateway-w{index}", daemon=False)
        process.start()
        self.processes[index], self.started[index] = process, started

    def _stop(self, *_) -> None:
        self.stopping = True

    def run(self) -> int:
        metrics_dir = tempfile.mkdtemp(prefix="rose-gateway-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # the workers inherit it (spawned after this)
        os.environ["ROSE_GATEWAY_LIMITS_DB"] = os.path.join(metrics_dir, "limits.sqlite")  # gateway/http/limits.py
        from prometheus_client import multiprocess

        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        log.info("starting %d workers on %s:%d", self.workers, self.config.host, self.config.port)
        try:
            for i in range(self.workers):
                self._start(i)
            while not self.stopping:
                time.sleep(0.2)
                for i, process in enumerate(self.processes):
                    if process.is_alive() or self.stopping:
                        continue
                    multiprocess.mark_process_dead(process.pid)
                    if not self.started[i].is_set():
                        log.error("worker %d exited with %s before it started; stopping", i, process.exitcode)
                        return 1
                    log.warning("worker %d exited with %s; starting it again in %gs", i, process.exitcode,
                                RESTART_DELAY_S)
                    time.sleep(RESTART_DELAY_S)
                    self._start(i)
            return 0
        finally:
            self._stop_all()
            shutil.rmtree(metrics_dir, ignore_errors=True)

    def _stop_all(self) -> None:
        live = [p for p in self.processes if p is not None and p.is_alive()]
        for process in live:
            os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in live:
            process.join(max(deadline - time.monotonic(), 0.1))
            if process.is_alive():
                process.kill()
                process.join()
