"""Per-request options: the one set of rules for them. The Triton models parse their request
parameters here and the gateway its JSON fields, so both accept and refuse the same values;
each refusal is an InputError whose `field` is the option's name."""
from __future__ import annotations

import json
from dataclasses import dataclass

from engine_lib.config import parse_bool
from engine_lib.errors import InputError
from rose_wire import OUTPUT_OF_TYPE
from rose_wire.names import OUTPUTS_OF_RAGGED_TYPE

# Which template prefix the tokenizer applies (engine_lib/tokenization/text.py: template_prefixes).
INPUT_TYPES = ("document", "query", "classification", "clustering")
TRUNCATION_DIRECTIONS = ("right", "left")  # right: keep the start of a long text; left: keep its end
CHUNKING_MODES = ("none", "mean")  # mean: a long text's windows, pooled (tokenization/text.py: windows)
# float, int8, uint8, binary, ubinary, int8_ranges; sparse, multivector (retrieval kinds only)
OUTPUT_TYPES = tuple(OUTPUT_OF_TYPE) + tuple(OUTPUTS_OF_RAGGED_TYPE)
# Scheduling classes (engine_lib/service/scheduler.py): interactive work fills each batch first.
INTERACTIVE, BATCH = "interactive", "batch"
PRIORITIES = (INTERACTIVE, BATCH)
# The class's request parameter on the Triton models: Triton reserves `priority` itself (its own integer
# request priority, which ensembles do not pass on); the gateway's JSON field is `priority`.
PRIORITY_PARAMETER = "priority_class"
# The default class: a request of at most this many texts and tokens is interactive, a larger one batch.
INTERACTIVE_MAX_TEXTS = 32
INTERACTIVE_MAX_TOKENS = 8192
INT64_MAX = (1 << 63) - 1  # every integer a request carries fits Triton's int64 parameters and tensors


def check_integer(name: str, value, minimum: int = 0, maximum: int = INT64_MAX, digits: bool = True) -> int:
    """The one integer rule: an int (not a bool) in [minimum, maximum]; with `digits`, its ASCII
    digits too (Triton's string parameters). Anything else is an InputError naming `name`."""
    if digits and isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{name!r} must be an integer, got {value!r}", name)
    if not minimum <= value <= maximum:
        raise InputError(f"{name!r} is {value}; it must lie in [{minimum}, {maximum}]", name)
    return value


def _as_bool(name: str, value) -> bool:
    try:
        return parse_bool(value)
    except ValueError:
        raise InputError(f"parameter {name!r} must be a boolean, got {value!r}", name) from None


def check_priority(value, name: str = PRIORITY_PARAMETER) -> str:
    """The class as a client sends it (under `name`): interactive or batch (left out: `default_priority`)."""
    if not isinstance(value, str) or value not in PRIORITIES:
        raise InputError(f"{name!r} must be one of {PRIORITIES}, got {value!r}", name)
    return value


def _priority(params: dict) -> str:
    return check_priority(params[PRIORITY_PARAMETER]) if PRIORITY_PARAMETER in params else ""


def default_priority(num_texts: int, num_tokens: int) -> str:
    """The class of a request that sets none: interactive when it is small (a query while a user waits)."""
    small = num_texts <= INTERACTIVE_MAX_TEXTS and num_tokens <= INTERACTIVE_MAX_TOKENS
    return INTERACTIVE if small else BATCH


def parse_embedding_types(value) -> tuple[str, ...]:
    """`embedding_types`: output types as a comma-separated string (Triton's string parameters) or a
    list of strings (JSON), in the order given, without repeats; empty or None: ()."""
    if value is None:
        return ()
    if isinstance(value, str):
        names = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        names = list(value)
    else:
        raise InputError(f"parameter 'embedding_types' must be a comma-separated string or a list of strings, "
                         f"got {value!r}", "embedding_types")
    unknown = [n for n in names if n not in OUTPUT_TYPES]
    if unknown:
        raise InputError(f"parameter 'embedding_types' names {unknown[0]!r}; known: {list(OUTPUT_TYPES)}",
                         "embedding_types")
    return tuple(dict.fromkeys(names))


def parse_parameters(params: dict | str | None, known: set[str]) -> dict:
    """Request parameters (a JSON string in Triton) as a dict; unknown names refused; a null
    value is the same as the name left out."""
    if not params or params == "{}":  # most requests: no JSON to parse
        return {}
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError:
            raise InputError("request parameters are not valid JSON") from None
    if not isinstance(params, (dict, type(None))):
        raise InputError(f"request parameters must be a JSON object, got {type(params).__name__}")
    params = {k: v for k, v in (params or {}).items() if not k.startswith("triton_") and v is not None}
    unknown = sorted(set(params) - known)
    if unknown:
        raise InputError(f"unknown request parameter(s) {unknown}; known: {sorted(known)}", unknown[0])
    return params


@dataclass(frozen=True)
class RequestOptions:
    input_type: str = "document"  # which template prefix the tokenizer applies
    truncate: bool = True          # False: refuse texts longer than the model's maximum
    normalize: bool = True         # L2-normalise each returned row
    # Matryoshka: keep the first N dimensions. An integer in [0, 2**63) (or its ASCII digits); 0 = all.
    # At most the model's output width (`check_width`: the encoder, and the gateway when it knows the width).
    dimensions: int = 0
    priority: str = ""             # parameter priority_class: interactive | batch; "" = by size (default_priority)
    truncation_direction: str = "right"  # which end of an over-long text goes: right keeps the start, left the end
    # Outputs to compute (OUTPUT_TYPES); () = decided by the requested outputs (outputs.py: select_types).
    embedding_types: tuple[str, ...] = ()
    chunking: str = "none"  # "mean": a text over the maximum is embedded as consecutive windows, pooled
    sparse_top_k: int = 0   # sparse outputs: keep each text's k largest weights; 0 = all

    NAMES = {"input_type", "truncate", "normalize", "dimensions", "truncation_direction", "embedding_types",
             "chunking", "sparse_top_k", PRIORITY_PARAMETER}

    @classmethod
    def from_parameters(cls, params: dict | str | None, json_body: bool = False) -> "RequestOptions":
        """`json_body`: the gateway's JSON body, where an integer is a JSON number, never a string."""
        params = parse_parameters(params, cls.NAMES)
        input_type = params.get("input_type", "document")
        if input_type not in INPUT_TYPES:
            raise InputError(f"parameter 'input_type' must be one of {INPUT_TYPES}, got {input_type!r}", "input_type")
        chunking = params.get("chunking", "none")
        if chunking not in CHUNKING_MODES:
            raise InputError(f"parameter 'chunking' must be one of {CHUNKING_MODES}, got {chunking!r}", "chunking")
        direction = params.get("truncation_direction", "right")
        if direction not in TRUNCATION_DIRECTIONS:
            raise InputError(f"parameter 'truncation_direction' must be one of {TRUNCATION_DIRECTIONS}, "
                             f"got {direction!r}", "truncation_direction")
        try:
            dimensions = check_integer("dimensions", params.get("dimensions", 0), digits=not json_body)
        except InputError as exc:
            raise InputError(f"{exc} (a non-negative integer; 0 = all)", exc.field) from None
        sparse_top_k = check_integer("sparse_top_k", params.get("sparse_top_k", 0), digits=not json_body)
        return cls(input_type=input_type, sparse_top_k=sparse_top_k,
                   truncate=_as_bool("truncate", params.get("truncate", True)),
                   normalize=_as_bool("normalize", params.get("normalize", True)),
                   dimensions=dimensions, truncation_direction=direction,
                   embedding_types=parse_embedding_types(params.get("embedding_types")), chunking=chunking,
                   priority=_priority(params))

    def check_width(self, width: int) -> None:
        """Refuse `dimensions` wider than the model's rows (`width`)."""
        if self.dimensions > width:
            raise InputError(f"parameter 'dimensions' is {self.dimensions}; the model has {width}", "dimensions")


MAX_INSTRUCTION_CHARS = 4096


@dataclass(frozen=True)
class RerankOptions:
    """Options of the `rerank` pipeline (pair tokenizer and scoring encoder both parse them)."""
    truncate: bool = True     # cut the document side of an over-long pair (the query is kept); False refuses it
    raw_scores: bool = False  # True: the logit; False: the model's activation (sigmoid -> 0..1)
    instruction: str = ""     # task instruction for models that take one ("" = the model's default)
    priority: str = ""        # parameter priority_class: interactive | batch; "" = by size (default_priority)

    @classmethod
    def from_parameters(cls, params: dict | str | None) -> "RerankOptions":
        params = parse_parameters(params, {"truncate", "raw_scores", "instruction", PRIORITY_PARAMETER})
        instruction = params.get("instruction", "")
        if not isinstance(instruction, str):
            raise InputError(f"parameter 'instruction' must be a string, got {instruction!r}", "instruction")
        if len(instruction) > MAX_INSTRUCTION_CHARS:
            raise InputError(f"parameter 'instruction' is {len(instruction)} characters; at most {MAX_INSTRUCTION_CHARS}",
                             "instruction")
        return cls(truncate=_as_bool("truncate", params.get("truncate", True)),
                   raw_scores=_as_bool("raw_scores", params.get("raw_scores", False)),
                   instruction=instruction, priority=_priority(params))
