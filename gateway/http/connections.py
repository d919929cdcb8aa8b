"""What connections may hold before their request is complete. A connection is receiving from
the first byte of a request to the last byte of its body; one idle between requests
(keep-alive), or whose request is being answered, is not. Receiving connections are bounded
per client address (`--max-receiving-per-client`, past it 429) and in all
(`--max-receiving-connections`, past it 503, but for a few places kept for health probes);
open connections in all by the process's file descriptor limit less a reserve, so a
connection past it is refused with an answer (503) before accept() itself fails with EMFILE
(where uvloop, through libuv, accepts and resets it, and asyncio stops accepting for a
second). The protocol (gateway/http/protocol.py) writes the refusal and closes the connection."""
from __future__ import annotations

import resource
from dataclasses import dataclass

from ..config import GatewayConfig
from ..engine.liveness import LIVENESS_PATH

FD_RESERVE = 128  # descriptors kept for all but client connections: gRPC channels, logs, files
# Past the whole receiving bound a request may take one of these places on probation: it is
# answered only if it is a health probe, so that clients filling the bound fail neither the
# orchestrator's readiness nor its liveness probe (which would restart the gateway).
PROBE_PLACES = 8
PROBE_PATHS = (b"/health", LIVENESS_PATH.encode())


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str
    code: str
    reason: str  # gateway_refused_connections_total's label


def raise_fd_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (as Go's runtime does);
    return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def open_connection_bound(reserve: int = FD_RESERVE) -> int | None:
    """Connections this process can hold with `reserve` descriptors left for the rest (at
    least a quarter of the limit); None without a limit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    return max(1, soft - min(reserve, soft // 4))


class ConnectionBounds:
    """The counts shared by one process's connections; `metrics` (GatewayMetrics) follows them."""

    def __init__(self, max_receiving: int, max_receiving_per_client: int, max_open: int | None, metrics=None):
        self.max_receiving, self.max_receiving_per_client, self.max_open = (
            max_receiving, max_receiving_per_client, max_open)
        self.metrics = metrics
        self.open = 0
        self.receiving = 0
        self.probing = 0  # receiving on one of the PROBE_PLACES
        self.receiving_by_client: dict[str, int] = {}  # probing included

    @classmethod
    def from_config(cls, config: GatewayConfig, metrics=None) -> ConnectionBounds:
        return cls(config.max_receiving_connections, config.max_receiving_per_client, open_connection_bound(),
                   metrics)

    def opened(self) -> Refusal | None:
        """A connection was accepted; it counts until `closed`, even when refused."""
        self.open += 1
        self._gauge("open_connections", self.open)
        if self.max_open is not None and self.open > self.max_open:
            return Refusal(503, f"the gateway holds {self.open - 1} connections, as many as its file descriptor "
                                "limit allows: retry later", "server_busy", "connections")
        return None

    def closed(self) -> None:
        self.open -= 1
        self._gauge("open_connections", self.open)

    def start_receiving(self, client: str, enforce: bool = True) -> Refusal | None:
        """`client` starts sending a request. Past a bound (if `enforce`) -> the refusal, and it
        does not count; else it counts until `stop_receiving(client)`."""
        held = self.receiving_by_client.get(client, 0)
        if enforce and held >= self.max_receiving_per_client:
            return Refusal(429, f"this address is sending {held} requests at once; at most "
                                f"{self.max_receiving_per_client}: retry later", "rate_limit_exceeded", "client")
        if enforce and self.receiving >= self.max_receiving:
            return Refusal(503, f"the gateway is receiving {self.receiving} requests; at most {self.max_receiving}: "
                                "retry later", "server_busy", "receiving")
        self.receiving_by_client[client] = held + 1
        self.receiving += 1
        self._gauge("receiving_connections", self.receiving)
        return None

    def start_probing(self, client: str) -> bool:
        """Take a probe place for `client` (refused for the whole bound only), if one is free;
        it counts until `stop_receiving(client, probing=True)`."""
        if self.probing >= PROBE_PLACES:
            return False
        self.probing += 1
        self.receiving_by_client[client] = self.receiving_by_client.get(client, 0) + 1
        return True

    def stop_receiving(self, client: str, probing: bool = False) -> None:
        held = self.receiving_by_client.pop(client) - 1
        if held:
            self.receiving_by_client[client] = held
        if probing:
            self.probing -= 1
        else:
            self.receiving -= 1
            self._gauge("receiving_connections", self.receiving)

    def refused(self, refusal: Refusal) -> None:
        if self.metrics is not None:
            self.metrics.refused_connections.labels(refusal.reason).inc()

    def _gauge(self, name: str, value: int) -> None:
        if self.metrics is not None:
            getattr(self.metrics, name).set(value)
