"""Tensor and model names as the config.pbtxt files declare them (tests/unit/wire checks they agree)."""
from typing import NamedTuple

# Tensors.
TEXT = "TEXT"                      # BYTES [N]: texts to embed
QUERY = "QUERY"                    # BYTES [1]: the reranking query
DOCUMENTS = "DOCUMENTS"            # BYTES [N]: documents to score against QUERY
INPUT_IDS = "INPUT_IDS"            # INT64 [num_tokens]: every sequence's ids, concatenated (no padding)
SEQ_LENS = "SEQ_LENS"              # INT64 [N]: tokens per sequence
TOKEN_TYPE_IDS = "TOKEN_TYPE_IDS"  # INT64 [num_tokens] or [0]: segment ids of BERT pairs
TEXT_WINDOWS = "TEXT_WINDOWS"      # INT64 [N] or [0]: sequences (windows) per text, with chunking; [0]: one each
EMBEDDINGS = "EMBEDDINGS"          # FP32 [N, D]
EMBEDDINGS_INT8 = "EMBEDDINGS_INT8"        # INT8 [N, D]: scalar-quantized with the model's calibrated ranges
EMBEDDINGS_UINT8 = "EMBEDDINGS_UINT8"      # UINT8 [N, D]: the same buckets, unsigned
EMBEDDINGS_BINARY = "EMBEDDINGS_BINARY"    # INT8 [N, ceil(D/8)]: packed sign bits, minus 128
EMBEDDINGS_UBINARY = "EMBEDDINGS_UBINARY"  # UINT8 [N, ceil(D/8)]: packed sign bits
INT8_RANGES = "INT8_RANGES"        # FP32 [2, D]: per-dimension [min, max] the int8/uint8 rows were quantized with
SCORES = "SCORES"                  # FP32 [N]
# Ragged retrieval outputs (engine_lib/retrieval.py), concatenated over the texts with a count per text.
SPARSE_INDICES = "SPARSE_INDICES"  # INT64 [K]: each text's token ids, ascending within a text
SPARSE_VALUES = "SPARSE_VALUES"    # FP32 [K]: their weights (> 0)
SPARSE_COUNTS = "SPARSE_COUNTS"    # INT64 [N]: entries per text
MULTIVECTOR = "MULTIVECTOR"        # FP32 [T, D]: each text's token vectors, normalised
MULTIVECTOR_COUNTS = "MULTIVECTOR_COUNTS"  # INT64 [N]: vectors per text
MULTIVECTOR_FP16 = "MULTIVECTOR_FP16"      # FP16 [T, D]: the same vectors in float16
MULTIVECTOR_INT8 = "MULTIVECTOR_INT8"      # INT8 [T, D]: round(127 x each component) (the vectors are unit-length)
MULTIVECTOR_BINARY = "MULTIVECTOR_BINARY"  # UINT8 [T, ceil(D/8)]: sign bits (component > 0) packed 8 per byte

# Models of the repository (model_repository/) and of the rerank set (model_sets/rerank/).
ENSEMBLE = "ensemble"              # TEXT -> tokenizer -> rose_encoder -> EMBEDDINGS (decoupled)
EMBED = "embed"                    # unary front: TEXT -> EMBEDDINGS
EMBED_BATCHED = "embed_batched"    # unary front behind Triton's dynamic batcher: TEXT [B, 1] -> EMBEDDINGS [B, D]
TOKENIZER = "tokenizer"            # TEXT -> INPUT_IDS, SEQ_LENS
ROSE_ENCODER = "rose_encoder"      # INPUT_IDS, SEQ_LENS -> EMBEDDINGS (decoupled)
RERANK = "rerank"                  # QUERY, DOCUMENTS -> rerank_tokenizer -> rerank_encoder -> SCORES (decoupled)
SCORE = "score"                    # unary front: QUERY, DOCUMENTS -> SCORES
RERANK_TOKENIZER = "rerank_tokenizer"  # QUERY, DOCUMENTS -> INPUT_IDS, SEQ_LENS, TOKEN_TYPE_IDS
RERANK_ENCODER = "rerank_encoder"  # INPUT_IDS, SEQ_LENS[, TOKEN_TYPE_IDS] -> SCORES (decoupled)

# Output types a request names (request parameter `embedding_types`) -> the tensor carrying each.
OUTPUT_OF_TYPE = {"float": EMBEDDINGS, "int8": EMBEDDINGS_INT8, "uint8": EMBEDDINGS_UINT8,
                  "binary": EMBEDDINGS_BINARY, "ubinary": EMBEDDINGS_UBINARY, "int8_ranges": INT8_RANGES}
# Ragged types -> the tensors carrying each (only the retrieval kinds give them).
OUTPUTS_OF_RAGGED_TYPE = {"sparse": (SPARSE_INDICES, SPARSE_VALUES, SPARSE_COUNTS),
                          "multivector": (MULTIVECTOR, MULTIVECTOR_COUNTS),
                          "multivector_float16": (MULTIVECTOR_FP16, MULTIVECTOR_COUNTS),
                          "multivector_int8": (MULTIVECTOR_INT8, MULTIVECTOR_COUNTS),
                          "multivector_binary": (MULTIVECTOR_BINARY, MULTIVECTOR_COUNTS)}
EMBEDDING_OUTPUTS = tuple(OUTPUT_OF_TYPE.values())  # the embedding models' outputs, in config.pbtxt order

RAGGED_OUTPUTS = tuple(dict.fromkeys(t for ts in OUTPUTS_OF_RAGGED_TYPE.values() for t in ts))
TENSORS = (TEXT, QUERY, DOCUMENTS, INPUT_IDS, SEQ_LENS, TOKEN_TYPE_IDS, TEXT_WINDOWS, *EMBEDDING_OUTPUTS, SCORES,
           *RAGGED_OUTPUTS)
MODELS = (ENSEMBLE, EMBED, EMBED_BATCHED, TOKENIZER, ROSE_ENCODER, RERANK, SCORE, RERANK_TOKENIZER, RERANK_ENCODER)

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
