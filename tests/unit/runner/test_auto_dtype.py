"""What `dtype=auto` serves on a CPU: bfloat16 with native bf16 (unless ROSE_CPU_BF16=off), else float32;
float32 when the self-check refuses the bfloat16 it chose."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from engine_lib.contract import PackedBatch
from engine_lib.device import cpu_features
from engine_lib.device.cpu_features import CPU_BF16_ENV, auto_cpu_bf16, bf16_pays, cpu_flags, native_bf16
from engine_lib.runner import model_runner
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.runner.self_check import MIN_COSINE, SelfCheckError
from testing.tiny_models import save_random_model


@pytest.mark.parametrize("flags, environ, expected", [
    ({"avx2", "avx512f", "avx512_bf16"}, {}, True),
    ({"avx2", "amx_tile", "amx_bf16"}, {CPU_BF16_ENV: "auto"}, True),
    ({"avx2", "avx512f"}, {}, False),  # bf16 would be emulated: slower than float32
    ({"avx512_bf16"}, {CPU_BF16_ENV: "off"}, False),
    ({"avx512_bf16"}, {CPU_BF16_ENV: " OFF "}, False),
    ({"avx512_bf16"}, {CPU_BF16_ENV: ""}, True),
])
def test_auto_follows_the_cpu_flags_and_the_switch(flags, environ, expected):
    assert auto_cpu_bf16(environ, flags) is expected


def test_a_misspelt_switch_is_refused_by_name():
    with pytest.raises(ValueError, match=r"ROSE_CPU_BF16='no': expected one of auto, off"):
        auto_cpu_bf16({CPU_BF16_ENV: "no"}, {"avx512_bf16"})


def test_cpu_flags_reads_the_first_processor(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 amx_bf16\n\n"
                    "processor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(str(info)) == {"fpu", "avx2", "amx_bf16"}
    assert native_bf16(cpu_flags(str(info)))
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=256, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=256)  # large enough: bf16_pays
    plain = tmp_path_factory.mktemp("bert")
    model = save_random_model(BertModel, config, plain, seed=41)
    # Every word embedding offset by 1000: float32 keeps the ~0.02 signal on top (spacing 6e-5 there),
    # bfloat16's spacing at 1000 is 4, so the signal rounds away and the rows are wrong.
    offset = tmp_path_factory.mktemp("bert_offset")
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.add_(1000.0)
    model.save_pretrained(offset)
    small = tmp_path_factory.mktemp("bert_small")
    save_random_model(BertModel, BertConfig(vocab_size=256, hidden_size=128, intermediate_size=512, num_hidden_layers=1,
                                            num_attention_heads=2, max_position_embeddings=256), small, seed=42)
    return {"plain": plain, "offset": offset, "small": small}


def test_auto_on_this_cpu_serves_what_its_flags_say(folders, monkeypatch):
    monkeypatch.setenv(CPU_BF16_ENV, "auto")
    engine = ModelRunner(str(folders["plain"]), device="cpu")
    if native_bf16():
        assert engine.dtype == torch.bfloat16
        assert MIN_COSINE <= engine.self_check_cosine < 1.0
    else:
        assert engine.dtype == torch.float32 and engine.self_check_cosine == 1.0


def test_auto_keeps_a_model_too_small_to_gain_in_float32(folders, monkeypatch):
    monkeypatch.setattr(model_runner, "auto_cpu_bf16", lambda: True)  # as on a CPU with native bf16
    assert bf16_pays({"hidden_size": 256, "intermediate_size": 1024})
    assert not bf16_pays({"hidden_size": 128, "intermediate_size": 512})
    assert not bf16_pays({"hidden_size": 128})  # intermediate_size absent: 4 x hidden
    assert ModelRunner(str(folders["small"]), device="cpu").dtype == torch.float32
    assert ModelRunner(str(folders["plain"]), device="cpu").dtype == torch.bfloat16
    assert ModelRunner(str(folders["small"]), device="cpu", dtype="bfloat16").dtype == torch.bfloat16  # asked for


def test_switched_off_auto_serves_float32(folders, monkeypatch):
    monkeypatch.setenv(CPU_BF16_ENV, "off")
    monkeypatch.setattr(cpu_features, "native_bf16", lambda flags=None: True)
    assert ModelRunner(str(folders["plain"]), device="cpu").dtype == torch.float32


def test_auto_falls_back_to_float32_when_the_self_check_refuses_bfloat16(folders, monkeypatch, caplog):
    monkeypatch.setattr(model_runner, "auto_cpu_bf16", lambda: True)  # as on a CPU with native bf16
    with pytest.raises(SelfCheckError, match="bfloat16 on cpu vs float32"):
        ModelRunner(str(folders["offset"]), device="cpu", dtype="bfloat16")  # asked for: refused
    with caplog.at_level(logging.WARNING, logger="engine_lib.runner.model_runner"):
        engine = ModelRunner(str(folders["offset"]), device="cpu")
    assert engine.dtype == torch.float32 and engine.self_check_cosine == 1.0
    assert "dtype=auto: self-check failed: bfloat16" in caplog.text and "serving float32 instead" in caplog.text
    reference = ModelRunner(str(folders["offset"]), device="cpu", dtype="float32")
    batch = PackedBatch.from_sequences([np.arange(100, 140), np.arange(5, 12)])
    np.testing.assert_array_equal(engine.step(batch).wait(), reference.step(batch).wait())
