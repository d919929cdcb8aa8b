"""One request's input tensors -> the encoder's input tensors.

The tokenizer models (`tokenizer`, `rerank_tokenizer`) and the unary fronts
(`embed`, `score`), which tokenize in their own process and call the encoder
directly, all run these steps, so both paths send the encoder the same ids."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from engine_lib import faults
from engine_lib.config import PairTokenizerConfig, TokenizerConfig
from engine_lib.contract import RaggedTokens
from engine_lib.errors import InputError
from engine_lib.options import RequestOptions, RerankOptions
from engine_lib.tokenization.pairs import PairTokenizer
from engine_lib.tokenization.colbert import text_tokenizer
from engine_lib.tokenization.text import only_result
from rose_wire import DOCUMENTS, INPUT_IDS, QUERY, SEQ_LENS, TEXT, TEXT_WINDOWS, TOKEN_TYPE_IDS

Tensors = Mapping[str, "np.ndarray | None"]


def _required(tensors: Tensors, name: str) -> np.ndarray:
    array = tensors.get(name)
    if array is None:
        raise InputError(f"input {name} is missing", field=name)
    return array


def _or_empty(array: np.ndarray | None) -> np.ndarray:
    return np.zeros(0, dtype=np.int64) if array is None else array


def wire_tensors(tokens: RaggedTokens, optional: str) -> dict[str, np.ndarray]:
    """The encoder's input tensors of `tokens`: INPUT_IDS, SEQ_LENS and the step's `optional` one
    (TEXT_WINDOWS or TOKEN_TYPE_IDS), empty when the tokens have none."""
    extra = tokens.windows if optional == TEXT_WINDOWS else tokens.token_types
    return {INPUT_IDS: tokens.input_ids, SEQ_LENS: tokens.seq_lens, optional: _or_empty(extra)}


class TextStep:
    """TEXT -> INPUT_IDS + SEQ_LENS + TEXT_WINDOWS (request options: input_type, truncate,
    truncation_direction, chunking; TEXT_WINDOWS is empty, one sequence a text, unless chunking)."""
    config_cls = TokenizerConfig
    inputs = (TEXT,)

    def __init__(self, config: TokenizerConfig):
        self.tokenizer = text_tokenizer(config.model_dir, config)

    def __call__(self, tensors: Tensors, parameters: dict | str | None) -> dict[str, np.ndarray]:
        return only_result(self.many([(tensors, parameters)]))

    def many(self, requests) -> list:
        """Several requests' (tensors, parameters) -> per request its tensors or its InputError; the
        texts of those without chunking are tokenized together (`encode_fast`)."""
        faults.wait(faults.TOKENIZE)  # test-only hold (engine_lib/faults.py); off: returns at once
        results: list = [None] * len(requests)
        plain = []
        for i, (tensors, parameters) in enumerate(requests):
            try:
                options = RequestOptions.from_parameters(parameters)
                texts = self.tokenizer.decode_texts(_required(tensors, TEXT))
                if options.chunking == "mean":
                    results[i] = wire_tensors(self.tokenizer.encode_windows(texts, options), TEXT_WINDOWS)
                else:
                    plain.append((i, texts, options))
            except InputError as exc:
                results[i] = exc
        encoded = self.tokenizer.encode_many([(texts, options) for _, texts, options in plain]) if plain else []
        for (i, _, _), tokens in zip(plain, encoded):
            results[i] = tokens if isinstance(tokens, InputError) else wire_tensors(tokens, TEXT_WINDOWS)
        return results


class PairStep:
    """QUERY + DOCUMENTS -> INPUT_IDS + SEQ_LENS + TOKEN_TYPE_IDS (empty for families without segments)."""
    config_cls = PairTokenizerConfig
    inputs = (QUERY, DOCUMENTS)

    def __init__(self, config: PairTokenizerConfig):
        self.tokenizer = PairTokenizer(config.model_dir, config)

    def __call__(self, tensors: Tensors, parameters: dict | str | None) -> dict[str, np.ndarray]:
        options = RerankOptions.from_parameters(parameters)
        query, documents = self.tokenizer.decode(_required(tensors, QUERY), _required(tensors, DOCUMENTS))
        return wire_tensors(self.tokenizer.encode(query, documents, options), TOKEN_TYPE_IDS)

    def many(self, requests) -> list:
        results = []
        for tensors, parameters in requests:
            try:
                results.append(self(tensors, parameters))
            except InputError as exc:
                results.append(exc)
        return results


def step_for_inputs(names: Sequence[str]) -> type[TextStep] | type[PairStep]:
    """The step that takes exactly these inputs (a unary front's config.pbtxt inputs)."""
    for step in (TextStep, PairStep):
        if set(step.inputs) == set(names):
            return step
    raise ValueError(f"no tokenize step takes inputs {sorted(names)}; known: "
                     f"{[list(s.inputs) for s in (TextStep, PairStep)]}")
