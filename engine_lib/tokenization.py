"""Text -> token ids for the encoder: decoding, templating, truncation, EOS, checks."""
from __future__ import annotations

import json
import logging
import os
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer

from .config import TokenizerConfig
from .errors import InputError
from .options import RequestOptions
from .pooling import default_pooling, read_pooling_mode

log = logging.getLogger(__name__)

CUT_CHARS_PER_TOKEN = 32  # long texts are cut to this many characters per token of max_length

QWEN3_DEFAULT_TASK = "Given a web search query, retrieve relevant passages that answer the query"


def instruction_prefix(task: str) -> str:
    r"""Qwen3-Embedding's query template is `Instruct: {task}\nQuery:{text}`; this is the part before text."""
    return f"Instruct: {task}\nQuery:"


FAMILY_QUERY_PREFIX = {"qwen3": instruction_prefix(QWEN3_DEFAULT_TASK)}


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def read_prefixes(model_dir: str, config: TokenizerConfig, model_type: str | None) -> dict[str, str]:
    """Prefix per input_type: the config parameter, else the folder's sentence-transformers
    prompts, else the family default (Qwen3: the instruction template for queries)."""
    prompts = _read_json(os.path.join(model_dir, "config_sentence_transformers.json")).get("prompts") or {}
    return {"query": config.query_prefix or prompts.get("query") or FAMILY_QUERY_PREFIX.get(model_type, ""),
            "document": config.document_prefix or prompts.get("document") or ""}


def read_eos_id(model_dir: str, tokenizer: Tokenizer, model_cfg: dict) -> int | None:
    """EOS id from tokenizer_config.json's eos_token, else config.json's eos_token_id."""
    eos = _read_json(os.path.join(model_dir, "tokenizer_config.json")).get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if isinstance(eos, str) and tokenizer.token_to_id(eos) is not None:
        return tokenizer.token_to_id(eos)
    eos_id = model_cfg.get("eos_token_id")
    if isinstance(eos_id, list):
        eos_id = eos_id[0] if eos_id else None
    return eos_id if isinstance(eos_id, int) else None


def read_max_length(model_dir: str) -> int:
    """Maximum tokens per text, as sentence-transformers would use it."""
    st_path = os.path.join(model_dir, "sentence_bert_config.json")
    if os.path.isfile(st_path):
        with open(st_path) as f:
            value = json.load(f).get("max_seq_length")
        if value:
            return int(value)
    limits = []
    for name, key in (("tokenizer_config.json", "model_max_length"), ("config.json", "max_position_embeddings")):
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            with open(path) as f:
                value = json.load(f).get(key)
            if isinstance(value, int) and value < 1_000_000:
                limits.append(value)
    if not limits:
        raise ValueError(f"{model_dir}: cannot tell the maximum sequence length")
    return min(limits)


def check_vocab_matches(tokenizer: Tokenizer, path: str, model_cfg: dict, config_path: str) -> None:
    """Refuse a tokenizer that can emit ids the model has no embedding for."""
    vocab_size = model_cfg.get("vocab_size")
    num_tokens = tokenizer.get_vocab_size(with_added_tokens=True)
    if isinstance(vocab_size, int) and num_tokens > vocab_size:
        raise ValueError(f"{path}: the tokenizer has {num_tokens} tokens but {config_path} declares "
                         f"vocab_size {vocab_size}; this tokenizer does not belong to this model")


class TextTokenizer:
    def __init__(self, model_dir: str, config: TokenizerConfig, max_length: int | None = None):
        path = os.path.join(model_dir, "tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: model folder has no tokenizer.json")
        self.config = config
        self.max_length = max_length or read_max_length(model_dir)
        self.cut_chars = self.max_length * CUT_CHARS_PER_TOKEN
        self._full = Tokenizer.from_file(path)
        self._full.no_padding()
        self._full.no_truncation()
        model_cfg = _read_json(os.path.join(model_dir, "config.json"))
        model_type = model_cfg.get("model_type")
        self.prefixes = read_prefixes(model_dir, config, model_type)
        self.append_eos_id = None
        if read_pooling_mode(model_dir, default_pooling(model_type)) == "lasttoken":
            self.append_eos_id = self._eos_to_append(model_dir, model_cfg)
        self._truncating = Tokenizer.from_file(path)
        self._truncating.no_padding()
        self._truncating.enable_truncation(self.max_length - (self.append_eos_id is not None))
        check_vocab_matches(self._full, path, model_cfg, os.path.join(model_dir, "config.json"))

    def _eos_to_append(self, model_dir: str, model_cfg: dict) -> int | None:
        """Last-token pooling reads the EOS token: append it unless the tokenizer already does."""
        eos_id = read_eos_id(model_dir, self._full, model_cfg)
        if eos_id is None:
            log.warning("%s: last-token pooling but no EOS token is known; pooling the last text token", model_dir)
            return None
        if self._full.encode("a").ids[-1:] == [eos_id]:
            return None
        return eos_id

    def decode_texts(self, raw: np.ndarray) -> list[str]:
        """BYTES tensor -> list of str, refusing empty, oversize or non-UTF-8 items."""
        if raw.ndim != 1:
            raise InputError(f"TEXT must be a 1-D list of strings, got shape {list(raw.shape)}")
        if raw.size == 0:
            raise InputError("TEXT is empty: send at least one text")
        if raw.size > self.config.max_texts_per_request:
            raise InputError(f"TEXT has {raw.size} texts; at most {self.config.max_texts_per_request} per request")
        texts = []
        total_bytes = 0
        for i, item in enumerate(raw):
            if isinstance(item, str):
                item = item.encode("utf-8")
            if not isinstance(item, bytes):
                raise InputError(f"TEXT[{i}] is not a string")
            if len(item) > self.config.max_text_bytes:
                raise InputError(f"TEXT[{i}] is {len(item)} bytes; at most {self.config.max_text_bytes}")
            total_bytes += len(item)
            if total_bytes > self.config.max_request_bytes:
                raise InputError(f"TEXT holds more than {self.config.max_request_bytes} bytes in all; split the request")
            try:
                text = item.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"TEXT[{i}] is not valid UTF-8 (byte {exc.start})") from None
            if not text.strip():
                raise InputError(f"TEXT[{i}] is empty or only whitespace")
            texts.append(text)
        return texts

    def template(self, text: str, input_type: str) -> str:
        return self.prefixes["query" if input_type == "query" else "document"] + text

    def encode(self, texts: Sequence[str], options: RequestOptions) -> tuple[np.ndarray, np.ndarray]:
        """-> (flat input_ids int64 [num_tokens], seq_lens int64 [num_texts])."""
        templated = [self._cut_long(self.template(t, options.input_type)) for t in texts]
        extra = self.append_eos_id is not None
        encodings = [e.ids for e in self._full.encode_batch(templated)]
        too_long = [i for i, ids in enumerate(encodings) if len(ids) + extra > self.max_length]
        if too_long and not options.truncate:
            i = too_long[0]
            raise InputError(f"TEXT[{i}] has {len(encodings[i]) + extra} tokens, more than the model's maximum "
                             f"of {self.max_length}, and truncate=false")
        if too_long:
            for i, enc in zip(too_long, self._truncating.encode_batch([templated[i] for i in too_long])):
                encodings[i] = enc.ids
        if extra:
            encodings = [ids + [self.append_eos_id] for ids in encodings]
        seq_lens = np.fromiter((len(ids) for ids in encodings), dtype=np.int64, count=len(encodings))
        input_ids = np.fromiter((t for ids in encodings for t in ids), dtype=np.int64, count=int(seq_lens.sum()))
        return input_ids, seq_lens

    def _cut_long(self, text: str) -> str:
        """`text`, or a prefix of it whose first max_length tokens are the text's own.

        Tokenizing costs time linear in characters (seconds per MiB on a slow
        core) and truncation only happens after it, so a long text is cut to
        `cut_chars` first. The cut is kept only when the words before the cut
        word already give more than max_length tokens: normalizer and
        pre-tokenizer see local context only, so those tokens cannot change.
        Otherwise (e.g. mostly whitespace) the whole text is tokenized.
        """
        if len(text) <= self.cut_chars:
            return text
        prefix = text[:self.cut_chars]
        words = [w for w in self._full.encode(prefix, add_special_tokens=False).word_ids if w is not None]
        if words and sum(w < words[-1] for w in words) > self.max_length:
            return prefix
        return text
