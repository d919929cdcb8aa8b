"""cpu_linear: Linears packed for oneDNN give the plain path's rows, for every family and head;
a missing or wrong private op falls back to F.linear with one log line (models/cpu_linear.py)."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from engine_lib.config import EncoderConfig
from engine_lib.contract import PackedBatch
from engine_lib.models import cpu_linear
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.runner.self_check import MIN_COSINE
from engine_lib.runner.step_threads import flops_per_token
from testing.tiny_models import cosine_rows, qwen3_config, random_sequences, save_random_model
from testing.tiny_rerankers import save_reranker


def _ops_missing() -> str | None:
    """Why this torch cannot run the ops at all (not whether our layers get them right: that must fail)."""
    try:
        ops = cpu_linear.onednn_ops()
        ops.linear(torch.ones(1, 4), ops.reorder(torch.ones(2, 4), None), None, "none", [], "")
    except (AttributeError, RuntimeError) as exc:
        return str(exc)
    return None


MISSING = _ops_missing()
needs_onednn = pytest.mark.skipif(MISSING is not None, reason=f"no packed oneDNN linear here: {MISSING}")
LENGTHS = [1, 9, 64, 2, 37, 128]


def bert_folder(folder, hidden_act="gelu"):
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=128, hidden_act=hidden_act)
    save_random_model(BertModel, config, folder, seed=31)
    return str(folder)


def qwen3_folder(folder):
    from transformers import Qwen3Model

    save_random_model(Qwen3Model, qwen3_config(), folder, seed=32)
    return str(folder)


def reranker_folder(folder, kind):
    save_reranker(kind, folder)
    return str(folder)


def both_paths(folder, batch, **options):
    rows = {}
    for mode in ("plain", "onednn"):
        engine = ModelRunner(folder, device="cpu", cpu_linear=mode, **options)
        assert engine.cpu_linear == mode
        rows[mode] = engine.step(batch).wait()
    return rows["plain"], rows["onednn"]


def assert_same_rows(plain, packed):
    assert plain.shape == packed.shape
    if plain.shape[1] > 1:
        assert cosine_rows(packed, plain).min() >= MIN_COSINE
    np.testing.assert_allclose(packed, plain, atol=1e-5, rtol=1e-4)


@needs_onednn
@pytest.mark.parametrize("family, hidden_act", [("bert", "gelu"), ("bert", "gelu_new"), ("bert", "relu"),
                                                ("qwen3", "silu")])
def test_embeddings_same_rows_on_both_paths(tmp_path, family, hidden_act):
    folder = bert_folder(tmp_path, hidden_act) if family == "bert" else qwen3_folder(tmp_path)
    batch = PackedBatch.from_sequences(random_sequences(LENGTHS, 128, seed=33))
    assert_same_rows(*both_paths(folder, batch))


@needs_onednn
@pytest.mark.parametrize("kind", ["bert", "xlm-roberta", "qwen3"])
def test_reranker_heads_same_scores_on_both_paths(tmp_path, kind):
    """The BERT/RoBERTa classification head (tanh after the GEMM) and the Qwen3 yes/no judge."""
    folder = reranker_folder(tmp_path, kind)
    sequences = random_sequences([12, 30, 5], 100, seed=34)
    types = [np.r_[np.zeros(n // 2), np.ones(n - n // 2)].astype(np.int64) for n in map(len, sequences)]
    batch = PackedBatch.from_sequences(sequences, types if kind == "bert" else None)
    plain, packed = both_paths(folder, batch, task="score")
    assert plain.shape == (3, 1) and np.ptp(plain) > 1e-3  # distinct logits, not a constant
    assert_same_rows(plain, packed)


@needs_onednn
def test_packing_swaps_every_linear_and_keeps_the_thread_policy_input(tmp_path):
    folder = qwen3_folder(tmp_path)
    plain = ModelRunner(folder, device="cpu", cpu_linear="plain")
    packed = ModelRunner(folder, device="cpu", cpu_linear="onednn")
    assert packed.cpu_linear == "onednn" and packed.packed_layers > 0
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.model.modules())
    assert flops_per_token(packed.model) == flops_per_token(plain.model) > 0


@needs_onednn
def test_auto_packs_only_layers_large_enough_to_gain(tmp_path, monkeypatch):
    """The test model's layers are all below AUTO_MIN_WEIGHT_ELEMENTS: auto packs none of them;
    with the bound lowered to its largest layer, exactly the layers that large."""
    folder = qwen3_folder(tmp_path)
    assert ModelRunner(folder, device="cpu", cpu_linear="auto").packed_layers == 0
    sizes = [m.weight.numel() for m in ModelRunner(folder, device="cpu", cpu_linear="plain").model.modules()
             if isinstance(m, torch.nn.Linear)]
    from engine_lib.runner import model_runner

    monkeypatch.setattr(model_runner, "AUTO_MIN_WEIGHT_ELEMENTS", max(sizes))
    assert ModelRunner(folder, device="cpu", cpu_linear="auto").packed_layers == sizes.count(max(sizes))


@needs_onednn
@pytest.mark.parametrize("family", ["bert", "qwen3"])
def test_auto_runs_big_steps_on_the_kept_plain_layers(tmp_path, monkeypatch, family):
    """auto packs and keeps each plain layer: steps of up to AUTO_PACKED_MAX_ROWS tokens run packed,
    bigger ones plain; both give the plain path's rows, and the thread policy counts each weight once."""
    from engine_lib.runner import model_runner

    folder = bert_folder(tmp_path) if family == "bert" else qwen3_folder(tmp_path)
    monkeypatch.setattr(model_runner, "AUTO_MIN_WEIGHT_ELEMENTS", 0)
    monkeypatch.setattr(model_runner, "AUTO_PACKED_MAX_ROWS", 64)
    auto = ModelRunner(folder, device="cpu", cpu_linear="auto")
    plain = ModelRunner(folder, device="cpu", cpu_linear="plain")
    packed = [m for m in auto.model.modules() if isinstance(m, cpu_linear.PACKED_TYPES)]
    assert packed and len(packed) == auto.packed_layers and all(m.plain is not None for m in packed)
    plain_calls = []
    for m in packed:
        m.plain.register_forward_hook(lambda module, args, out: plain_calls.append(args[0].shape[0]))
    assert flops_per_token(auto.model) == flops_per_token(plain.model)
    for lengths, runs_plain in (([30, 34], False), ([40, 25], True)):
        batch = PackedBatch.from_sequences(random_sequences(lengths, 128, seed=36))
        plain_calls.clear()
        assert_same_rows(plain.step(batch).wait(), auto.step(batch).wait())
        assert plain_calls == ([65] * len(packed) if runs_plain else []), lengths


@needs_onednn
def test_thread_count_changes_between_steps(tmp_path):
    """StepThreads sets the intra-op threads per step; the packed primitives follow."""
    engine = ModelRunner(bert_folder(tmp_path), device="cpu", cpu_linear="onednn")
    batch = PackedBatch.from_sequences(random_sequences(LENGTHS, 128, seed=35))
    before = torch.get_num_threads()
    try:
        rows = []
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            rows.append(engine.step(batch).wait())
    finally:
        torch.set_num_threads(before)
    np.testing.assert_allclose(rows[1], rows[0], atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(rows[2], rows[0], atol=1e-6, rtol=1e-6)


def _missing_op():
    raise AttributeError("'_OpNamespace' 'mkldnn' object has no attribute '_linear_pointwise'")


def test_missing_op_falls_back_with_one_log_line(tmp_path, monkeypatch, caplog):
    folder = bert_folder(tmp_path)
    batch = PackedBatch.from_sequences(random_sequences(LENGTHS, 128, seed=36))
    plain = ModelRunner(folder, device="cpu", cpu_linear="plain").step(batch).wait()
    monkeypatch.setattr(cpu_linear, "onednn_ops", _missing_op)
    with caplog.at_level(logging.INFO):
        engine = ModelRunner(folder, device="cpu", cpu_linear="auto")
    assert engine.cpu_linear == "plain"
    assert any(isinstance(m, torch.nn.Linear) for m in engine.model.modules())
    lines = [r for r in caplog.records if r.name == cpu_linear.__name__]
    assert len(lines) == 1 and "_linear_pointwise" in lines[0].getMessage()
    np.testing.assert_array_equal(engine.step(batch).wait(), plain)
    with pytest.raises(ValueError, match="cpu_linear=onednn.*_linear_pointwise"):
        ModelRunner(folder, device="cpu", cpu_linear="onednn")


@needs_onednn
def test_probe_rejects_an_op_that_gives_other_rows(monkeypatch):
    real = cpu_linear.onednn_ops

    def wrong():
        ops = real()
        ops.linear = lambda *args: real().linear(*args) * 1.01
        return ops

    monkeypatch.setattr(cpu_linear, "onednn_ops", wrong)
    assert "other rows" in cpu_linear.probe(torch.float32)
    assert cpu_linear.use_onednn("auto", torch.device("cpu"), torch.float32) is False


def test_plain_and_gpu_never_probe(monkeypatch):
    monkeypatch.setattr(cpu_linear, "probe", lambda dtype: pytest.fail("probed"))
    assert cpu_linear.use_onednn("plain", torch.device("cpu"), torch.float32) is False
    assert cpu_linear.use_onednn("auto", torch.device("cuda"), torch.bfloat16) is False
    with pytest.raises(ValueError, match="device is cuda"):
        cpu_linear.use_onednn("onednn", torch.device("cuda"), torch.bfloat16)


def test_probe_leaves_the_global_random_state_alone():
    state = torch.random.get_rng_state()
    cpu_linear.probe(torch.float32)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_config_field():
    assert EncoderConfig().cpu_linear == "auto"
    assert EncoderConfig.from_parameters({"cpu_linear": "plain"}).cpu_linear == "plain"
    with pytest.raises(ValueError, match="cpu_linear must be auto, onednn or plain"):
        EncoderConfig.from_parameters({"cpu_linear": "mkl"})
