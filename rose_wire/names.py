"""Tensor and model names as the config.pbtxt files declare them (tests/unit/wire checks they agree)."""

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
