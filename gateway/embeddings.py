"""POST /v1/embeddings: OpenAI's request fields (plus input_type, truncate, truncation_direction,
chunking and priority) checked one by one, and the response in float or base64. The options
(dimensions, input_type, truncate, truncation_direction, chunking, priority) follow the models' own
rules (engine_lib/options.py). Compact types are /v2/embed's (gateway/cohere.py)."""
from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass

import numpy as np
import orjson

from engine_lib.errors import InputError
from engine_lib.options import PRIORITY_PARAMETER, RequestOptions, check_priority, default_priority

from .errors import bad_request, from_input_error

OPTIONS = ("dimensions", "input_type", "truncate", "truncation_direction", "chunking")  # RequestOptions a client sets
FIELDS = {"input", "model", "encoding_format", "user", "priority", *OPTIONS}


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    texts: list[str] | None        # text input, or
    token_ids: list[list[int]] | None  # token-id input
    encoding_format: str = "float"
    options: RequestOptions = RequestOptions()

    @property
    def num_inputs(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids)

    def parameters(self, num_tokens: int) -> dict:
        """What the encoder needs (input_type and truncate are applied by the gateway's tokenizer). The
        class is decided here, on the whole request of `num_tokens`: the encoder sees only chunks of it."""
        priority = self.options.priority or default_priority(self.num_inputs, num_tokens)
        return {PRIORITY_PARAMETER: priority, **({"dimensions": self.options.dimensions} if self.options.dimensions else {})}


def _is_token_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_input(value) -> tuple[list[str] | None, list[list[int]] | None]:
    if isinstance(value, str):
        return [value], None
    if not isinstance(value, list):
        raise bad_request(f"'input' must be a string, a list of strings or token ids, got {type(value).__name__}",
                          "input")
    if not value:
        raise bad_request("'input' is an empty list: send at least one input", "input")
    if all(isinstance(v, str) for v in value):
        return value, None
    if all(_is_token_id(v) for v in value):
        return None, [value]
    if all(isinstance(v, list) for v in value):
        for i, ids in enumerate(value):
            if not all(_is_token_id(t) for t in ids):
                raise bad_request(f"input[{i}] must be a list of integer token ids", "input")
        return None, value
    kinds = sorted({type(v).__name__ for v in value})
    raise bad_request(f"'input' mixes item types {kinds}: use all strings, all token ids, or all lists of token ids",
                      "input")


def parse_request(body: dict, width: int | None = None) -> EmbeddingRequest:
    """`width`: the model's row width when the gateway knows it (`dimensions` above it is refused here)."""
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise bad_request(f"unknown field(s) {unknown}; known: {sorted(FIELDS)}", unknown[0])
    if "input" not in body:
        raise bad_request("'input' is required", "input")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string", "model")
    texts, token_ids = _parse_input(body["input"])
    fmt = body.get("encoding_format")
    fmt = "float" if fmt is None else fmt
    if fmt not in ("float", "base64"):
        raise bad_request(f"'encoding_format' must be 'float' or 'base64', got {fmt!r}", "encoding_format")
    try:
        options = RequestOptions.from_parameters({name: body[name] for name in OPTIONS if name in body},
                                                 json_body=True)
        if body.get("priority") is not None:  # the models' parameter priority_class (Triton reserves priority)
            options = dataclasses.replace(options, priority=check_priority(body["priority"], "priority"))
        if width is not None:
            options.check_width(width)
    except InputError as exc:
        raise from_input_error(exc) from None
    if "user" in body and not isinstance(body["user"], (str, type(None))):
        raise bad_request("'user' must be a string", "user")
    return EmbeddingRequest(model, texts, token_ids, fmt, options)


def check_width(request: EmbeddingRequest, width: int | None) -> None:
    """`dimensions` against the row width of the model the request names (once it is known)."""
    if width is not None:
        try:
            request.options.check_width(width)
        except InputError as exc:
            raise from_input_error(exc) from None


def render_response(rows: np.ndarray, model: str, encoding_format: str, num_tokens: int) -> bytes:
    """rows: float32 [N, D]; base64 is little-endian float32 (what OpenAI's client decodes)."""
    if encoding_format == "base64":
        little = rows.astype("<f4", copy=False)
        data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(row.tobytes()).decode()}
                for i, row in enumerate(little)]
    else:
        data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    body = {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
