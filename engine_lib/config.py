"""Validated, frozen configuration built from config.pbtxt parameters."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Mapping

from engine_lib.model_folder import DEFAULT_MODEL

AUTO = -1  # integer settings that also take "auto" store it as -1


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(value) -> bool:
    """The one boolean reader (config parameters and request options): a bool or one of
    TRUE_WORDS / FALSE_WORDS, any case; anything else raises ValueError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in TRUE_WORDS:
            return True
        if lowered in FALSE_WORDS:
            return False
    raise ValueError(f"expected true/false, got {value!r}")


def _from_parameters(cls, params: Mapping[str, str], overrides: Mapping[str, str]):
    """Build dataclass `cls` from string parameters, converting by field type."""
    merged = {**params, **{k: v for k, v in overrides.items() if v is not None}}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown}; known: {sorted(fields)}")
    kwargs = {}
    for name, raw in merged.items():
        if name not in fields:
            continue
        kind = fields[name].type
        try:
            if kind in ("int", int) and name in getattr(cls, "AUTO_FIELDS", ()) and raw.strip() == "auto":
                kwargs[name] = AUTO
            elif kind in ("int", int):
                kwargs[name] = int(raw)
            elif kind in ("bool", bool):
                kwargs[name] = parse_bool(raw)
            else:
                kwargs[name] = str(raw)
        except ValueError as exc:
            raise ValueError(f"parameter {name}: {exc}") from None
    return cls(**kwargs)


@dataclass(frozen=True)
class TokenizerConfig:
    model_dir: str = DEFAULT_MODEL
    query_prefix: str = ""
    document_prefix: str = ""
    max_texts_per_request: int = 4096
    max_text_bytes: int = 1 << 20
    max_request_bytes: int = 4 << 20
    max_length: int = 0   # tokens per text at most; 0 = from the model folder
    max_windows_per_text: int = 32  # chunking=mean: windows of one text at most (more: refused as too large)

    def __post_init__(self):
        _check_tokenizer_limits(self)
        if self.max_windows_per_text < 1:
            raise ValueError("max_windows_per_text must be >= 1")

    @classmethod
    def from_parameters(cls, params: Mapping[str, str], **overrides) -> "TokenizerConfig":
        return _from_parameters(cls, params, overrides)


def _check_tokenizer_limits(config) -> None:
    if config.max_length < 0:
        raise ValueError("max_length must be >= 0 (0 = from the model folder)")
    if config.max_texts_per_request < 1:
        raise ValueError("max_texts_per_request must be >= 1")
    if config.max_text_bytes < 1 or config.max_request_bytes < 1:
        raise ValueError("max_text_bytes and max_request_bytes must be >= 1")


@dataclass(frozen=True)
class PairTokenizerConfig:
    """The reranker's pair tokenizer (model_sets/rerank/rerank_tokenizer/config.pbtxt)."""
    model_dir: str = DEFAULT_MODEL
    max_texts_per_request: int = 4096  # documents per request
    max_text_bytes: int = 1 << 20
    max_request_bytes: int = 4 << 20
    max_length: int = 0   # tokens per (query, document) pair at most; 0 = from the model folder
    instruction: str = ""  # the default instruction of models that take one ("" = the family's)

    def __post_init__(self):
        _check_tokenizer_limits(self)

    @classmethod
    def from_parameters(cls, params: Mapping[str, str], **overrides) -> "PairTokenizerConfig":
        return _from_parameters(cls, params, overrides)


@dataclass(frozen=True)
class EncoderConfig:
    model_dir: str = DEFAULT_MODEL
    max_batch_tokens: int = 8192
    max_batch_sequences: int = 256
    max_inflight_batches: int = 2
    max_queued_tokens: int = 1 << 20
    max_queued_requests: int = 2048
    # Batch-class work passed over (interactive work filled the batches) longer than this leaves first.
    batch_promote_ms: int = 1000
    # Batch-class tokens one step carries at most (auto: 256 on a CPU, else max_batch_tokens; scheduler.py).
    max_batch_class_tokens: int = AUTO
    # Batch-class tokens a step that carries interactive work takes at most (auto: 0 on a CPU, else
    # max_batch_class_tokens; scheduler.py).
    max_backfill_tokens: int = AUTO
    # On a CPU: the budget is the largest of 64, 128, ... tokens up to max_batch_tokens whose step,
    # timed at start-up, takes at most this many ms (0: max_batch_tokens as set; batch_budget.py).
    max_cpu_step_ms: int = 250
    device: str = "auto"
    dtype: str = "auto"
    attention_backend: str = "auto"
    cuda_graphs: str = "auto"
    max_graph_tokens: int = AUTO  # auto: every batch the scheduler can form (budget, or model maximum if larger)
    max_graph_seqs: int = AUTO    # auto: max_batch_sequences
    max_graphs: int = 256  # graphs kept at most; batches of a key first seen after that run eagerly
    num_threads: int = 0
    cpu_linear: str = "auto"  # auto | onednn | plain: CPU Linears packed for oneDNN (engine_lib/models/cpu_linear.py)
    # auto | on | off: the CPU layers through inductor, compiled at load, kernels cached under cache_dir
    # (engine_lib/runner/cpu_compile.py). off by default: no gain measured, 12-16 s more start-up (docs/engine.md).
    cpu_compile: str = "off"
    task: str = "embed"  # "embed" (EMBEDDINGS rows) or "score" (SCORES, a reranker folder)
    self_check: bool = True
    # Where the int8 calibration rows and cpu_compile's inductor kernels are cached
    # ("" = $XDG_CACHE_HOME/rose, else ~/.cache/rose);
    # never the model folder (engine_lib/service/calibration.py).
    cache_dir: str = ""

    # max_batch_tokens=auto: measured at start-up (batch_budget.py)
    AUTO_FIELDS = ("max_batch_tokens", "max_graph_tokens", "max_graph_seqs", "max_batch_class_tokens",
                   "max_backfill_tokens")

    def __post_init__(self):
        if self.task not in ("embed", "score"):
            raise ValueError(f"task must be embed or score, got {self.task!r}")
        for name in ("max_batch_tokens", "max_batch_sequences", "max_inflight_batches",
                     "max_queued_tokens", "max_queued_requests", "max_graphs", "batch_promote_ms",
                     "max_batch_class_tokens"):
            value = getattr(self, name)
            if value < 1 and not (name in self.AUTO_FIELDS and value == AUTO):
                raise ValueError(f"{name} must be >= 1{' (or auto)' if name in self.AUTO_FIELDS else ''}, got {value}")
        if self.device not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", self.device):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.cuda_graphs not in ("auto", "on", "off"):
            raise ValueError(f"cuda_graphs must be auto, on or off, got {self.cuda_graphs!r}")
        if self.max_cpu_step_ms < 0:
            raise ValueError(f"max_cpu_step_ms must be >= 0 (0 = no bound), got {self.max_cpu_step_ms}")
        if self.max_backfill_tokens != AUTO and self.max_backfill_tokens < 0:
            raise ValueError(f"max_backfill_tokens must be >= 0 (or auto), got {self.max_backfill_tokens}")
        if self.max_graph_tokens != AUTO and self.max_graph_tokens < 64:
            raise ValueError(f"max_graph_tokens must be >= 64 (or auto), got {self.max_graph_tokens}")
        if self.max_graph_seqs != AUTO and self.max_graph_seqs < 1:
            raise ValueError(f"max_graph_seqs must be >= 1 (or auto), got {self.max_graph_seqs}")
        if self.cpu_linear not in ("auto", "onednn", "plain"):
            raise ValueError(f"cpu_linear must be auto, onednn or plain, got {self.cpu_linear!r}")
        if self.cpu_compile not in ("auto", "on", "off"):
            raise ValueError(f"cpu_compile must be auto, on or off, got {self.cpu_compile!r}")
        if self.num_threads < 0:
            raise ValueError("num_threads must be >= 0 (0 = auto: engine_lib/runner/step_threads.py)")

    @classmethod
    def from_parameters(cls, params: Mapping[str, str], **overrides) -> "EncoderConfig":
        return _from_parameters(cls, params, overrides)
