"""Tensor and model names as the config.pbtxt files declare them (tests/unit/wire checks they agree)."""
from typing import NamedTuple

# Tensors.
TEXT = "TEXT"                      # BYTES [N]: texts to embed
QUERY = "QUERY"                    # BYTES [1]: the reranking query
DOCUMENTS = "DOCUMENTS"            # BYTES [N]: documents to score against QUERY
INPUT_IDS = "INPUT_IDS"            # INT64 [num_tokens]: every sequence's ids, concatenated (no padding)
SEQ_LENS = "SEQ_LENS"              # INT64 [N]: tokens per sequence
TOKEN_TYPE_IDS = "TOKEN_TYPE_IDS"  # INT64 [num_tokens] or [0]: segment ids of BERT pairs
EMBEDDINGS = "EMBEDDINGS"          # FP32 [N, D]
SCORES = "SCORES"                  # FP32 [N]

# Models of the repository (model_repository/) and of the rerank set (model_sets/rerank/).
ENSEMBLE = "ensemble"              # TEXT -> tokenizer -> rose_encoder -> EMBEDDINGS (decoupled)
EMBED = "embed"                    # unary front: TEXT -> EMBEDDINGS
TOKENIZER = "tokenizer"            # TEXT -> INPUT_IDS, SEQ_LENS
ROSE_ENCODER = "rose_encoder"      # INPUT_IDS, SEQ_LENS -> EMBEDDINGS (decoupled)
RERANK = "rerank"                  # QUERY, DOCUMENTS -> rerank_tokenizer -> rerank_encoder -> SCORES (decoupled)
SCORE = "score"                    # unary front: QUERY, DOCUMENTS -> SCORES
RERANK_TOKENIZER = "rerank_tokenizer"  # QUERY, DOCUMENTS -> INPUT_IDS, SEQ_LENS, TOKEN_TYPE_IDS
RERANK_ENCODER = "rerank_encoder"  # INPUT_IDS, SEQ_LENS[, TOKEN_TYPE_IDS] -> SCORES (decoupled)

TENSORS = (TEXT, QUERY, DOCUMENTS, INPUT_IDS, SEQ_LENS, TOKEN_TYPE_IDS, EMBEDDINGS, SCORES)
MODELS = (ENSEMBLE, EMBED, TOKENIZER, ROSE_ENCODER, RERANK, SCORE, RERANK_TOKENIZER, RERANK_ENCODER)

# Served models by name (scripts/serve.sh --model NAME=DIR / --rerank-model NAME=DIR, or a
# models file): each is four Triton models named after NAME (served_models below). The
# default embedder and the --rerank-model-dir reranker keep the fixed names above.
EMBEDDER, RERANKER = "embedder", "reranker"
KINDS = (EMBEDDER, RERANKER)
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"  # a Triton model folder and a URL path segment


class ServedModels(NamedTuple):
    """One served model's Triton models."""
    ensemble: str   # decoupled: gRPC streaming, HTTP generate
    front: str      # unary: client.infer
    tokenizer: str  # the ensemble's first step
    encoder: str    # the decoupled ROSE encoder (pre-tokenized input)


DEFAULT_EMBEDDER = ServedModels(ENSEMBLE, EMBED, TOKENIZER, ROSE_ENCODER)
DEFAULT_RERANKER = ServedModels(RERANK, SCORE, RERANK_TOKENIZER, RERANK_ENCODER)
FRONT_SUFFIX = {EMBEDDER: "_embed", RERANKER: "_score"}


def served_models(name: str, kind: str) -> ServedModels:
    """The Triton models of the model served as `name`: the ensemble is `name` itself (so a
    client that names a model names its ensemble), the unary front `name`_embed (an embedder)
    or `name`_score (a reranker), then `name`_tokenizer and `name`_encoder."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return ServedModels(name, name + FRONT_SUFFIX[kind], name + "_tokenizer", name + "_encoder")
