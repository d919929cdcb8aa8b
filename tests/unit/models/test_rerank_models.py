"""Rerankers (BERT / XLM-R cross-encoders, Qwen3 yes/no) == transformers and CrossEncoder on the same weights.

Pairs of mixed lengths are tokenized by our PairTokenizer (ids checked
against the HF tokenizer's own pair encoding), packed into one batch and
scored; every score is within 1e-3 of the reference (probabilities) or 1e-3
relative (logits), and a pair scored in a batch equals it scored alone.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from engine_lib.config import PairTokenizerConfig
from engine_lib.contract import PackedBatch
from engine_lib.options import RerankOptions
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.service.outputs import ScoreOutput
from engine_lib.tokenization.pairs import QWEN3_PREFIX, QWEN3_SUFFIX, QWEN3_TASK, PairTokenizer, judge_text
from testing.tiny_rerankers import save_reranker

QUERY = "what is the capital of france"
DOCS = ["paris", "paris is the capital and largest city of france " * 3, "berlin is the capital of germany",
        "the quick brown fox jumps over the lazy dog and the eiffel tower stands in paris", "yes"]
CROSS = ["bert", "xlm-roberta"]


@pytest.fixture(scope="module", params=CROSS + ["qwen3"])
def family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    reference = save_reranker(request.param, folder)
    return request.param, str(folder), reference


def _ours(folder, query=QUERY, docs=DOCS, options=RerankOptions()):
    tokenizer = PairTokenizer(folder, PairTokenizerConfig())
    tokens = tokenizer.encode(query, docs, options)
    ids, lens, types = tokens.input_ids, tokens.seq_lens, tokens.token_types
    bounds = np.concatenate([[0], np.cumsum(lens)])
    seqs = [ids[bounds[i]:bounds[i + 1]] for i in range(len(lens))]
    type_seqs = [types[bounds[i]:bounds[i + 1]] for i in range(len(lens))] if types is not None else None
    return seqs, type_seqs


@torch.inference_mode()
def _reference_cross(folder, reference, query=QUERY, docs=DOCS):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    logits, encodings = [], []
    for doc in docs:  # each pair alone: no padding involved
        enc = tok(query, doc, return_tensors="pt")
        encodings.append(enc)
        logits.append(float(reference(**enc).logits[0, 0]))
    return np.array(logits), encodings


@torch.inference_mode()
def _reference_qwen3(folder, reference, query=QUERY, docs=DOCS, instruction=QWEN3_TASK, max_length=8192):
    """The Qwen3-Reranker model card's transformers recipe (left padding, prefix + pair + suffix)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, padding_side="left")
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    prefix = tok.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix = tok.encode(QWEN3_SUFFIX, add_special_tokens=False)
    pairs = [judge_text(instruction, query, d) for d in docs]
    inputs = tok(pairs, padding=False, truncation="longest_first", return_attention_mask=False,
                 max_length=max_length - len(prefix) - len(suffix))
    inputs["input_ids"] = [prefix + ids + suffix for ids in inputs["input_ids"]]
    ids_list = [list(ids) for ids in inputs["input_ids"]]
    batch = tok.pad(inputs, padding=True, return_tensors="pt")
    last = reference(**batch).logits[:, -1, :]
    pair_logits = torch.stack([last[:, no], last[:, yes]], dim=1).float()
    probs = torch.nn.functional.log_softmax(pair_logits, dim=1)[:, 1].exp()
    return probs.numpy(), (pair_logits[:, 1] - pair_logits[:, 0]).numpy(), ids_list


def test_pair_tokens_match_reference_tokenizer(family):
    kind, folder, reference = family
    seqs, types = _ours(folder)
    if kind == "qwen3":
        expected = _reference_qwen3(folder, reference)[2]
        assert [s.tolist() for s in seqs] == expected
        assert types is None
        return
    _, encodings = _reference_cross(folder, reference)
    assert [s.tolist() for s in seqs] == [e["input_ids"][0].tolist() for e in encodings]
    if kind == "bert":
        assert [t.tolist() for t in types] == [e["token_type_ids"][0].tolist() for e in encodings]
        assert all(set(t.tolist()) == {0, 1} for t in types)
    else:
        assert types is None


def test_scores_match_reference_packed_and_alone(family):
    kind, folder, reference = family
    seqs, types = _ours(folder)
    engine = ModelRunner(folder, device="cpu", task="score")
    logits = engine.step(PackedBatch.from_sequences(seqs, types)).wait()[:, 0]
    alone = np.array([engine.step(PackedBatch.from_sequences([s], None if types is None else [types[i]])).wait()[0, 0]
                      for i, s in enumerate(seqs)])
    np.testing.assert_allclose(logits, alone, rtol=1e-5, atol=1e-6)
    output = ScoreOutput(engine.score_activation)
    probs = output.finish(logits[:, None], RerankOptions())
    if kind == "qwen3":
        ref_probs, ref_logits, _ = _reference_qwen3(folder, reference)
    else:
        ref_logits, _ = _reference_cross(folder, reference)
        ref_probs = 1 / (1 + np.exp(-ref_logits))
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(output.finish(logits[:, None], RerankOptions(raw_scores=True)), ref_logits, rtol=1e-3)
    assert np.abs(probs - ref_probs).max() < 1e-3
    assert np.ptp(probs) > 1e-3  # random weights still tell documents apart: a constant score would pass nothing


def test_cross_encoder_predict_agrees(family):
    """sentence-transformers' CrossEncoder.predict (sigmoid for one logit) on the same folder."""
    kind, folder, _ = family
    if kind not in CROSS:
        pytest.skip("CrossEncoder does not load a causal-LM judge")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import CrossEncoder

    seqs, types = _ours(folder)
    engine = ModelRunner(folder, device="cpu", task="score")
    logits = engine.step(PackedBatch.from_sequences(seqs, types)).wait()
    ours = ScoreOutput(engine.score_activation).finish(logits, RerankOptions())
    expected = CrossEncoder(folder, device="cpu").predict([(QUERY, d) for d in DOCS], batch_size=3)
    assert np.abs(ours - expected).max() < 1e-3


def test_token_types_matter_for_bert(tmp_path):
    """Segment ids reach the model: scoring a BERT pair with all-zero types gives another logit."""
    save_reranker("bert", tmp_path)
    seqs, types = _ours(str(tmp_path))
    engine = ModelRunner(str(tmp_path), device="cpu", task="score")
    with_types = engine.step(PackedBatch.from_sequences(seqs, types)).wait()
    without = engine.step(PackedBatch.from_sequences(seqs)).wait()
    assert np.abs(with_types - without).max() > 1e-3


def test_qwen3_instruction_and_truncation(tmp_path):
    reference = save_reranker("qwen3", tmp_path)
    folder = str(tmp_path)
    instruction = "Judge the document"
    seqs, _ = _ours(folder, options=RerankOptions(instruction=instruction))
    assert [s.tolist() for s in seqs] == _reference_qwen3(folder, reference, instruction=instruction)[2]
    # A short max_length: the card's recipe cuts the end of the pair (the document), as we do.
    tokenizer = PairTokenizer(folder, PairTokenizerConfig(max_length=80))
    tokens = tokenizer.encode(QUERY, DOCS, RerankOptions())
    ids, lens = tokens.input_ids, tokens.seq_lens
    assert lens.max() == 80
    expected = _reference_qwen3(folder, reference, max_length=80)[2]
    assert np.concatenate(expected).tolist() == ids.tolist()


def test_head_keeps_only_two_lm_rows(tmp_path):
    reference = save_reranker("qwen3", tmp_path)
    engine = ModelRunner(str(tmp_path), device="cpu", task="score")
    assert tuple(engine.head.weight.shape) == (2, reference.config.hidden_size)


@pytest.mark.parametrize("kind", ["bert", "qwen3"])
def test_graph_replays_carry_token_types_and_scores(tmp_path, kind):
    """Captured graphs (CPU stand-in capture) score like eager steps, segment ids included."""
    from testing.fake_engine import FakeCapture

    save_reranker(kind, tmp_path)
    eager = ModelRunner(str(tmp_path), device="cpu", attention_backend="masked", cuda_graphs="off", task="score")
    graphed = ModelRunner(str(tmp_path), device="cpu", attention_backend="masked", cuda_graphs="on", task="score",
                     max_graph_tokens=512, max_graph_seqs=8, graph_capture=FakeCapture())
    batches = []
    for docs in (DOCS, DOCS[1:], DOCS[::-1]):
        seqs, types = _ours(str(tmp_path), docs=docs)
        batches.append(PackedBatch.from_sequences(seqs, types))
    for batch in batches * 3:  # eager, capture, replay per bucket
        np.testing.assert_allclose(graphed.step(batch).wait(), eager.step(batch).wait(), rtol=1e-4, atol=1e-5)
    assert graphed.stats.replays > 0


def test_qwen3_tied_embeddings_give_the_yes_no_rows(tmp_path):
    """With tie_word_embeddings the checkpoint has no lm_head: the rows come from the input embeddings."""
    from safetensors import safe_open

    from testing.tiny_rerankers import reference_scores, save_qwen3_reranker

    save_qwen3_reranker(tmp_path, tie_word_embeddings=True)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert "lm_head.weight" not in f.keys()
    seqs, _ = _ours(str(tmp_path))
    engine = ModelRunner(str(tmp_path), device="cpu", task="score")
    logits = engine.step(PackedBatch.from_sequences(seqs)).wait()[:, 0]
    np.testing.assert_allclose(logits, reference_scores("qwen3", tmp_path, QUERY, DOCS)[1], rtol=1e-3, atol=1e-6)
