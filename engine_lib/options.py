"""Per-request options, sent as Triton request parameters; every model parses all."""
from __future__ import annotations

import json
from dataclasses import dataclass

from .config import parse_bool
from .errors import InputError

INPUT_TYPES = ("document", "query")


def _as_bool(name: str, value) -> bool:
    try:
        return parse_bool(value)
    except ValueError:
        raise InputError(f"parameter {name!r} must be a boolean, got {value!r}") from None


@dataclass(frozen=True)
class RequestOptions:
    input_type: str = "document"  # which template prefix the tokenizer applies
    truncate: bool = True          # False: refuse texts longer than the model's maximum
    normalize: bool = True         # L2-normalise each returned row
    dimensions: int = 0            # Matryoshka: keep the first N dimensions (0 = all)

    @classmethod
    def from_parameters(cls, params: dict | str | None) -> "RequestOptions":
        if isinstance(params, str):
            try:
                params = json.loads(params) if params else {}
            except ValueError:
                raise InputError("request parameters are not valid JSON") from None
        if not isinstance(params, (dict, type(None))):
            raise InputError(f"request parameters must be a JSON object, got {type(params).__name__}")
        params = {k: v for k, v in (params or {}).items() if not k.startswith("triton_")}
        known = {"input_type", "truncate", "normalize", "dimensions"}
        unknown = sorted(set(params) - known)
        if unknown:
            raise InputError(f"unknown request parameter(s) {unknown}; known: {sorted(known)}")
        input_type = params.get("input_type", "document")
        if input_type not in INPUT_TYPES:
            raise InputError(f"parameter 'input_type' must be one of {INPUT_TYPES}, got {input_type!r}")
        dimensions = params.get("dimensions", 0)
        if isinstance(dimensions, str) and dimensions.isascii() and dimensions.isdigit():
            dimensions = int(dimensions)
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 0:
            raise InputError(f"parameter 'dimensions' must be a non-negative integer, got {dimensions!r}")
        return cls(input_type=input_type,
                   truncate=_as_bool("truncate", params.get("truncate", True)),
                   normalize=_as_bool("normalize", params.get("normalize", True)),
                   dimensions=dimensions)
