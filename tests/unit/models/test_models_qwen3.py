"""Qwen3 over packed ragged batches == transformers' Qwen3Model (same safetensors), and its tokenization."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine_lib.config import TokenizerConfig
from engine_lib.contract import PackedBatch
from engine_lib.options import RequestOptions
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.runner.self_check import MIN_COSINE
from engine_lib.tokenization.text import TextTokenizer
from testing.tiny_models import (
    EOS,
    cosine_rows,
    hf_hidden_states,
    qwen3_config,
    random_sequences,
    save_random_model,
    write_word_tokenizer,
)

LENGTHS = [1, 7, 33, 64, 3, 100, 7]


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory):
    from transformers import Qwen3Model

    folder = tmp_path_factory.mktemp("qwen3")
    model = save_random_model(Qwen3Model, qwen3_config(), folder, seed=1)
    return folder, model


def engine_hidden(engine: ModelRunner, batch: PackedBatch) -> np.ndarray:
    """All tokens' final hidden states from our model, [num_tokens, hidden]."""
    with torch.inference_mode():
        ids, pos = torch.from_numpy(batch.input_ids), torch.from_numpy(batch.positions)
        plan = engine.backend.plan(batch.cu_seqlens, batch.max_seqlen, engine.device)
        return engine.model(ids, pos, plan).float().numpy()


@pytest.mark.parametrize("backend", ["sdpa", "masked"])
def test_every_token_matches_reference(qwen3_folder, backend):
    folder, reference = qwen3_folder
    sequences = random_sequences(LENGTHS, 128, seed=2)
    engine = ModelRunner(str(folder), device="cpu", attention_backend=backend)
    batch = PackedBatch.from_sequences(sequences)
    ours = np.split(engine_hidden(engine, batch), batch.cu_seqlens[1:-1])
    for mine, ref in zip(ours, hf_hidden_states(reference, sequences)):
        assert cosine_rows(mine, ref).min() >= MIN_COSINE
        np.testing.assert_allclose(mine, ref, atol=2e-4, rtol=1e-3)


def test_last_token_pooling_and_batch_invariance(qwen3_folder):
    folder, reference = qwen3_folder
    sequences = random_sequences(LENGTHS, 128, seed=3)
    engine = ModelRunner(str(folder), device="cpu")
    assert engine.pooling == "lasttoken"
    pooled = engine.step(PackedBatch.from_sequences(sequences)).wait()
    expected = np.stack([h[-1] for h in hf_hidden_states(reference, sequences)])
    assert cosine_rows(pooled, expected).min() >= MIN_COSINE
    alone = np.concatenate([engine.step(PackedBatch.from_sequences([s])).wait() for s in sequences])
    np.testing.assert_allclose(pooled, alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("overrides", [dict(num_key_value_heads=4, attention_bias=True),
                                       dict(num_key_value_heads=1, head_dim=32, num_attention_heads=2)])
def test_variants_match_reference(tmp_path, overrides):
    from transformers import Qwen3Model

    reference = save_random_model(Qwen3Model, qwen3_config(**overrides), tmp_path, seed=4)
    sequences = random_sequences([5, 40, 1], 128, seed=5)
    pooled = ModelRunner(str(tmp_path), device="cpu").step(PackedBatch.from_sequences(sequences)).wait()
    expected = np.stack([h[-1] for h in hf_hidden_states(reference, sequences)])
    assert cosine_rows(pooled, expected).min() >= MIN_COSINE


def test_causal_lm_checkpoint_loads(tmp_path):
    """A Qwen3ForCausalLM checkpoint (`model.` prefix, lm_head) serves as an embedder."""
    from transformers import Qwen3ForCausalLM

    reference = save_random_model(Qwen3ForCausalLM, qwen3_config(), tmp_path, seed=6).model
    sequences = random_sequences([9, 2], 128, seed=7)
    pooled = ModelRunner(str(tmp_path), device="cpu").step(PackedBatch.from_sequences(sequences)).wait()
    expected = np.stack([h[-1] for h in hf_hidden_states(reference, sequences)])
    assert cosine_rows(pooled, expected).min() >= MIN_COSINE


def test_bidirectional_option(tmp_path):
    from transformers import Qwen3Model

    reference = save_random_model(Qwen3Model, qwen3_config(), tmp_path, seed=8, extra_config={"is_causal": False})
    sequences = random_sequences([12, 30], 128, seed=9)
    engine = ModelRunner(str(tmp_path), device="cpu")
    assert engine.attention_shape.causal is False
    pooled = engine.step(PackedBatch.from_sequences(sequences)).wait()
    bidirectional = np.stack([h[-1] for h in hf_hidden_states(reference, sequences, is_causal=False)])
    causal = np.stack([h[-1] for h in hf_hidden_states(reference, sequences)])
    assert cosine_rows(pooled, bidirectional).min() >= MIN_COSINE
    assert cosine_rows(pooled, causal).max() < 0.99  # the option changes the result: the check can fail


@pytest.fixture()
def qwen3_tokenizer_folder(tmp_path):
    write_word_tokenizer(tmp_path, ["hello world", "a b c"], vocab_size=64)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 8}))
    return tmp_path


def test_tokenizer_appends_eos_and_keeps_it_when_truncating(qwen3_tokenizer_folder):
    tokenizer = TextTokenizer(str(qwen3_tokenizer_folder), TokenizerConfig(), max_length=4)
    eos = tokenizer._full.token_to_id(EOS)
    tokens = tokenizer.encode(["hello world", "a b c a b c"], RequestOptions())
    ids, lens = tokens.input_ids, tokens.seq_lens
    assert lens.tolist() == [3, 4]
    assert ids[2] == eos and ids[-1] == eos
    with pytest.raises(ValueError, match="more than the model's maximum"):
        tokenizer.encode(["a b c a"], RequestOptions(truncate=False))


def test_tokenizer_does_not_double_eos(qwen3_tokenizer_folder):
    from tokenizers import Tokenizer, processors

    path = str(qwen3_tokenizer_folder / "tokenizer.json")
    raw = Tokenizer.from_file(path)
    eos = raw.token_to_id(EOS)
    raw.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, eos)])
    raw.save(path)
    tokenizer = TextTokenizer(str(qwen3_tokenizer_folder), TokenizerConfig())
    tokens = tokenizer.encode(["hello world"], RequestOptions())
    ids, lens = tokens.input_ids, tokens.seq_lens
    assert tokenizer.append_eos_id is None and ids.tolist()[-1] == eos and lens.tolist() == [3]


def test_query_instruction_template(qwen3_tokenizer_folder):
    tokenizer = TextTokenizer(str(qwen3_tokenizer_folder), TokenizerConfig())
    assert tokenizer.template("hi", "query") == ("Instruct: Given a web search query, retrieve relevant passages "
                                                 "that answer the query\nQuery:hi")
    assert tokenizer.template("hi", "document") == "hi"
    (qwen3_tokenizer_folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "Instruct: Find code\nQuery:", "document": ""}}))
    assert TextTokenizer(str(qwen3_tokenizer_folder), TokenizerConfig()).template("x", "query") == "Instruct: Find code\nQuery:x"
    custom = TextTokenizer(str(qwen3_tokenizer_folder), TokenizerConfig(query_prefix="q: "))
    assert custom.template("x", "query") == "q: x"


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graphs", ["off", "on"])
def test_gpu_bf16_within_cosine_of_fp32_reference(tmp_path, cuda_graphs):
    from transformers import Qwen3Model

    config = qwen3_config(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=128, vocab_size=1024)
    reference = save_random_model(Qwen3Model, config, tmp_path, seed=41)
    sequences = random_sequences([1, 17, 128, 200, 64], 1024, seed=42)
    expected = np.stack([h[-1] for h in hf_hidden_states(reference, sequences)])  # fp32 on CPU
    engine = ModelRunner(str(tmp_path), device="cuda", dtype="bfloat16", cuda_graphs=cuda_graphs)
    batch = PackedBatch.from_sequences(sequences)
    for _ in range(3):  # eager, capture, replay when graphs are on
        assert cosine_rows(engine.step(batch).wait(), expected).min() >= MIN_COSINE


def test_chunking_windows_each_end_with_eos_and_carry_the_prefix(qwen3_tokenizer_folder):
    config = TokenizerConfig(query_prefix="hello ")
    tokenizer = TextTokenizer(str(qwen3_tokenizer_folder), config, max_length=5)
    eos, hello = tokenizer._full.token_to_id(EOS), tokenizer._full.token_to_id("hello")
    tokens = tokenizer.encode_windows(["a b c a b c a"], RequestOptions(input_type="query", chunking="mean"))
    ids, lens, windows = tokens.input_ids, tokens.seq_lens, tokens.windows
    parts = [p.tolist() for p in np.split(ids, np.cumsum(lens)[:-1])]
    assert windows.tolist() == [3] and all(len(p) <= 5 for p in parts)
    assert all(p[0] == hello and p[-1] == eos for p in parts)  # prefix and EOS in every window
    body = tokenizer._full.encode("a b c a b c a").ids
    assert sum((p[1:-1] for p in parts), []) == body
