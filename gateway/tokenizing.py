"""Texts and token-id inputs -> flat INPUT_IDS + SEQ_LENS, with the tokenizer
model's own code (engine_lib.tokenization.text) and settings (its config.pbtxt and
the launcher's ROSE_* overrides, read by rose_triton.parameters), so the ids equal
the ensemble path's, and its request limits (engine_lib.tokenization.text_input)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine_lib.config import TokenizerConfig
from engine_lib.errors import InputError
from engine_lib.model_folder import ModelFolder
from engine_lib.options import RequestOptions
from engine_lib.tokenization.text import TextTokenizer
from engine_lib.tokenization.text_input import check_count, check_texts
from rose_triton.parameters import config_from_pbtxt

from .errors import bad_request, from_input_error


@dataclass(frozen=True)
class Encoded:
    input_ids: np.ndarray  # int64 [num_tokens], all sequences concatenated
    seq_lens: np.ndarray   # int64 [num_sequences]: one per input, or (chunking) one per window
    windows: np.ndarray | None = None  # int64 [num_inputs]: windows per input (chunking=mean), else None

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.seq_lens)])

    @property
    def input_tokens(self) -> list[int]:
        """Tokens per input (all its windows')."""
        if self.windows is None:
            return self.seq_lens.tolist()
        return np.add.reduceat(self.seq_lens, np.concatenate([[0], np.cumsum(self.windows)[:-1]])).tolist()

    @property
    def window_offsets(self) -> np.ndarray:
        """Input i's sequences are seq_lens[window_offsets[i]:window_offsets[i + 1]]."""
        counts = self.windows if self.windows is not None else np.ones(len(self.seq_lens), dtype=np.int64)
        return np.concatenate([[0], np.cumsum(counts)])


class GatewayTokenizer:
    def __init__(self, tokenizer_config: str | TokenizerConfig, model_dir: str = ""):
        """`tokenizer_config`: a config.pbtxt, or the settings themselves (a model served by name);
        `model_dir` (--model-dir) over ROSE_MODEL_DIR over the config.pbtxt's."""
        if isinstance(tokenizer_config, TokenizerConfig):
            self.config = tokenizer_config
        else:
            self.config = config_from_pbtxt(TokenizerConfig, tokenizer_config, model_dir=model_dir or None)
        folder = ModelFolder.open(self.config.model_dir)
        self.model_dir = folder.path
        self.text = TextTokenizer(folder, self.config)
        self.max_length = self.text.max_length
        vocab_size = folder.config.get("vocab_size")
        self.vocab_size = vocab_size if isinstance(vocab_size, int) else self.text._full.get_vocab_size(True)
        hidden_size = folder.config.get("hidden_size")  # the embedding rows' width (engine_lib.models.heads)
        self.output_dim = hidden_size if isinstance(hidden_size, int) and hidden_size > 0 else None

    def check_texts(self, texts: list[str]) -> None:
        """The tokenizer model's limits, as HTTP statuses (size -> 413, content -> 400)."""
        try:
            check_texts(texts, self.config, "input")
        except InputError as exc:
            raise from_input_error(exc) from None

    def encode_texts(self, texts: list[str], options: RequestOptions) -> Encoded:
        try:
            if options.chunking == "mean":
                return Encoded(*self.text.encode_windows(texts, options))
            input_ids, seq_lens = self.text.encode(texts, options)
        except InputError as exc:  # too long with truncate=false (400), too many windows (413)
            raise from_input_error(type(exc)(str(exc).replace("TEXT[", "input["), exc.field), "input") from None
        return Encoded(input_ids, seq_lens)

    def encode_ids(self, inputs: list[list[int]], truncate: bool, direction: str = "right") -> Encoded:
        """Token-id inputs go to the encoder as given (no template, no special tokens); an
        over-long one is cut at its end (`direction` right) or its start (left)."""
        try:
            check_count(len(inputs), self.config, "input", "token-id inputs")
        except InputError as exc:
            raise from_input_error(exc) from None
        rows = []
        for i, ids in enumerate(inputs):
            if not ids:
                raise bad_request(f"input[{i}] is an empty list of token ids", "input")
            if len(ids) > self.max_length:
                if not truncate:
                    raise bad_request(f"input[{i}] has {len(ids)} tokens, more than the model's maximum of "
                                      f"{self.max_length}, and truncate=false", "input")
                ids = ids[-self.max_length:] if direction == "left" else ids[:self.max_length]
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
