"""Load-time self-check (served dtype vs fp32 on the built-in probes) and the CUDA/driver fit check."""
from __future__ import annotations

import logging
import re

import pytest
import torch

from engine_lib.device.cuda_env import cuda_mismatch
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.runner.self_check import MIN_COSINE, SelfCheckError
from testing import REPO
from testing.tiny_models import qwen3_config, save_random_model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from transformers import BertConfig, BertModel, Qwen3Model

    qwen3 = tmp_path_factory.mktemp("qwen3")
    save_random_model(Qwen3Model, qwen3_config(), qwen3, seed=31)
    bert = tmp_path_factory.mktemp("bert")
    config = BertConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, max_position_embeddings=256)
    model = save_random_model(BertModel, config, bert, seed=32)
    # The same weights with word embeddings past float16's range (65504): an fp16 path overflows to inf.
    overflow = tmp_path_factory.mktemp("bert_overflow")
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.mul_(1e6)
    model.save_pretrained(overflow)
    return {"qwen3": qwen3, "bert": bert, "bert-overflow": overflow}


def test_bfloat16_passes_and_reports_the_figure(folders, caplog):
    with caplog.at_level(logging.INFO, logger="engine_lib.runner.self_check"):
        engine = ModelRunner(str(folders["qwen3"]), device="cpu", dtype="bfloat16")
    assert MIN_COSINE <= engine.self_check_cosine < 1.0  # bf16 rounding is visible, and within the rule
    assert f"minimum cosine {engine.self_check_cosine:.6f}" in caplog.text


def test_float32_needs_no_second_model(folders):
    assert ModelRunner(str(folders["qwen3"]), device="cpu").self_check_cosine == 1.0


def test_overflowing_float16_path_refuses_to_load(folders):
    ModelRunner(str(folders["bert-overflow"]), device="cpu", dtype="float32")  # fine in fp32
    with pytest.raises(SelfCheckError, match=r"float16 on cpu vs float32 on the same device gives cosine -1\.0+ "
                                             rf"\(< {re.escape(str(MIN_COSINE))}\).*refusing to load"):
        ModelRunner(str(folders["bert-overflow"]), device="cpu", dtype="float16")
    ModelRunner(str(folders["bert"]), device="cpu", dtype="float16")  # same layers, sane weights: loads


def test_self_check_can_be_turned_off(folders):
    engine = ModelRunner(str(folders["bert-overflow"]), device="cpu", dtype="float16", self_check=False)
    assert engine.self_check_cosine == 1.0


@pytest.mark.parametrize("driver_cuda, driver, available, expected", [
    (None, None, False, None),                          # CPU node: no driver
    (13000, "580.159.03", True, None),                  # fits
    (12040, "550.54.14", False, "torch 2.13.0 is built for CUDA 13.0 and needs an NVIDIA driver >= 580.65.06 "
                                "(CUDA 13.x); this machine's driver 550.54.14 supports CUDA up to 12.4"),
    (13000, "580.159.03", False, "sees no usable GPU although an NVIDIA driver is installed"),
])
def test_cuda_driver_mismatch_names_both_versions(driver_cuda, driver, available, expected):
    reason = cuda_mismatch("2.13.0", "13.0", driver_cuda, driver, available)
    assert reason is None if expected is None else expected in reason
    assert cuda_mismatch("2.13.0+cpu", None, 12040, "550.54.14", False) is None  # CPU build: nothing to fit


def test_deploy_docs_and_image_state_the_driver_the_code_checks():

    from engine_lib.device.cuda_env import MIN_DRIVER

    repo = REPO
    wheel_cuda = 13  # PyPI's torch 2.13.0 Linux wheel depends on cuda-toolkit 13.0.x
    assert "torch==2.13.0" in (repo / "docker" / "requirements-image.txt").read_text()
    for path in (repo / "docs" / "deploy.md", repo / "docker" / "Dockerfile"):
        assert f">= {MIN_DRIVER[wheel_cuda]}" in path.read_text(), path


@pytest.mark.parametrize("kind", ["bert", "qwen3"])
def test_rerankers_in_bfloat16_pass_on_their_hidden_states(tmp_path, kind):
    from testing.tiny_rerankers import save_reranker

    save_reranker(kind, tmp_path)
    engine = ModelRunner(str(tmp_path), device="cpu", dtype="bfloat16", task="score")
    assert MIN_COSINE <= engine.self_check_cosine < 1.0
