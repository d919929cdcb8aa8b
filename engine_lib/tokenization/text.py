"""Texts -> flat token ids for the encoder: templates, truncation or refusal, EOS, vocab check."""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer

from engine_lib.config import TokenizerConfig
from engine_lib.contract import RaggedTokens
from engine_lib.errors import InputError, InputTooLarge
from engine_lib.model_folder import ModelFolder
from engine_lib.options import RequestOptions
from engine_lib.tokenization.ascii_path import ascii_path
from engine_lib.tokenization.fast_encode import encode_fast
from engine_lib.tokenization.long_text import cut_long_text
from engine_lib.tokenization.text_input import decode_texts
from rose_wire import TEXT

log = logging.getLogger(__name__)

QWEN3_DEFAULT_TASK = "Given a web search query, retrieve relevant passages that answer the query"


def instruction_prefix(task: str) -> str:
    r"""Qwen3-Embedding's query template is `Instruct: {task}\nQuery:{text}`; this is the part before text."""
    return f"Instruct: {task}\nQuery:"


FAMILY_QUERY_PREFIX = {"qwen3": instruction_prefix(QWEN3_DEFAULT_TASK)}


def template_prefixes(folder: ModelFolder, config: TokenizerConfig) -> dict[str, str]:
    """Prefix per input_type: the config parameter, else the folder's sentence-transformers
    prompts, else the family default (Qwen3: the instruction template for queries)."""
    prompts = folder.st_prompts
    document = config.document_prefix or prompts.get("document") or ""
    return {"query": config.query_prefix or prompts.get("query") or FAMILY_QUERY_PREFIX.get(folder.model_type, ""),
            "document": document,
            # the folder's prompts of these names where it has them (e.g. nomic-embed's), else the document's
            "classification": prompts.get("classification") or document,
            "clustering": prompts.get("clustering") or document}


def load_tokenizer(folder: ModelFolder) -> Tokenizer:
    """The folder's tokenizer with padding and truncation off; refuses one that does not fit the model."""
    tokenizer = Tokenizer.from_file(folder.tokenizer_path)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    vocab_size = folder.config.get("vocab_size")
    num_tokens = tokenizer.get_vocab_size(with_added_tokens=True)
    if isinstance(vocab_size, int) and num_tokens > vocab_size:
        raise ValueError(f"{folder.tokenizer_path}: the tokenizer has {num_tokens} tokens but "
                         f"{folder.file('config.json')} declares vocab_size {vocab_size}; "
                         f"this tokenizer does not belong to this model")
    return tokenizer


def eos_id(folder: ModelFolder, tokenizer: Tokenizer) -> int | None:
    """EOS id from tokenizer_config.json's eos_token, else config.json's eos_token_id."""
    if folder.eos_token is not None and tokenizer.token_to_id(folder.eos_token) is not None:
        return tokenizer.token_to_id(folder.eos_token)
    return folder.eos_token_id


def only_result(results: list):
    """The one request's result of a `many` call: its value, or its InputError raised."""
    if isinstance(results[0], InputError):
        raise results[0]
    return results[0]


class TextTokenizer:
    def __init__(self, model: ModelFolder | str, config: TokenizerConfig, max_length: int | None = None):
        folder = model if isinstance(model, ModelFolder) else ModelFolder.open(model)
        self.config = config
        self.max_length = max_length or config.max_length or folder.max_length
        self._full = load_tokenizer(folder)
        self._encoding = ascii_path(self._full)  # what tokenizes a batch (`encode_fast`)
        self.prefixes = template_prefixes(folder, config)
        self.append_eos_id = self._eos_to_append(folder) if folder.pooling == "lasttoken" else None
        self._truncating = {direction: ascii_path(self._truncating_tokenizer(folder, direction))
                            for direction in ("right", "left")}

    def _truncating_tokenizer(self, folder: ModelFolder, direction: str) -> Tokenizer:
        """Truncation of the templated text, special tokens kept (left: its end is kept)."""
        tokenizer = Tokenizer.from_file(folder.tokenizer_path)
        tokenizer.no_padding()
        tokenizer.enable_truncation(self.max_length - (self.append_eos_id is not None), direction=direction)
        return tokenizer

    def _eos_to_append(self, folder: ModelFolder) -> int | None:
        """Last-token pooling reads the EOS token: append it unless the tokenizer already does."""
        eos = eos_id(folder, self._full)
        if eos is None:
            log.warning("%s: last-token pooling but no EOS token is known; pooling the last text token", folder.path)
            return None
        if self._full.encode("a").ids[-1:] == [eos]:
            return None
        return eos

    def vocab_size(self) -> int:
        """Token ids the tokenizer knows, added tokens included."""
        return self._full.get_vocab_size(True)

    def decode_texts(self, raw: np.ndarray) -> list[str]:
        return decode_texts(raw, self.config)

    def template(self, text: str, input_type: str) -> str:
        return self.prefixes.get(input_type, self.prefixes["document"]) + text

    def encode(self, texts: Sequence[str], options: RequestOptions) -> RaggedTokens:
        """-> one sequence per text. An over-long text (template included) loses its end
        (`truncation_direction` right) or its start (left)."""
        return only_result(self.encode_many([(texts, options)]))

    def encode_many(self, requests: Sequence[tuple[Sequence[str], RequestOptions]]
                    ) -> list[RaggedTokens | InputError]:
        """Several requests' texts tokenized together (`encode_fast`: the ids without character offsets,
        which nothing here reads): per request what `encode` returns, or the InputError it raises
        (that request's alone; its TEXT[i] counts its own texts)."""
        templated = [cut_long_text(self._full, self.template(t, options.input_type), self.max_length,
                                   options.truncation_direction == "left")
                     for texts, options in requests for t in texts]
        extra = self.append_eos_id is not None
        encodings = [e.ids for e in encode_fast(self._encoding, templated)]
        starts = np.cumsum([0] + [len(texts) for texts, _ in requests]).tolist()
        results: list = [None] * len(requests)
        cut: dict[str, list[int]] = {}  # truncation direction -> texts to cut that way
        for r, (_, options) in enumerate(requests):
            too_long = [i for i in range(starts[r], starts[r + 1]) if len(encodings[i]) + extra > self.max_length]
            if too_long and not options.truncate:
                i = too_long[0]
                results[r] = InputError(f"TEXT[{i - starts[r]}] has {len(encodings[i]) + extra} tokens, more than "
                                        f"the model's maximum of {self.max_length}, and truncate=false", field=TEXT)
            elif too_long:
                cut.setdefault(options.truncation_direction, []).extend(too_long)
        for direction, indices in cut.items():
            for i, enc in zip(indices, encode_fast(self._truncating[direction], [templated[i] for i in indices])):
                encodings[i] = enc.ids
        if extra:
            encodings = [ids + [self.append_eos_id] for ids in encodings]
        for r, result in enumerate(results):
            if result is None:
                results[r] = RaggedTokens.from_rows(encodings[starts[r]:starts[r + 1]], options=requests[r][1])
        return results

    def encode_windows(self, texts: Sequence[str], options: RequestOptions) -> RaggedTokens:
        """chunking=mean: -> every window a sequence, with the windows per text. A text
        within the maximum is one window, its ids exactly `encode`'s; a longer one is split into
        consecutive windows of its own tokens, no overlap, each with the template prefix and the
        special tokens (and EOS) a text gets, at most `max_length` tokens in all; more than
        `max_windows_per_text` windows is InputTooLarge."""
        limit = self.config.max_windows_per_text
        windows: list[list[int]] = []
        counts = []
        for i, text in enumerate(texts):
            prefix = self.prefixes.get(options.input_type, self.prefixes["document"])
            templated = cut_long_text(self._full, prefix + text, self.max_length * (limit + 1))
            parts = self._windows(templated, len(prefix))
            if len(parts) > limit:
                raise InputTooLarge(f"TEXT[{i}] needs more than {limit} windows of {self.max_length} tokens "
                                    f"(max_windows_per_text); split it", TEXT)
            windows += parts
            counts.append(len(parts))
        return RaggedTokens.from_rows(windows, windows=counts, options=options)

    def _windows(self, templated: str, prefix_chars: int) -> list[list[int]]:
        encoding = self._full.encode(templated)
        ids, special = encoding.ids, encoding.special_tokens_mask
        eos = [self.append_eos_id] if self.append_eos_id is not None else []
        if len(ids) + len(eos) <= self.max_length:
            return [ids + eos]
        head = 0
        while head < len(ids) and special[head]:
            head += 1
        tail = len(ids)
        while tail > head and special[tail - 1]:
            tail -= 1
        # body tokens ending inside the template prefix are the prefix's: every window repeats them
        prefix = sum(1 for start, end in encoding.offsets[head:tail] if end <= prefix_chars)
        fixed = ids[:head + prefix]
        closing = ids[tail:] + eos
        room = self.max_length - len(fixed) - len(closing)
        if room < 1:
            raise InputError(f"the template leaves no room for text within {self.max_length} tokens", TEXT)
        body = ids[head + prefix:tail]
        return [fixed + body[at:at + room] + closing for at in range(0, len(body), room)]

