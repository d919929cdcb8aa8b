"""Per-key limits (the keys file: gateway/http/keys.py): requests per minute, tokens per minute
and concurrent requests per key, counted in one SQLite file that every `--workers` process opens
(`SharedCounters`), so a limit holds for the gateway as a whole; OpenAI's x-ratelimit-* headers.
`KeyLimits` is what the plumbing calls: who is calling (401), may they use this model (403), do
they have room for this request and its tokens (429).

Minutes are fixed windows of the wall clock (one starts at each whole minute): a request counts
in the window it arrives in, its tokens in the window they are sent to the encoders in, before
the answer (so a limit is never exceeded, and a request that fails later still counted).
"""
from __future__ import annotations

import hmac
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request

from ..engine.routing import Routes
from ..errors import ApiError
from ..metrics import GatewayMetrics
from ..sqlite_wal import connect_shared, immediate
from ..stages import RequestRecord, current
from .keys import KeyEntry, KeysFile

log = logging.getLogger("gateway")
WINDOW_S = 60
SHARED_KEY_NAME = "shared"  # the access log's name of a key from ROSE_GATEWAY_API_KEYS / --api-key-file
COUNTERS_ENV = "ROSE_GATEWAY_LIMITS_DB"  # the workers' shared SQLite file (gateway/workers.py sets it)
# Test-only: a file holding the clock's time in seconds, so a test decides which window a request
# falls in (never set in a deployment).
TEST_CLOCK_ENV = "ROSE_TEST_LIMITS_CLOCK"


def clock() -> float:
    """Wall-clock seconds; a test's own clock when TEST_CLOCK_ENV names a file."""
    path = os.environ.get(TEST_CLOCK_ENV)
    return float(Path(path).read_text()) if path else time.time()


@dataclass(frozen=True)
class Usage:
    """A key's counts in the current window after this request, and when the window ends."""
    requests: int
    tokens: int
    reset_s: float


class SharedCounters:
    """Requests and tokens per key and window, and requests in flight per key and process, in one
    SQLite file shared by the worker processes. Each check-and-count is one IMMEDIATE
    transaction, so two processes never both take the last unit of a limit."""

    def __init__(self, path: str):
        self.pid = os.getpid()
        self.db = connect_shared(path, timeout=60)
        self.db.execute("PRAGMA synchronous=OFF")  # counts, not records: a power cut may lose the last ones
        with immediate(self.db):
            self.db.execute("CREATE TABLE IF NOT EXISTS used (key TEXT, window INTEGER, requests INTEGER, "
                            "tokens INTEGER, PRIMARY KEY (key, window))")
            self.db.execute("CREATE TABLE IF NOT EXISTS active (key TEXT, pid INTEGER, n INTEGER, "
                            "PRIMARY KEY (key, pid))")
            # a process that died holding requests (the supervisor replaces it): its slots are free again
            for (pid,) in self.db.execute("SELECT DISTINCT pid FROM active").fetchall():
                if not _alive(pid):
                    self.db.execute("DELETE FROM active WHERE pid = ?", (pid,))

    def admit(self, entry: KeyEntry, now: float) -> Usage:
        """Count one request of `entry` (and hold one of its concurrent slots), or raise 429."""
        window = int(now // WINDOW_S)
        reset_s = (window + 1) * WINDOW_S - now
        with immediate(self.db):
            requests, tokens = self._used(entry.name, window)
            if entry.requests_per_minute and requests >= entry.requests_per_minute:
                raise _refusal(entry, "requests_per_minute", f"{entry.requests_per_minute} requests per minute",
                               Usage(requests, tokens, reset_s))
            if entry.concurrent_requests:
                (active,) = self.db.execute("SELECT COALESCE(SUM(n), 0) FROM active WHERE key = ?",
                                            (entry.name,)).fetchone()
                if active >= entry.concurrent_requests:
                    raise _refusal(entry, "concurrent_requests", f"{entry.concurrent_requests} concurrent requests",
                                   Usage(requests, tokens, reset_s), retry_after=1)
                self.db.execute("INSERT INTO active VALUES (?, ?, 1) ON CONFLICT (key, pid) DO UPDATE SET n = n + 1",
                                (entry.name, self.pid))
            self.db.execute("INSERT INTO used VALUES (?, ?, 1, 0) ON CONFLICT (key, window) DO UPDATE "
                            "SET requests = requests + 1", (entry.name, window))
            self.db.execute("DELETE FROM used WHERE key = ? AND window < ?", (entry.name, window))
        return Usage(requests + 1, tokens, reset_s)

    def charge(self, entry: KeyEntry, num_tokens: int, now: float) -> Usage:
        """Count `num_tokens` of `entry`, or raise 429 when they do not fit its window's rest."""
        window = int(now // WINDOW_S)
        reset_s = (window + 1) * WINDOW_S - now
        with immediate(self.db):
            requests, tokens = self._used(entry.name, window)
            if entry.tokens_per_minute and tokens + num_tokens > entry.tokens_per_minute:
                raise _refusal(entry, "tokens_per_minute", f"{entry.tokens_per_minute} tokens per minute "
                               f"({tokens} used in this minute, the request holds {num_tokens})",
                               Usage(requests, tokens, reset_s))
            self.db.execute("INSERT INTO used VALUES (?, ?, 0, ?) ON CONFLICT (key, window) DO UPDATE "
                            "SET tokens = tokens + ?", (entry.name, window, num_tokens, num_tokens))
        return Usage(requests, tokens + num_tokens, reset_s)

    def release(self, entry: KeyEntry) -> None:
        """One request of `entry` admitted by this process finished."""
        with immediate(self.db):
            self.db.execute("UPDATE active SET n = n - 1 WHERE key = ? AND pid = ?", (entry.name, self.pid))

    def _used(self, name: str, window: int) -> tuple[int, int]:
        row = self.db.execute("SELECT requests, tokens FROM used WHERE key = ? AND window = ?",
                              (name, window)).fetchone()
        return row or (0, 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LimitReached(ApiError):
    """429 for one of a key's limits, with the key's counts for the x-ratelimit-* headers."""

    def __init__(self, message: str, retry_after: int, limit: str, usage: Usage):
        super().__init__(429, message, None, "rate_limit_exceeded", retry_after=retry_after)
        self.limit, self.usage = limit, usage


def _refusal(entry: KeyEntry, limit: str, what: str, usage: Usage, retry_after: int | None = None) -> LimitReached:
    retry_after = math.ceil(usage.reset_s) if retry_after is None else retry_after
    return LimitReached(f"key {entry.name!r} is limited to {what}: retry after {retry_after} s", retry_after,
                        limit, usage)


def reset_text(seconds: float) -> str:
    """A duration as OpenAI writes x-ratelimit-reset-*: 20ms, 1.5s, 6m0s."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    rest = f"{rest:.3f}".rstrip("0").rstrip(".")
    return f"{int(minutes)}m{rest}s" if minutes else f"{rest}s"


def rate_headers(entry: KeyEntry, usage: Usage) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers for the limits `entry` has (none for concurrency)."""
    headers = {}
    for kind, limit, used in (("requests", entry.requests_per_minute, usage.requests),
                              ("tokens", entry.tokens_per_minute, usage.tokens)):
        if limit:
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, limit - used))
            headers[f"x-ratelimit-reset-{kind}"] = reset_text(usage.reset_s)
    return headers


class KeyLimits:
    """Who calls (the keys file's keys, then the single-key settings), and the limits of their key.
    The record of the request (gateway/stages.py) carries the key from `identify` on."""

    def __init__(self, shared_keys: frozenset[str], keys_file: str, metrics: GatewayMetrics):
        self.shared_keys = tuple(k.encode() for k in shared_keys)
        self.keys = KeysFile(keys_file) if keys_file else None
        self.metrics = metrics
        self._counters: SharedCounters | None = None

    @property
    def open(self) -> bool:
        """No key is required."""
        return not self.shared_keys and self.keys is None

    @property
    def counters(self) -> SharedCounters:
        if self._counters is None:  # opened on the first limited key: a gateway without limits has no file
            self._counters = SharedCounters(os.environ.get(COUNTERS_ENV) or ":memory:")
        return self._counters

    def identify(self, request: Request, record: RequestRecord) -> None:
        """Set the record's key from Authorization: Bearer, or raise 401."""
        if self.open:
            return
        # compared as bytes: the header is any bytes (Starlette reads it as latin-1), a key is UTF-8
        scheme, _, key = request.headers.get("authorization", "").encode("latin-1").partition(b" ")
        key = key.strip()
        if scheme.lower() == b"bearer":
            entry = self.keys.lookup(key) if self.keys is not None else None
            if entry is not None:
                record.key, record.key_name = entry, entry.name
                return
            if any(hmac.compare_digest(key, k) for k in self.shared_keys):
                record.key_name = SHARED_KEY_NAME
                return
        raise ApiError(401, "missing or invalid API key: send Authorization: Bearer <key>", None, "invalid_api_key")

    def admit(self, record: RequestRecord) -> bool:
        """Count a request of the record's key against its limits (429 past one). -> whether it
        holds a concurrent slot, to give back with `release`."""
        entry: KeyEntry | None = record.key
        if entry is None or not entry.limited:
            return False
        self._counted(entry, record, lambda: self.counters.admit(entry, clock()))
        return bool(entry.concurrent_requests)

    def charge(self, num_tokens: int) -> None:
        """Count the current request's tokens against its key's tokens per minute (429 past it)."""
        record = current()
        entry: KeyEntry | None = record.key if record is not None else None
        if entry is None or not entry.tokens_per_minute:
            return
        self._counted(entry, record, lambda: self.counters.charge(entry, num_tokens, clock()))

    def release(self, record: RequestRecord) -> None:
        self.counters.release(record.key)

    def _counted(self, entry: KeyEntry, record: RequestRecord, count) -> None:
        try:
            usage = count()
        except LimitReached as exc:
            record.extra_headers.update(rate_headers(entry, exc.usage))
            self.metrics.key_refusals.labels(entry.name, exc.limit).inc()
            raise
        record.extra_headers.update(rate_headers(entry, usage))

    def answered(self, record: RequestRecord, status: int) -> None:
        """Count the answer under the key's name (keys file keys only: never the key itself)."""
        if record.key is not None:
            self.metrics.key_requests.labels(record.key_name, str(status)).inc()
            if status == 403:  # the only 403: a model the key may not use (KeyedRoutes)
                self.metrics.key_refusals.labels(record.key_name, "models").inc()
            if status == 200 and record.tokens:
                self.metrics.key_tokens.labels(record.key_name).inc(record.tokens)


class KeyedRoutes(Routes):
    """Routes that refuse (403) a model the caller's key may not use."""

    def embedder(self, model):
        return _allowed(super().embedder(model))

    def reranker(self, model):
        return _allowed(super().reranker(model))


def _allowed(route):
    record = current()
    if record is None:
        return route
    record.model = route.name
    entry: KeyEntry | None = record.key
    if entry is not None and entry.models is not None and route.name not in entry.models:
        raise ApiError(403, f"key {entry.name!r} may not use model {route.name!r}; it may use "
                            f"{sorted(entry.models)}", "model", "model_not_allowed")
    return route
