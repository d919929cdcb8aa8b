"""Client-visible errors in OpenAI's error JSON (`error.message/type/param/code`)."""
from __future__ import annotations

import orjson
from starlette.responses import Response

from engine_lib.errors import InputError, InputTooLarge

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
         405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
         429: "rate_limit_error", 431: "invalid_request_error", 499: "client_closed_request",
         500: "server_error", 503: "service_unavailable", 504: "timeout"}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"),
                                   "param": param, "code": code}})


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after = retry_after

    def response(self) -> Response:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return Response(error_body(self.status, self.message, self.param, self.code), self.status, headers,
                        media_type="application/json")


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param, "invalid_value")


def too_large(message: str, param: str | None = None) -> ApiError:
    return ApiError(413, message, param, "request_too_large")


def from_input_error(exc: InputError, param: str | None = None) -> ApiError:
    """engine_lib's refusal (option rules, text limits) as the gateway's: 413 past a size
    limit, else 400; `param` is the error's field unless given."""
    return (too_large if isinstance(exc, InputTooLarge) else bad_request)(str(exc), param or exc.field)


def model_not_found(model: object, served: list[str], extra: str = "") -> ApiError:
    return ApiError(404, f"model {model!r} does not exist here; served: {served}{extra}", "model",
                    "model_not_found")
