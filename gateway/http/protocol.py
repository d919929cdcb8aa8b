"""uvicorn's httptools protocol with the limits uvicorn lacks: a deadline for a
request's headers, a bound on their size, and the connection bounds of
gateway/http/connections.py. Without the first two a client that sends half a request
line, or endless header lines, holds its connection (and memory) for good: uvicorn's
keep-alive timer runs only while no byte arrives between requests.

The deadline runs from the connection's start, and from each answer on a kept-alive
connection, to the end of the next request's headers. Past it, past the size or past a
connection bound, the client gets OpenAI's error JSON (408 / 431 / 429 / 503) and the
connection is closed. The body's deadline is the body reader's (`--body-timeout`, gateway/http/bodies.py)."""
from __future__ import annotations

import asyncio
import logging

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ..config import GatewayConfig
from ..errors import error_body
from .connections import PROBE_PATHS, ConnectionBounds, Refusal

log = logging.getLogger("gateway")


class Refused(Exception):
    pass


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout_s: float = GatewayConfig.header_timeout_s
    max_header_bytes: int = GatewayConfig.max_header_bytes
    bounds: ConnectionBounds

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._refusal: Refusal | None = None  # set while parsing: uvicorn answers it through send_400_response
        self._receiving = False
        self._probation: Refusal | None = None  # on a probe place: answered unless the request is a probe
        super().connection_made(transport)
        self._client_address = self.client[0] if self.client else ""
        refusal = self.bounds.opened()
        if refusal is not None:
            self.bounds.refused(refusal)
            self._refuse(refusal.status, refusal.message, refusal.code)
        else:
            self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        self._stop_receiving()
        self.bounds.closed()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        self._stop_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_timed_out)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self.cycle is None or self.cycle.response_complete:
            self._refuse(408, f"the request's headers did not arrive within {self.header_timeout_s:g}s",
                         "request_timeout")

    def _refuse(self, status: int, message: str, code: str) -> None:
        if self.transport.is_closing():
            return
        log.info("%s from %s: %s", status, self.client, message)
        body = error_body(status, message, None, code)
        retry_after = b"retry-after: 1\r\n" if status in (429, 503) else b""
        self.transport.write(b"".join([
            STATUS_LINE[status], b"content-type: application/json\r\n", retry_after,
            b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body]))
        self.transport.close()

    def _refuse_while_parsing(self, refusal: Refusal) -> None:
        self._refusal = refusal
        self.bounds.refused(refusal)
        raise Refused()  # httptools stops parsing: uvicorn answers through send_400_response

    def _stop_receiving(self) -> None:
        if self._receiving:
            self.bounds.stop_receiving(self._client_address, probing=self._probation is not None)
            self._receiving, self._probation = False, None

    # httptools' callbacks, while it parses a request
    def on_message_begin(self) -> None:
        self._header_bytes = 0
        answering = self.cycle is not None and not self.cycle.response_complete
        # a pipelined request is counted, not refused: its refusal would come before the answer in flight
        refusal = self.bounds.start_receiving(self._client_address, enforce=not answering)
        if refusal is not None and refusal.reason == "receiving" and self.bounds.start_probing(self._client_address):
            self._probation = refusal
        elif refusal is not None:
            self._refuse_while_parsing(refusal)
        self._receiving = True
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def _count(self, num_bytes: int) -> None:
        self._header_bytes += num_bytes
        if self._header_bytes > self.max_header_bytes:
            self._refuse_while_parsing(Refusal(431, f"the request line and headers are over {self.max_header_bytes} "
                                                    "bytes", "request_too_large", "headers"))

    def send_400_response(self, msg: str) -> None:
        if self._refusal is not None:
            self._refuse(self._refusal.status, self._refusal.message, self._refusal.code)
        else:
            super().send_400_response(msg)

    def on_headers_complete(self) -> None:
        self._stop_header_timer()
        if self._probation is not None and not self._is_probe():
            self._refuse_while_parsing(self._probation)
        super().on_headers_complete()

    def _is_probe(self) -> bool:
        return self.parser.get_method() == b"GET" and httptools.parse_url(self.url).path in PROBE_PATHS

    def on_message_complete(self) -> None:
        self._stop_receiving()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # the next request's headers are in already
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._await_headers()


def limited_protocol(config: GatewayConfig, bounds: ConnectionBounds | None = None) -> type[LimitedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=`, with `config`'s limits; `bounds`: the app's
    (Gateway.connections), else bounds of its own."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,),
                {"header_timeout_s": config.header_timeout_s, "max_header_bytes": config.max_header_bytes,
                 "bounds": bounds or ConnectionBounds.from_config(config)})
