"""Batched == alone at the engine: each sequence embedded (or scored) inside a mixed-length batch gives
the row it gets when it is the whole batch (ModelRunner.step on tiny random-weight models)."""
from __future__ import annotations

import numpy as np
import pytest

from engine_lib.contract import PackedBatch
from engine_lib.runner.model_runner import ModelRunner
from testing.tiny_models import cosine_rows, qwen3_config, random_sequences, save_random_model, write_pooling
from testing.tiny_rerankers import save_bert_cross_encoder, save_qwen3_reranker

LENGTHS = [17, 1, 64, 3, 100, 9, 64, 2]  # a 1-token sequence after another; equal lengths (sdpa groups them)
VOCAB = 128


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from transformers import BertConfig, BertModel, Qwen3Model

    made = {name: tmp_path_factory.mktemp(name) for name in ("bert", "bert-cls", "qwen3", "bert-score", "qwen3-score")}
    bert = BertConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, max_position_embeddings=128, type_vocab_size=2)
    save_random_model(BertModel, bert, made["bert"], seed=31)
    save_random_model(BertModel, bert, made["bert-cls"], seed=32)
    write_pooling(made["bert-cls"], "cls")
    save_random_model(Qwen3Model, qwen3_config(), made["qwen3"], seed=33)
    save_bert_cross_encoder(made["bert-score"], seed=34)
    save_qwen3_reranker(made["qwen3-score"], seed=35)
    return made


def with_types(family: str, sequences, seed: int):
    """Segment ids for BERT models (a second segment from a random cut), None for Qwen3."""
    if not family.startswith("bert"):
        return None
    rng = np.random.default_rng(seed)
    return [(np.arange(len(s)) >= rng.integers(1, len(s) + 1)).astype(np.int64) for s in sequences]


def batched_and_alone(engine: ModelRunner, family: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    sequences = random_sequences(LENGTHS, VOCAB, seed=seed)
    types = with_types(family, sequences, seed)
    batched = engine.step(PackedBatch.from_sequences(sequences, types)).wait()
    alone = np.concatenate([engine.step(PackedBatch.from_sequences([s], None if types is None else [types[i]])).wait()
                            for i, s in enumerate(sequences)])
    return batched, alone


@pytest.mark.parametrize("backend", ["sdpa", "masked"])
@pytest.mark.parametrize("family, task", [("bert", "embed"), ("bert-cls", "embed"), ("qwen3", "embed"),
                                          ("bert-score", "score"), ("qwen3-score", "score")])
def test_each_sequence_in_a_batch_equals_it_alone(folders, family, task, backend):
    engine = ModelRunner(str(folders[family]), device="cpu", attention_backend=backend, task=task)
    batched, alone = batched_and_alone(engine, family, seed=36)
    assert batched.shape == alone.shape == (len(LENGTHS), engine.output_dim)
    assert len({round(float(x), 4) for x in alone[:, 0]}) == len(LENGTHS)  # distinct rows: the inputs matter
    np.testing.assert_allclose(batched, alone, atol=1e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("family, task", [("bert", "embed"), ("qwen3", "embed"), ("qwen3-score", "score")])
def test_gpu_each_sequence_in_a_batch_equals_it_alone(folders, family, task):
    """bf16 on CUDA through the served path (graphs on, pinned staging): the same rows up to bf16 noise."""
    engine = ModelRunner(str(folders[family]), device="cuda", task=task)
    for _ in range(3):  # eager, capture, replay of the batch's bucket
        batched, alone = batched_and_alone(engine, family, seed=37)
        if task == "embed":
            assert cosine_rows(batched, alone).min() >= 0.999
        else:
            np.testing.assert_allclose(batched, alone, atol=0.05, rtol=0.05)
