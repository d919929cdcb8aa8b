"""cpu_compile: the inductor-compiled CPU forward gives the plain forward's rows, on token counts it
was not compiled at too, and a compiler failure falls back (auto) or fails the load naming why (on)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from engine_lib.config import EncoderConfig
from engine_lib.contract import PackedBatch
from engine_lib.runner import cpu_compile
from engine_lib.runner.model_runner import ModelRunner
from testing.tiny_models import cosine_rows, random_sequences, save_random_model

VOCAB = 128
# The load compiles on the probe batch (283 and 83 tokens); these token counts are new to it.
BATCHES = ([37], [17, 1, 64, 3, 100, 9, 64, 2], [128] * 3, [5, 5], [2], [1])  # [1]: guards fail, runs eagerly
needs_compiler = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                    reason="inductor's CPU backend needs a C++ compiler")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("bert")
    config = BertConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=128)
    save_random_model(BertModel, config, folder, seed=41)
    return folder


@needs_compiler
def test_compiled_rows_equal_plain_rows(bert_dir, tmp_path):
    plain = ModelRunner(bert_dir, device="cpu", cpu_linear="plain", cpu_compile="off")
    compiled = ModelRunner(bert_dir, device="cpu", cpu_linear="plain", cpu_compile="on",
                           compile_cache_dir=str(tmp_path))
    assert (plain.cpu_compile, compiled.cpu_compile) == ("off", "on")
    assert (tmp_path / "inductor").is_dir()  # the kernels are cached where the engine was told
    for seed, lengths in enumerate(BATCHES):
        batch = PackedBatch.from_sequences(random_sequences(lengths, VOCAB, seed=seed))
        want, got = plain.step(batch).wait(), compiled.step(batch).wait()
        assert got.shape == want.shape
        assert cosine_rows(got, want).min() >= 0.9999, lengths
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def failing_compile(*args, **kwargs):
    raise RuntimeError("no C++ compiler")


def test_auto_falls_back_and_on_insists(bert_dir, monkeypatch):
    monkeypatch.setattr(cpu_compile, "compile_layers", failing_compile)
    batch = PackedBatch.from_sequences(random_sequences([9, 30], VOCAB, seed=7))
    engine = ModelRunner(bert_dir, device="cpu", cpu_linear="plain", cpu_compile="auto")
    reference = ModelRunner(bert_dir, device="cpu", cpu_linear="plain", cpu_compile="off")
    assert engine.cpu_compile == "off"
    np.testing.assert_array_equal(engine.step(batch).wait(), reference.step(batch).wait())
    with pytest.raises(RuntimeError, match="cpu_compile=on: compiling the CPU forward failed.*no C\\+\\+ compiler"):
        ModelRunner(bert_dir, device="cpu", cpu_linear="plain", cpu_compile="on")


def test_packed_layers_are_refused_before_compiling(bert_dir):
    with pytest.raises(RuntimeError, match="packed oneDNN"):
        ModelRunner(bert_dir, device="cpu", cpu_linear="onednn", cpu_compile="on")


def test_mode_is_checked():
    with pytest.raises(ValueError, match="cpu_compile must be"):
        EncoderConfig(cpu_compile="yes")
    with pytest.raises(ValueError, match="cpu_compile must be"):
        cpu_compile.wanted("yes", __import__("torch").device("cpu"))
