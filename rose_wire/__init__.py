"""The contract between the server's models, the client and the gateway, standard library only:
tensor and model names (names.py) and errors as a code, the offending field and a message (errors.py)."""
from .errors import CANCELLED, CODES, INTERNAL, INVALID_ARG, TRITON_QUEUE_FULL, UNAVAILABLE, WireError, decode, encode
from .names import (
    DEFAULT_EMBEDDER,
    DEFAULT_RERANKER,
    DOCUMENTS,
    EMBED,
    EMBEDDER,
    EMBEDDINGS,
    ENSEMBLE,
    INPUT_IDS,
    MODELS,
    QUERY,
    RERANK,
    RERANK_ENCODER,
    RERANK_TOKENIZER,
    RERANKER,
    ROSE_ENCODER,
    SCORE,
    SCORES,
    SEQ_LENS,
    TENSORS,
    TEXT,
    TOKEN_TYPE_IDS,
    TOKENIZER,
    ServedModels,
    served_models,
)

__all__ = ["CANCELLED", "CODES", "INTERNAL", "INVALID_ARG", "TRITON_QUEUE_FULL", "UNAVAILABLE", "WireError", "decode",
           "encode", "DOCUMENTS", "EMBED", "EMBEDDINGS", "ENSEMBLE", "INPUT_IDS", "MODELS", "QUERY", "RERANK",
           "RERANK_ENCODER", "RERANK_TOKENIZER", "ROSE_ENCODER", "SCORE", "SCORES", "SEQ_LENS", "TENSORS", "TEXT",
           "TOKEN_TYPE_IDS", "TOKENIZER", "DEFAULT_EMBEDDER", "DEFAULT_RERANKER", "EMBEDDER", "RERANKER",
           "ServedModels", "served_models"]
