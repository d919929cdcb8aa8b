"""Request bodies: each read whole (under --body-timeout and --max-body-bytes) before its
request takes a slot, and all those held, arriving or being answered, bounded together
(--max-buffered-body-bytes) so that memory stays bounded however many clients send."""
from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect, Request

from ..config import GatewayConfig
from ..errors import ApiError, too_large


class BodyReader:
    def __init__(self, config: GatewayConfig, metrics):
        self.config = config
        self.metrics = metrics
        self.held = 0  # bytes of the bodies read or arriving, until released

    async def read(self, request: Request) -> bytes:
        """The whole body; its bytes count until `release(request)`, which must follow."""
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length", "")
        request.state.body_bytes = 0
        request.state.close_connection = True  # until the whole body is in: what is left of it is not read
        if declared.isascii() and declared.isdigit() and int(declared) > limit:
            raise too_large(f"request body is {declared} bytes; at most {limit}")
        body = bytearray()
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                async for part in request.stream():
                    self._take(request, len(part))
                    body += part
                    if len(body) > limit:
                        raise too_large(f"request body is over {limit} bytes")
        except TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {self.config.body_timeout_s:g}s "
                                f"({len(body)} bytes came)", None, "request_timeout") from None
        except ClientDisconnect:
            raise ApiError(499, "the client closed the connection while sending the body", None,
                           "client_closed_request") from None
        request.state.close_connection = False
        return bytes(body)

    def release(self, request: Request) -> None:
        self.held -= getattr(request.state, "body_bytes", 0)
        request.state.body_bytes = 0
        self.metrics.body_bytes.set(self.held)

    def _take(self, request: Request, num_bytes: int) -> None:
        if self.held + num_bytes > self.config.max_buffered_body_bytes:
            raise ApiError(503, f"the gateway holds {self.held} bytes of request bodies; at most "
                                f"{self.config.max_buffered_body_bytes}: retry later", None, "server_busy",
                           retry_after=1)
        self.held += num_bytes
        request.state.body_bytes += num_bytes
        self.metrics.body_bytes.set(self.held)
