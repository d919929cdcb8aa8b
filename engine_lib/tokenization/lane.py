"""A tokenizer model's requests, tokenized in groups by one thread (the model is decoupled).

Triton hands a Python model with `max_batch_size: 0` one request per `execute`
(docs/benchmarks.md, "Where the ensemble's time goes"). So `execute` only queues each request
here and returns; one thread takes every request waiting and runs them through the step's
`many` (a text step tokenizes all their texts together, `encode_fast`), then answers each.
Requests that arrive while it works go together in the next group: under load the encoder
receives them in bursts and its steps grow, instead of one launch for every two or three.

At most `max_waiting_requests` wait; past that `submit` raises OverloadError at once. Every
submitted request gets exactly one answer: its tensors, its own InputError, or the error of a
group that failed.
"""
from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable, Sequence

from engine_lib.errors import OverloadError

log = logging.getLogger(__name__)

# [(tensors, parameters)] of several requests -> per request its output tensors or the exception that answers it
Many = Callable[[Sequence[tuple[Any, Any]]], list]
Answer = Callable[[Any, Any], None]  # (the request's reply handle, its tensors or exception)


class TokenizeLane:
    def __init__(self, many: Many, answer: Answer, max_waiting_requests: int = 128, max_group: int = 256):
        self.many, self.answer = many, answer
        self.max_waiting_requests, self.max_group = max_waiting_requests, max_group
        self._waiting: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="rose-tokenize", daemon=True)
        self._thread.start()

    def submit(self, tensors, parameters, reply) -> None:
        """Queue one request; raises OverloadError (nothing queued) when the queue is full or closing."""
        with self._cond:
            if self._closing:
                raise OverloadError("the tokenizer is shutting down; retry on another replica")
            if len(self._waiting) >= self.max_waiting_requests:
                raise OverloadError(f"tokenizer queue is full ({len(self._waiting)} requests waiting, limit "
                                    f"max_waiting_requests={self.max_waiting_requests}); retry later")
            self._waiting.append((tensors, parameters, reply))
            self._cond.notify()

    def close(self, timeout: float = 60.0) -> None:
        """Refuse new requests, answer every queued one, stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _next_group(self) -> list:
        with self._cond:
            while not self._waiting and not self._closing:
                self._cond.wait()
            count = min(len(self._waiting), self.max_group)
            return [self._waiting.popleft() for _ in range(count)]

    def _loop(self) -> None:
        while group := self._next_group():
            try:
                results = self.many([(tensors, parameters) for tensors, parameters, _ in group])
                if len(results) != len(group):
                    raise RuntimeError(f"the tokenize step gave {len(results)} results for {len(group)} requests")
            except Exception as exc:  # a fault, not an input error (those are results): the group fails
                log.exception("tokenizing a group of %d requests failed", len(group))
                results = [RuntimeError(f"tokenizing failed: {exc!r}")] * len(group)
            for (_, _, reply), result in zip(group, results):
                try:
                    self.answer(reply, result)
                except Exception:  # one client's broken stream does not stop the others' answers
                    log.exception("answering a tokenized request failed")
