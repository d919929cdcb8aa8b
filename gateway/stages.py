"""What one request did, stage by stage: the record that the timing headers, the access log,
the per-key limits and the traces read. `endpoint` (gateway/http/plumbing.py) opens it for each
request; the stages mark it where they happen, through `current()` (a context variable, so the
dispatcher's payload builders, which run in the dispatcher's tasks, get it by closure).

The stage boundaries (time.perf_counter() seconds, 0.0 until reached):
  started    the request reached its endpoint (headers in; its body not read yet)
  parsed     the JSON body was parsed
  dispatched its tokens were handed to the dispatcher (tokenized, counted, admitted)
  first_sent its first chunk left the gateway's queue for a replica
  answered   its last chunk was answered
  finished   its answer was built
"""
from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    started: float = field(default_factory=time.perf_counter)
    parsed: float = 0.0
    dispatched: float = 0.0
    first_sent: float = 0.0
    answered: float = 0.0
    finished: float = 0.0
    key: object = None           # the caller's entry of the keys file (gateway/http/keys.py), if any
    key_name: str | None = None  # the keys file's name of the caller's key ("shared": a single-key setting)
    model: str | None = None     # the served model the request was routed to
    inputs: int = 0              # inputs embedded or documents reranked
    tokens: int = 0              # tokens sent to the encoders (usage's count; rerank: the admitted bound)
    trace_id: str | None = None
    span: object = None          # the request's span when traces are on (gateway/traced.py)
    extra_headers: dict[str, str] = field(default_factory=dict)  # e.g. the key's rate-limit state

    def ms(self, start: float, end: float) -> float:
        """Milliseconds from `start` to `end`; 0 when a stage was not reached."""
        return (end - start) * 1000.0 if start and end else 0.0

    @property
    def total_ms(self) -> float:
        return self.ms(self.started, self.finished or time.perf_counter())

    @property
    def tokenization_ms(self) -> float:
        return self.ms(self.parsed, self.dispatched)

    @property
    def queue_ms(self) -> float:
        return self.ms(self.dispatched, self.first_sent)

    @property
    def inference_ms(self) -> float:
        return self.ms(self.first_sent, self.answered)


_current: ContextVar[RequestRecord | None] = ContextVar("gateway_request_record", default=None)


def begin() -> RequestRecord:
    """A new record, current for the calling task (and tasks it starts) from now on."""
    record = RequestRecord()
    _current.set(record)
    return record


def current() -> RequestRecord | None:
    return _current.get()


def mark(stage: str) -> None:
    """Set stage `stage` of the current record to now (no record: nothing)."""
    record = _current.get()
    if record is not None and not getattr(record, stage):
        setattr(record, stage, time.perf_counter())
