"""The gateway's Prometheus metrics (served on GET /metrics). With several worker processes
(gateway/workers.py sets PROMETHEUS_MULTIPROC_DIR) every worker answers with the sum over all
of them: counters and histograms added up, gauges summed over the live workers (`ready`: the
maximum), each worker refreshing its gauges every second."""
from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

disable_created_metrics()

SECONDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class GatewayMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("gateway_requests", "HTTP requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("gateway_request_seconds", "Request latency, body read to response built",
                                 ["endpoint"], buckets=SECONDS, registry=r)
        self.tokens = Counter("gateway_tokens", "Tokens sent to the encoders (usage.prompt_tokens)", registry=r)
        self.inputs = Counter("gateway_inputs", "Inputs embedded or documents reranked", ["endpoint"], registry=r)
        self.chunks = Counter("gateway_chunks", "Chunks sent to replicas", ["endpoint"], registry=r)
        self.retries = Counter("gateway_chunk_retries", "Chunk attempts that failed on a replica (retried or not)",
                               ["replica"], registry=r)
        self.disconnects = Counter("gateway_client_disconnects", "Requests whose client left before the answer "
                                   "(their queued chunks were dropped)", registry=r)
        # per key name of the keys file (gateway/http/keys.py), never the key
        self.key_requests = Counter("gateway_key_requests", "Requests answered per key name, by status",
                                    ["key", "status"], registry=r)
        self.key_tokens = Counter("gateway_key_tokens", "Tokens of answered requests per key name (usage's count; "
                                  "rerank: the admitted bound)", ["key"], registry=r)
        self.key_refusals = Counter("gateway_key_refusals", "Requests refused per key name, by the limit reached: "
                                    "requests_per_minute, tokens_per_minute, concurrent_requests, models",
                                    ["key", "limit"], registry=r)
        live = "livesum"  # several workers: the sum over the live ones
        self.inflight = Gauge("gateway_replica_inflight", "Chunks in flight per replica", ["replica"], registry=r,
                              multiprocess_mode=live)
        self.completed = Gauge("gateway_replica_chunks_completed", "Chunks a replica answered since the gateway "
                               "started", ["replica"], registry=r, multiprocess_mode=live)
        self.ready = Gauge("gateway_replica_ready", "1 when the replica serves the encoder", ["replica"], registry=r,
                           multiprocess_mode="livemax")
        self.pending_tokens = Gauge("gateway_pending_tokens", "Tokens accepted and not yet answered", registry=r,
                                    multiprocess_mode=live)
        self.calls = Gauge("gateway_encoder_calls", "Calls the replicas answered (several chunks may share one)",
                           registry=r, multiprocess_mode=live)
        self.coalesced = Gauge("gateway_coalesced_chunks", "Chunks answered in a call shared with other chunks "
                               "(of other requests waiting at the same time)", registry=r, multiprocess_mode=live)
        self.active_requests = Gauge("gateway_active_requests", "/v1/embeddings and /v1/rerank requests being "
                                     "answered (bound: --max-concurrent-requests)", registry=r,
                                     multiprocess_mode=live)
        self.open_connections = Gauge("gateway_open_connections", "Client connections open (bound: the file "
                                      "descriptor limit less a reserve)", registry=r, multiprocess_mode=live)
        self.receiving_connections = Gauge("gateway_receiving_connections", "Connections receiving a request's "
                                           "headers or body (bound: --max-receiving-connections)", registry=r,
                                           multiprocess_mode=live)
        self.refused_connections = Counter("gateway_refused_connections", "Connections refused past a bound, by "
                                           "reason: connections (open), receiving, client (per address), headers (size)", ["reason"],
                                           registry=r)
        self.body_bytes = Gauge("gateway_request_body_bytes", "Bytes of request bodies held, arriving or being "
                                "answered (bound: --max-buffered-body-bytes)", registry=r, multiprocess_mode=live)
        for endpoint in ("embeddings", "rerank"):
            self.latency.labels(endpoint)
            self.inputs.labels(endpoint)
            self.chunks.labels(endpoint)

    def render(self, inflight: dict[str, int], completed: dict[str, int], ready: dict[str, bool],
               pending_tokens: int, dispatcher=None) -> bytes:
        self.update(inflight, completed, ready, pending_tokens, dispatcher)
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            shared = CollectorRegistry()
            MultiProcessCollector(shared)
            return generate_latest(shared)
        return generate_latest(self.registry)

    def update(self, inflight: dict[str, int], completed: dict[str, int], ready: dict[str, bool],
               pending_tokens: int, dispatcher=None) -> None:
        """Set the gauges read from the dispatcher's state."""
        if dispatcher is not None:
            self.calls.set(dispatcher.calls)
            self.coalesced.set(dispatcher.merged_chunks)
        for gauge in (self.inflight, self.completed, self.ready):
            gauge.clear()
        for url, count in inflight.items():
            self.inflight.labels(url).set(count)
        for url, count in completed.items():
            self.completed.labels(url).set(count)
        for url, is_ready in ready.items():
            self.ready.labels(url).set(int(is_ready))
        self.pending_tokens.set(pending_tokens)
