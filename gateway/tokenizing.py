"""Texts and token-id inputs -> flat INPUT_IDS + SEQ_LENS, with the tokenizer
model's own code (engine_lib.tokenization.text) and settings (its config.pbtxt and
the launcher's ROSE_* overrides), so the ids equal the ensemble path's."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

import numpy as np

from engine_lib.config import TokenizerConfig
from engine_lib.errors import InputError
from engine_lib.model_folder import ModelFolder
from engine_lib.options import RequestOptions
from engine_lib.tokenization.text import TextTokenizer
from rose_triton.parameters import env_overrides

from .errors import bad_request, too_large

_PARAMETER = re.compile(r'key:\s*"([^"]+)"\s*,\s*value:\s*\{\s*string_value:\s*"((?:[^"\\]|\\.)*)"\s*\}')


def _strip_comment(line: str) -> str:
    quoted = escaped = False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "#" and not quoted:
            return line[:i]
    return line


def read_pbtxt_parameters(path: str) -> dict[str, str]:
    """The `parameters [...]` string values of a config.pbtxt."""
    with open(path) as f:
        text = "\n".join(_strip_comment(line) for line in f)
    return {key: ast.literal_eval(f'"{value}"') for key, value in _PARAMETER.findall(text)}


@dataclass(frozen=True)
class Encoded:
    input_ids: np.ndarray  # int64 [num_tokens], all inputs concatenated
    seq_lens: np.ndarray   # int64 [num_inputs]

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.seq_lens)])


class GatewayTokenizer:
    def __init__(self, tokenizer_config: str, model_dir: str = ""):
        overrides = env_overrides(TokenizerConfig)
        if model_dir:
            overrides["model_dir"] = model_dir
        self.config = TokenizerConfig.from_parameters(read_pbtxt_parameters(tokenizer_config), **overrides)
        folder = ModelFolder.open(self.config.model_dir)
        self.model_dir = folder.path
        self.text = TextTokenizer(folder, self.config)
        self.max_length = self.text.max_length
        vocab_size = folder.config.get("vocab_size")
        self.vocab_size = vocab_size if isinstance(vocab_size, int) else self.text._full.get_vocab_size(True)

    def check_texts(self, texts: list[str]) -> None:
        """The tokenizer model's limits, as HTTP statuses (size -> 413, content -> 400)."""
        cfg = self.config
        if len(texts) > cfg.max_texts_per_request:
            raise too_large(f"input has {len(texts)} items; at most {cfg.max_texts_per_request}", "input")
        total = 0
        for i, text in enumerate(texts):
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > cfg.max_text_bytes:
                raise too_large(f"input[{i}] is {size} bytes; at most {cfg.max_text_bytes}", "input")
            total += size
            if not text.strip():
                raise bad_request(f"input[{i}] is empty or only whitespace", "input")
        if total > cfg.max_request_bytes:
            raise too_large(f"input holds {total} bytes of text; at most {cfg.max_request_bytes}", "input")

    def encode_texts(self, texts: list[str], input_type: str, truncate: bool) -> Encoded:
        try:
            input_ids, seq_lens = self.text.encode(texts, RequestOptions(input_type=input_type, truncate=truncate))
        except InputError as exc:
            raise bad_request(str(exc).replace("TEXT[", "input["), "input") from None
        return Encoded(input_ids, seq_lens)

    def encode_ids(self, inputs: list[list[int]], truncate: bool) -> Encoded:
        """Token-id inputs go to the encoder as given (no template, no special tokens)."""
        if len(inputs) > self.config.max_texts_per_request:
            raise too_large(f"input has {len(inputs)} items; at most {self.config.max_texts_per_request}", "input")
        rows = []
        for i, ids in enumerate(inputs):
            if not ids:
                raise bad_request(f"input[{i}] is an empty list of token ids", "input")
            if len(ids) > self.max_length:
                if not truncate:
                    raise bad_request(f"input[{i}] has {len(ids)} tokens, more than the model's maximum of "
                                      f"{self.max_length}, and truncate=false", "input")
                ids = ids[:self.max_length]
            rows.append(ids)
        seq_lens = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        try:
            input_ids = np.fromiter((t for r in rows for t in r), dtype=np.int64, count=int(seq_lens.sum()))
        except OverflowError:
            raise bad_request(f"input holds a token id outside [0, {self.vocab_size})", "input") from None
        bad = (input_ids < 0) | (input_ids >= self.vocab_size)
        if bad.any():
            at = int(np.argmax(bad))
            row = int(np.searchsorted(np.cumsum(seq_lens), at, side="right"))
            raise bad_request(f"input[{row}] holds token id {int(input_ids[at])}, outside [0, {self.vocab_size})",
                              "input")
        return Encoded(input_ids, seq_lens)
