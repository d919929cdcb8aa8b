"""(query, documents) -> one token sequence per pair for a reranker: templates, truncation, checks.

Cross-encoders use the tokenizer's own pair template (`[CLS] q [SEP] d [SEP]`
with segment ids 0/1 for BERT, `<s> q </s></s> d </s>` for XLM-RoBERTa).
Qwen3-Reranker-style judges use the model card's chat template: fixed
prefix and suffix tokenized alone, the middle
`<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}` tokenized
as one text. Truncation cuts the document side and keeps the query.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from tokenizers import Tokenizer

from engine_lib.config import PairTokenizerConfig
from engine_lib.contract import RaggedTokens
from engine_lib.errors import InputError
from engine_lib.model_folder import SCORING_ARCHITECTURES, ModelFolder, scoring_architecture
from engine_lib.options import RerankOptions
from engine_lib.tokenization.ascii_path import ascii_path
from engine_lib.tokenization.fast_encode import encode_fast
from engine_lib.tokenization.long_text import cut_long_text
from engine_lib.tokenization.text import load_tokenizer
from engine_lib.tokenization.text_input import decode_texts
from rose_wire import DOCUMENTS, QUERY

QWEN3_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
                "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
                "<|im_start|>user\n")
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_TASK = "Given a web search query, retrieve relevant passages that answer the query"
QWEN3_MAX_LENGTH = 8192  # the model card's max_length


def judge_text(instruction: str, query: str, document: str) -> str:
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"


class PairTokenizer:
    def __init__(self, model: ModelFolder | str, config: PairTokenizerConfig):
        folder = model if isinstance(model, ModelFolder) else ModelFolder.open(model)
        cfg = folder.config
        self.style = SCORING_ARCHITECTURES[scoring_architecture(cfg, folder.file("config.json"))]
        self.config = config
        self.segments = int(cfg.get("type_vocab_size", 1) or 1) > 1
        self.max_length = config.max_length or self._folder_max_length(folder)
        self._tok = load_tokenizer(folder)
        self._encoding = ascii_path(self._tok)  # what tokenizes a batch (`encode_fast`)
        self.instruction = config.instruction or QWEN3_TASK
        if self.style == "yes-no":
            self.prefix = self._tok.encode(QWEN3_PREFIX, add_special_tokens=False).ids
            self.suffix = self._tok.encode(QWEN3_SUFFIX, add_special_tokens=False).ids
            self.budget = self.max_length - len(self.prefix) - len(self.suffix)  # tokens for the middle
        else:
            self._cutting = Tokenizer.from_file(folder.tokenizer_path)
            self._cutting.no_padding()
            self._cutting.enable_truncation(self.max_length, strategy="only_second")

    def _folder_max_length(self, folder: ModelFolder) -> int:
        limit = folder.max_length
        if folder.model_type == "xlm-roberta":
            limit = min(limit, folder.config["max_position_embeddings"] - 2)  # positions start at padding_idx + 1
        if self.style == "yes-no":
            limit = min(limit, QWEN3_MAX_LENGTH)
        return limit

    def decode(self, query: np.ndarray, documents: np.ndarray) -> tuple[str, list[str]]:
        if query.size != 1:
            raise InputError(f"QUERY must hold exactly one text, got shape {list(query.shape)}", field=QUERY)
        return decode_texts(query.reshape(1), self.config, QUERY)[0], decode_texts(documents, self.config, DOCUMENTS)

    def encode(self, query: str, documents: Sequence[str], options: RerankOptions) -> RaggedTokens:
        """-> one sequence per document (token types: None for families without segments)."""
        if options.instruction and self.style != "yes-no":
            raise InputError("parameter 'instruction': this reranker (a cross-encoder) takes no instruction",
                             field="instruction")
        if options.truncate:
            documents = [cut_long_text(self._tok, d, self.max_length) for d in documents]
        if self.style == "yes-no":
            ids, types = self._encode_judge(query, documents, options), None
        else:
            ids, types = self._encode_pairs(query, documents, options)
        return RaggedTokens.from_rows(ids, types, options=options)

    def _too_long(self, i: int, num_tokens: int) -> InputError:
        return InputError(f"DOCUMENTS[{i}] with the query is {num_tokens} tokens, more than the model's maximum "
                          f"of {self.max_length}, and truncate=false", field=DOCUMENTS)

    def _query_too_long(self) -> InputError:
        return InputError(f"QUERY leaves no room for a document within the model's maximum of "
                          f"{self.max_length} tokens; shorten the query", field=QUERY)

    def _encode_pairs(self, query: str, documents: Sequence[str], options: RerankOptions):
        encodings = encode_fast(self._encoding, [(query, d) for d in documents])  # ids and type ids; no offsets
        too_long = [i for i, e in enumerate(encodings) if len(e.ids) > self.max_length]
        if too_long and not options.truncate:
            raise self._too_long(too_long[0], len(encodings[too_long[0]].ids))
        if too_long:
            try:
                cut = self._cutting.encode_batch([(query, documents[i]) for i in too_long])
            except Exception:  # tokenizers: the second sequence cannot absorb the cut
                raise self._query_too_long() from None
            for i, e in zip(too_long, cut):
                if len(e.ids) > self.max_length or 1 not in e.sequence_ids:
                    raise self._query_too_long()
                encodings[i] = e
        types = [e.type_ids for e in encodings] if self.segments else None
        return [e.ids for e in encodings], types

    def _encode_judge(self, query: str, documents: Sequence[str], options: RerankOptions):
        instruction = options.instruction or self.instruction
        middles = [e.ids for e in encode_fast(self._encoding, [judge_text(instruction, query, d) for d in documents])]
        too_long = [i for i, m in enumerate(middles) if len(m) > self.budget]
        if too_long and not options.truncate:
            i = too_long[0]
            raise self._too_long(i, len(middles[i]) + len(self.prefix) + len(self.suffix))
        if too_long:
            head = len(self._tok.encode(judge_text(instruction, query, "")).ids)
            if head >= self.budget:
                raise self._query_too_long()
            for i in too_long:
                middles[i] = middles[i][:self.budget]
        return [self.prefix + m + self.suffix for m in middles]
