"""Retrieval model kinds found from the model folder, and what each gives per text (no torch).

- `bge-m3`: an XLM-R body with `sparse_linear.pt` and `colbert_linear.pt` beside it (FlagEmbedding's
  layout). Dense = CLS row (normalised on the way out); sparse = relu(sparse_linear(h)) per token,
  special tokens (cls, eos, pad, unk) dropped, a repeated token's largest weight kept, zeros dropped;
  multi-vector = normalize(colbert_linear(h)) for every token after CLS.
- `splade`: a `*ForMaskedLM` folder under sentence-transformers' SparseEncoder (`SpladePooling`):
  max over the text's tokens of log(1 + relu(MLM logits)) (log1p twice for `log1p_relu`), nonzeros kept.
- `colbert`: a folder as PyLate saves it (a module of type `pylate.*` in modules.json, or MaxSim as its
  similarity): BERT body, `Dense` projection modules, settings in config_sentence_transformers.json
  (`ColbertConfig`). Multi-vector = normalize(Dense(h)) per token: every token of a query (the
  [MASK] expansion included), a document's tokens but those in the punctuation skiplist.

A text's outputs travel from the runner to the service as one `TextOutputs` per sequence (the
engine's rows are then an object array [num_seqs, 1]: `ROW_DTYPE`).
"""
from __future__ import annotations

import json
import os
import string
from dataclasses import dataclass

import numpy as np

from engine_lib.model_folder import ModelFolder

BGE_M3, SPLADE, COLBERT = "bge-m3", "splade", "colbert"
DENSE, SPARSE, MULTIVECTOR = "float", "sparse", "multivector"  # embedding_types names
COMPACT_MULTIVECTORS = ("multivector_float16", "multivector_int8", "multivector_binary")
OFFERED = {BGE_M3: (DENSE, SPARSE, MULTIVECTOR, *COMPACT_MULTIVECTORS), SPLADE: (SPARSE,),
           COLBERT: (MULTIVECTOR, *COMPACT_MULTIVECTORS)}
ROW_DTYPE = object
M3_SPECIAL_TOKENS = ("cls_token", "eos_token", "pad_token", "unk_token")  # FlagEmbedding's unused tokens
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")


@dataclass
class TextOutputs:
    """One sequence's outputs (None: the model gives no such output)."""
    dense: np.ndarray | None = None           # fp32 [H], raw (normalised by the service)
    sparse_indices: np.ndarray | None = None  # int64 [K], ascending
    sparse_values: np.ndarray | None = None   # fp32 [K], all > 0
    multivector: np.ndarray | None = None     # fp32 [T, D], each row normalised


def retrieval_kind(folder: ModelFolder) -> str | None:
    """`bge-m3`, `splade`, `colbert`, or None for a plain embedder."""
    if all(os.path.isfile(folder.file(name)) for name in ("sparse_linear.pt", "colbert_linear.pt")):
        return BGE_M3
    if splade_pooling_path(folder) is not None:
        return SPLADE
    if any(m.get("type", "").startswith("pylate.") for m in _modules(folder)) or \
            _st_settings(folder).get("similarity_fn_name") == "MaxSim":
        return COLBERT
    return None


def _st_settings(folder: ModelFolder) -> dict:
    path = folder.file("config_sentence_transformers.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f) or {}


def _modules(folder: ModelFolder) -> list:
    path = folder.file("modules.json")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return json.load(f) or []


def splade_pooling_path(folder: ModelFolder) -> str | None:
    for module in _modules(folder):
        if module.get("type", "").endswith("SpladePooling"):
            return os.path.join(folder.path, module.get("path", ""), "config.json")
    return None


@dataclass(frozen=True)
class SpladeConfig:
    pooling: str      # max | sum
    activation: str   # relu | log1p_relu

    @classmethod
    def of(cls, folder: ModelFolder) -> "SpladeConfig":
        path = splade_pooling_path(folder)
        config = {}
        if path and os.path.isfile(path):
            with open(path) as f:
                config = json.load(f)
        pooling, activation = config.get("pooling_strategy", "max"), config.get("activation_function", "relu")
        if pooling not in ("max", "sum") or activation not in SPLADE_ACTIVATIONS:
            raise ValueError(f"{path}: SpladePooling {pooling!r}/{activation!r} is not supported "
                             f"(max or sum; {SPLADE_ACTIVATIONS})")
        if not any(a.endswith("ForMaskedLM") for a in folder.config.get("architectures") or []):
            raise ValueError(f"{folder.file('config.json')}: a SPLADE folder needs a *ForMaskedLM architecture, "
                             f"got {folder.config.get('architectures')}")
        return cls(pooling, activation)


def special_token_ids(folder: ModelFolder, names=M3_SPECIAL_TOKENS) -> list[int]:
    """Ids of the tokenizer's named special tokens (tokenizer_config.json), as FlagEmbedding looks them up."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(folder.tokenizer_path)
    ids = []
    for name in names:
        token = folder.tokenizer_config.get(name)
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and tokenizer.token_to_id(token) is not None:
            ids.append(tokenizer.token_to_id(token))
    return sorted(set(ids))


def pool_token_weights(ids: np.ndarray, weights: np.ndarray, dropped: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One text's (token id, weight) pairs -> (ascending unique ids, the largest weight of each), leaving
    out `dropped` ids and weights <= 0 (FlagEmbedding's lexical weights)."""
    keep = (weights > 0) & ~np.isin(ids, dropped)
    ids, weights = ids[keep], weights[keep]
    order = np.lexsort((-weights, ids))  # by id, the largest weight first
    ids, weights = ids[order], weights[order]
    first = np.ones(len(ids), dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    return ids[first].astype(np.int64), weights[first].astype(np.float32)


@dataclass(frozen=True)
class ColbertConfig:
    """PyLate's settings of a ColBERT folder (config_sentence_transformers.json), with PyLate's defaults
    (pylate/models/colbert.py) and the token ids they resolve to."""
    query_prefix_id: int | None     # inserted after the first token (CLS); None: no prefix ("")
    document_prefix_id: int | None
    query_length: int               # a query's tokens, prefix and expansion included
    document_length: int            # a document's tokens at most, prefix included
    do_query_expansion: bool        # pad queries to query_length with expansion_id
    attend_to_expansion_tokens: bool  # False: no token attends to the expansion (they attend to the rest)
    expansion_id: int               # the mask token, else EOS, else the pad token (as PyLate picks it)
    skiplist_ids: tuple[int, ...]   # a document's tokens left out of its vectors

    @classmethod
    def of(cls, folder: ModelFolder) -> "ColbertConfig":
        from tokenizers import Tokenizer

        settings = _st_settings(folder)
        tokenizer = Tokenizer.from_file(folder.tokenizer_path)

        def special(name: str) -> int | None:
            token = folder.tokenizer_config.get(name)
            token = token.get("content") if isinstance(token, dict) else token
            return tokenizer.token_to_id(token) if isinstance(token, str) else None

        unk = special("unk_token")

        def token_id(word: str) -> int | None:  # as transformers' convert_tokens_to_ids: unknown -> unk
            found = tokenizer.token_to_id(word)
            return unk if found is None else found

        prefixes = []
        for key, default in (("query_prefix", "[Q] "), ("document_prefix", "[D] ")):
            prefix = settings.get(key)
            prefix = default if prefix is None else prefix
            if prefix and tokenizer.token_to_id(prefix) is None:
                raise ValueError(f"{folder.file('tokenizer.json')}: the ColBERT {key} {prefix!r} is not a token "
                                 f"of the tokenizer (PyLate adds it when it saves the folder)")
            prefixes.append(tokenizer.token_to_id(prefix) if prefix else None)
        expansion = next((i for i in (special("mask_token"), special("eos_token"), special("pad_token"))
                          if i is not None), None)
        if expansion is None:
            raise ValueError(f"{folder.path}: a ColBERT tokenizer needs a mask, EOS or pad token for query expansion")
        skiplist = settings.get("skiplist_words")
        skiplist = list(string.punctuation) if skiplist is None else skiplist
        expand = bool(settings.get("do_query_expansion", True))
        return cls(prefixes[0], prefixes[1], int(settings.get("query_length") or 32),
                   int(settings.get("document_length") or 180), expand,
                   expand and bool(settings.get("attend_to_expansion_tokens", False)), expansion,
                   tuple(sorted({i for i in map(token_id, skiplist) if i is not None})))
