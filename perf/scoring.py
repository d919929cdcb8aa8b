"""The seed's scoring scenario on a reranker: a query and N documents, pre-tokenized pairs, scores back.

Ours: the pairs' ids (+ segment ids) streamed to `rerank_encoder` (the server
runs with --rerank-model-dir) by perf/targets.py's RoseStream. Peer: sentence-transformers'
CrossEncoder.predict in-process on the same pairs. Every warm-up score is checked against
CrossEncoder (within MAX_SCORE_DIFF) before timing.
"""
from __future__ import annotations

import random
import shutil
import sys
from pathlib import Path

import numpy as np

from .texts import Request, TextMaker

MAX_SCORE_DIFF = 1e-3  # probabilities
QUERY_TOKENS = 16


class PairRequests:
    """Requests of one query and `batch` documents; pairs tokenized by our pair tokenizer."""

    def __init__(self, model_dir: str):
        from engine_lib.config import PairTokenizerConfig
        from engine_lib.tokenization.pairs import PairTokenizer

        self.pairs = PairTokenizer(model_dir, PairTokenizerConfig())
        self.maker = TextMaker(str(Path(model_dir) / "tokenizer.json"), self.pairs.max_length)

    def requests(self, num_requests: int, batch: int, pair_len: int, seed: int = 0) -> list[Request]:
        from engine_lib.options import RerankOptions

        rng = random.Random(f"pairs-{seed}-{batch}-{pair_len}")
        specials = self.maker.num_specials
        out = []
        for _ in range(num_requests):
            query = self.maker.text(QUERY_TOKENS + specials, rng)
            docs = [self.maker.text(max(2, pair_len - QUERY_TOKENS - 3 + specials), rng) for _ in range(batch)]
            ids, lens, types = self.pairs.encode(query, docs, RerankOptions())
            out.append(Request([(query, d) for d in docs], ids, lens, types if types.size else None))
        return out


class ScoreReference:
    """sentence-transformers CrossEncoder on the same folder (sigmoid for one logit)."""

    def __init__(self, model_dir: str):
        from sentence_transformers import CrossEncoder

        self.model = CrossEncoder(model_dir)

    def scores(self, request: Request) -> np.ndarray:
        return self.model.predict(request.texts, batch_size=len(request.texts))


def check_scores(got: list, want: list) -> float:
    """Largest |ours - reference| over the warm-up requests."""
    worst = 0.0
    for g, w in zip(got, want):
        g = np.asarray(g, dtype=np.float64)
        if g.shape != np.shape(w):
            raise ValueError(f"shape {g.shape}, expected {np.shape(w)}")
        worst = max(worst, float(np.abs(g - w).max()))
    return worst


def score_targets(names: list[str], grpc_url: str | None, model_dir: str, max_length: int) -> dict:
    """The reranker targets for score cells, under the names of the embedding targets they stand for."""
    from .lineup import InprocTarget, ServedTarget
    from .machine import versions
    from .targets import RoseStream

    targets = {}
    if "rose" in names and grpc_url:  # pre-tokenized pairs (+ segment ids) to `rerank_encoder` -> SCORES [N]
        spec = RoseStream(grpc_url, pre_tokenized=True, model="rerank_encoder", output="SCORES")
        targets["rose"] = ServedTarget("rose", spec, spec, versions(["nvidia-pytriton", "tritonclient", "torch"]))
    if "st" in names:
        targets["st"] = InprocTarget("st", sys.executable, "ce", model_dir, max_length)
    return targets


def make_random_cross_encoder(folder: str) -> str:
    """A random-weight cross-encoder of the ms-marco-MiniLM-L6 shape (BERT, 6 x 384, one label),
    with the embedded all-MiniLM-L6-v2 tokenizer files. Timing does not depend on weight values;
    label its results random-weight."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from engine_lib.model_folder import ModelFolder

    source = ModelFolder.open("default")
    config = BertConfig(**{k: source.config[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                                         "num_attention_heads", "intermediate_size",
                                                         "max_position_embeddings")}, num_labels=1)
    torch.manual_seed(0)
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if Path(source.file(name)).is_file():
            shutil.copy(source.file(name), Path(folder) / name)
    return folder


if __name__ == "__main__":
    print(make_random_cross_encoder(sys.argv[1]))
