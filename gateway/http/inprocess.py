"""A request made inside the gateway: a batch job's line answered by the endpoint's own handler
(the same parsing, tokenizing queue, admission and dispatch as a live request), at the `batch`
class, under --request-timeout, with every failure as a status and OpenAI's error JSON."""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from ..engine.backend import IN_BATCH_JOB
from ..errors import ApiError
from .plumbing import Gateway, Handler

log = logging.getLogger("gateway")


def line_caller(gateway: Gateway, handlers: dict[str, Handler]) -> Callable[[str, bytes], Awaitable[tuple[int, bytes]]]:
    """-> call(endpoint, body) -> (status, response body), by `handlers[endpoint]`."""
    limit_s = gateway.config.request_timeout_s

    async def call(path: str, body: bytes) -> tuple[int, bytes]:
        request = Request({"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
                           "query_string": b"", "headers": [(b"content-type", b"application/json")],
                           "state": {"body": body}}, _never_disconnects)
        IN_BATCH_JOB.set(True)  # this task's context only
        try:
            async with asyncio.timeout(limit_s) as deadline:
                response = await handlers[path](gateway, request)
        except ApiError as exc:
            response = exc.response()
        except TimeoutError:
            if not deadline.expired():
                log.exception("internal error on a batch line to %s", path)
                response = ApiError(500, "internal error").response()
            else:
                response = ApiError(504, f"the request did not finish within {limit_s:g} s", None,
                                    "request_timeout").response()
        except Exception:
            log.exception("internal error on a batch line to %s", path)
            response = ApiError(500, "internal error").response()
        gateway.metrics.requests.labels("batch_line", str(response.status_code)).inc()
        return response.status_code, _body(response)
    return call


def _body(response: Response) -> bytes:
    return bytes(response.body)


async def _never_disconnects() -> dict:
    """The ASGI receive of a line: no client to leave (its wait is cancelled when the job ends)."""
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}
