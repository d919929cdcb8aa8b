"""BERT and XLM-RoBERTa over packed ragged batches == transformers (same safetensors); CLS pooling."""
from __future__ import annotations

import numpy as np
import pytest

from engine_lib.contract import PackedBatch
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.runner.self_check import MIN_COSINE
from testing.tiny_models import (
    cosine_rows,
    hf_hidden_states,
    random_sequences,
    save_random_model,
    write_pooling,
    xlm_roberta_config,
)

LENGTHS = [1, 9, 64, 2, 37]


def bert_config():
    from transformers import BertConfig

    return BertConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, max_position_embeddings=128)


def build(kind: str, folder):
    from transformers import BertModel, XLMRobertaModel

    if kind == "xlm-roberta":
        return save_random_model(XLMRobertaModel, xlm_roberta_config(), folder, seed=11)
    return save_random_model(BertModel, bert_config(), folder, seed=12)


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta"])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_pooled_matches_reference(tmp_path, kind, pooling):
    reference = build(kind, tmp_path)
    if pooling == "cls":
        write_pooling(tmp_path, "cls")
    sequences = random_sequences(LENGTHS, 128, seed=13)
    engine = ModelRunner(str(tmp_path), device="cpu")
    assert engine.pooling == pooling
    pooled = engine.step(PackedBatch.from_sequences(sequences)).wait()
    hidden = hf_hidden_states(reference, sequences)
    expected = np.stack([h[0] if pooling == "cls" else h.mean(0) for h in hidden])
    assert cosine_rows(pooled, expected).min() >= MIN_COSINE
    np.testing.assert_allclose(pooled, expected, atol=2e-4, rtol=1e-3)


def test_xlm_roberta_position_offset_matters(tmp_path):
    """Positions start at padding_idx + 1 = 2; a BERT-style offset of 0 would not match."""
    from engine_lib.models.bert import XLMRobertaModel

    reference = build("xlm-roberta", tmp_path)
    sequences = random_sequences([20, 50], 128, seed=14)
    engine = ModelRunner(str(tmp_path), device="cpu")
    assert engine.max_positions == 128  # 130 position embeddings minus the offset
    expected = np.stack([h.mean(0) for h in hf_hidden_states(reference, sequences)])
    batch = PackedBatch.from_sequences(sequences)
    assert cosine_rows(engine.step(batch).wait(), expected).min() >= MIN_COSINE
    engine.model.embeddings.position_offset = 0
    assert XLMRobertaModel.position_offset == 2
    assert cosine_rows(engine.step(batch).wait(), expected).min() < MIN_COSINE
