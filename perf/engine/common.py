"""What the engine profiles share: model shapes, a random-weight model folder, token-id requests,
and a CPU stand-in for CUDA graph capture (dry runs)."""
from __future__ import annotations

import numpy as np

from ..texts import Request

QWEN3_EMBEDDING_0_6B = dict(vocab_size=151669, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                            num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                            max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                            tie_word_embeddings=True)
TINY_QWEN3 = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=128, max_position_embeddings=1024, rms_norm_eps=1e-6,
                  rope_theta=10000.0)


def save_random_qwen3(shape: dict, folder: str, device: str = "cpu"):
    """Random Qwen3 weights (seed 0, initialised on `device`) saved as safetensors; returns the fp32 HF model.
    Timing does not depend on weight values; results say random-weight."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3Model(Qwen3Config(**shape)).eval()
    model.save_pretrained(folder)
    return model


def model_record(shape: dict, dry_run: bool) -> dict:
    """The results' `model` entry for a random-weight Qwen3 of `shape`."""
    return {"name": "random tiny Qwen3" if dry_run else "random Qwen3-Embedding-0.6B shape",
            "config": {k: shape[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                             "num_attention_heads")}}


def rerun_capture(fn):
    """CPU stand-in for CUDA graph capture: replay re-runs the step over the static buffers."""
    output = fn()
    return (lambda: output.copy_(fn())), output


def token_request(sequences) -> Request:
    """Pre-tokenized sequences as the harness's request (no texts)."""
    return Request([], np.concatenate(sequences).astype(np.int64),
                   np.array([len(s) for s in sequences], dtype=np.int64))


def token_requests(rng, num_requests: int, batch: int, length: int, vocab_size: int) -> list[Request]:
    """`num_requests` requests of `batch` random sequences of `length` token ids."""
    return [token_request([rng.integers(0, vocab_size, size=length) for _ in range(batch)])
            for _ in range(num_requests)]
