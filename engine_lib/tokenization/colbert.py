"""Texts -> ids as PyLate tokenizes them for a ColBERT folder (engine_lib/retrieval.py `ColbertConfig`;
pylate/models/colbert.py `tokenize`): the text with the tokenizer's special tokens, truncated to the
query or document length less one, then the query or document prefix token inserted after the first
token; a query padded with the expansion token to `query_length`. `input_type` query is a query,
every other input type a document.

`text_tokenizer` picks this or the plain TextTokenizer for a folder: the tokenizer models and the
gateway both build theirs through it, so both send the encoder the same ids."""
from __future__ import annotations

from typing import Sequence

from engine_lib.config import TokenizerConfig
from engine_lib.contract import RaggedTokens
from engine_lib.errors import InputError
from engine_lib.model_folder import ModelFolder
from engine_lib.options import RequestOptions
from engine_lib.retrieval import COLBERT, ColbertConfig, retrieval_kind
from engine_lib.tokenization.text import TextTokenizer, only_result

QUERY, DOCUMENT = "query", "document"


def text_tokenizer(model: ModelFolder | str, config: TokenizerConfig):
    """A ColbertTokenizer for a ColBERT folder, else a TextTokenizer."""
    folder = model if isinstance(model, ModelFolder) else ModelFolder.open(model)
    if retrieval_kind(folder) == COLBERT:
        return ColbertTokenizer(folder, config)
    return TextTokenizer(folder, config)


def role(options: RequestOptions) -> str:
    return QUERY if options.input_type == QUERY else DOCUMENT


class ColbertTokenizer:
    """TextTokenizer's interface (encode, encode_many, decode_texts, vocab_size, max_length)."""

    def __init__(self, folder: ModelFolder, config: TokenizerConfig):
        self.colbert = c = ColbertConfig.of(folder)
        self.config = config
        self.prefix_ids = {QUERY: c.query_prefix_id, DOCUMENT: c.document_prefix_id}
        lengths = {QUERY: c.query_length, DOCUMENT: c.document_length}
        self._text = {}
        for name, length in lengths.items():
            text = TextTokenizer(folder, config, length - (self.prefix_ids[name] is not None))
            text.prefixes = dict.fromkeys(text.prefixes, "")  # the prefix is a token, inserted below
            self._text[name] = text
        self.max_length = max(lengths.values())

    def vocab_size(self) -> int:
        return self._text[DOCUMENT].vocab_size()

    def decode_texts(self, raw):
        return self._text[DOCUMENT].decode_texts(raw)

    def encode(self, texts: Sequence[str], options: RequestOptions) -> RaggedTokens:
        return only_result(self.encode_many([(texts, options)]))

    def encode_many(self, requests: Sequence[tuple[Sequence[str], RequestOptions]]
                    ) -> list[RaggedTokens | InputError]:
        results: list = [None] * len(requests)
        for name, text in self._text.items():
            mine = [r for r, (_, options) in enumerate(requests) if role(options) == name]
            for r, result in zip(mine, text.encode_many([requests[r] for r in mine])):
                results[r] = result if isinstance(result, InputError) else self._finish(result, name)
        return results

    def encode_windows(self, texts: Sequence[str], options: RequestOptions) -> RaggedTokens:
        raise InputError("chunking='mean' is not supported by a colbert model", "chunking")

    def _finish(self, tokens: RaggedTokens, name: str) -> RaggedTokens:
        prefix = self.prefix_ids[name]
        offsets = tokens.offsets
        rows = []
        for a, b in zip(offsets[:-1], offsets[1:]):
            ids = tokens.input_ids[a:b].tolist()
            if prefix is not None:
                ids = ids[:1] + [prefix] + ids[1:]
            if name == QUERY and self.colbert.do_query_expansion:
                ids += [self.colbert.expansion_id] * (self.colbert.query_length - len(ids))
            rows.append(ids)
        return RaggedTokens.from_rows(rows, options=tokens.options)
