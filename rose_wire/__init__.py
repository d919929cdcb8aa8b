"""The contract between the server's models, the client and the gateway, standard library only:
tensor and model names (names.py) and errors as a code, the offending field and a message (errors.py)."""
from .errors import CANCELLED, CODES, INTERNAL, INVALID_ARG, TRITON_QUEUE_FULL, UNAVAILABLE, WireError, decode, encode
from .names import (
    DOCUMENTS,
    EMBED,
    EMBEDDING_OUTPUTS,
    EMBEDDINGS,
    EMBEDDINGS_BINARY,
    EMBEDDINGS_INT8,
    EMBEDDINGS_UBINARY,
    EMBEDDINGS_UINT8,
    ENSEMBLE,
    INPUT_IDS,
    INT8_RANGES,
    MODELS,
    OUTPUT_OF_TYPE,
    QUERY,
    RERANK,
    RERANK_ENCODER,
    RERANK_TOKENIZER,
    ROSE_ENCODER,
    SCORE,
    SCORES,
    SEQ_LENS,
    TENSORS,
    TEXT,
    TEXT_WINDOWS,
    TOKEN_TYPE_IDS,
    TOKENIZER,
)

__all__ = ["CANCELLED", "CODES", "INTERNAL", "INVALID_ARG", "TRITON_QUEUE_FULL", "UNAVAILABLE", "WireError", "decode",
           "encode", "DOCUMENTS", "EMBED", "EMBEDDING_OUTPUTS", "EMBEDDINGS", "EMBEDDINGS_BINARY", "EMBEDDINGS_INT8",
           "EMBEDDINGS_UBINARY", "EMBEDDINGS_UINT8", "ENSEMBLE", "INPUT_IDS", "INT8_RANGES", "MODELS",
           "OUTPUT_OF_TYPE", "QUERY", "RERANK",
           "RERANK_ENCODER", "RERANK_TOKENIZER", "ROSE_ENCODER", "SCORE", "SCORES", "SEQ_LENS", "TENSORS", "TEXT",
           "TEXT_WINDOWS", "TOKEN_TYPE_IDS", "TOKENIZER"]
