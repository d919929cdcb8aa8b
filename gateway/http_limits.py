"""uvicorn's httptools protocol with the two limits uvicorn lacks: a deadline for a
request's headers and a bound on their size. Without them a client that sends half
a request line, or endless header lines, holds its connection (and memory) for good:
uvicorn's keep-alive timer runs only while no byte arrives between requests.

The deadline runs from the connection's start, and from each answer on a kept-alive
connection, to the end of the next request's headers. Past it, or past the size,
the client gets OpenAI's error JSON (408 / 431) and the connection is closed. The
body's deadline is the app's (`--body-timeout`, gateway/app.py)."""
from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from .config import GatewayConfig
from .errors import error_body

log = logging.getLogger("gateway")


class HeadersTooLarge(Exception):
    pass


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout_s: float = GatewayConfig.header_timeout_s
    max_header_bytes: int = GatewayConfig.max_header_bytes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
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
        self.transport.write(b"".join([
            STATUS_LINE[status], b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body]))
        self.transport.close()

    # httptools' callbacks, while it parses a request's start
    def on_message_begin(self) -> None:
        self._header_bytes = 0
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
            raise HeadersTooLarge()  # httptools stops parsing: uvicorn answers through send_400_response

    def send_400_response(self, msg: str) -> None:
        if self._header_bytes > self.max_header_bytes:
            self._refuse(431, f"the request line and headers are over {self.max_header_bytes} bytes",
                         "request_too_large")
        else:
            super().send_400_response(msg)

    def on_headers_complete(self) -> None:
        self._stop_header_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # the next request's headers are in already
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._await_headers()


def limited_protocol(config: GatewayConfig) -> type[LimitedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=`, with `config`'s limits."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,),
                {"header_timeout_s": config.header_timeout_s, "max_header_bytes": config.max_header_bytes})
