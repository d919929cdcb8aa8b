"""A random-weight Qwen3 embedder folder (word tokenizer, EOS id) and its transformers reference."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testing.tiny_models import EOS, hf_hidden_states, qwen3_config, save_random_model, write_word_tokenizer

CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world", "embedding models map text to vectors",
          "where is the nearest train station", "a search engine ranks documents for a query"]


@dataclass
class Qwen3Embedder:
    folder: Path
    model: object   # transformers.Qwen3Model on the folder's weights
    eos_id: int

    def reference(self, texts, prefix=""):
        """transformers on the same weights: EOS appended, last token, L2-normalised."""
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        sequences = [np.array(tokenizer.encode(prefix + t).ids + [self.eos_id]) for t in texts]
        rows = np.stack([h[-1] for h in hf_hidden_states(self.model, sequences)])
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def save_qwen3_embedder(folder: Path, seed: int = 31) -> Qwen3Embedder:
    from transformers import Qwen3Model

    vocab = write_word_tokenizer(folder, CORPUS, vocab_size=128)
    model = save_random_model(Qwen3Model, qwen3_config(eos_token_id=vocab[EOS]), folder, seed=seed)
    return Qwen3Embedder(folder, model, vocab[EOS])
