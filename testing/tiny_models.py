"""Random-weight model folders for reference tests (no hub): HF model + safetensors + tokenizer.

Shared by tests (models, runner, e2e) and perf/.
Weights are perturbed away from HF's init (norm weights of exactly 1, zero
biases) so that a wrong norm, bias or position handling cannot hide.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

EOS = "<|endoftext|>"
TEMPLATE_WORDS = "Instruct : Given a web search query , retrieve relevant passages that answer the query Query"


def qwen3_config(**overrides):
    from transformers import Qwen3Config

    base = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                rms_norm_eps=1e-6, rope_theta=500.0, tie_word_embeddings=False)
    return Qwen3Config(**{**base, **overrides})


def xlm_roberta_config(**overrides):
    from transformers import XLMRobertaConfig

    base = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1)
    return XLMRobertaConfig(**{**base, **overrides})


def perturb_(model: torch.nn.Module, seed: int, scale: float = 0.1) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * scale)


def save_random_model(model_cls, config, folder: str | os.PathLike, seed: int = 0,
                      extra_config: dict | None = None):
    """Build `model_cls(config)` with perturbed random weights and save it; returns the HF model."""
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    perturb_(model, seed)
    model.save_pretrained(folder)
    if extra_config:
        path = Path(folder) / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **extra_config}, indent=2))
    return model


def write_pooling(folder: str | os.PathLike, mode: str) -> None:
    key = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
           "lasttoken": "pooling_mode_lasttoken"}[mode]
    pooling = Path(folder) / "1_Pooling"
    pooling.mkdir(exist_ok=True)
    (pooling / "config.json").write_text(json.dumps({key: True}))


def write_word_tokenizer(folder: str | os.PathLike, corpus: list[str], vocab_size: int) -> dict:
    """A WordLevel tokenizer.json (+ tokenizer_config.json naming EOS) trained on `corpus`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=["<unk>", EOS])
    tokenizer.train_from_iterator(corpus + [TEMPLATE_WORDS], trainer)
    tokenizer.save(str(Path(folder) / "tokenizer.json"))
    (Path(folder) / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "model_max_length": 128}))
    return tokenizer.get_vocab()


def random_sequences(lengths, vocab_size: int, seed: int = 0, low: int = 2) -> list[np.ndarray]:
    """Token ids in [low, vocab_size): skips the ids tokenizers and XLM-R reserve (unk/pad)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(low, vocab_size, size=n).astype(np.int64) for n in lengths]


def cosine_rows(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@torch.inference_mode()
def hf_hidden_states(model, sequences, **kwargs) -> list[np.ndarray]:
    """Reference last_hidden_state per sequence, each run alone (no padding involved)."""
    out = []
    for ids in sequences:
        hidden = model(input_ids=torch.as_tensor(ids)[None], **kwargs).last_hidden_state[0]
        out.append(hidden.float().cpu().numpy())
    return out
