"""A broken model folder fails start-up with a message naming the file:
unit level (both models' set-up) and one real server start."""
from __future__ import annotations

import json
import os
import re

import pytest

from engine_lib.config import EncoderConfig, TokenizerConfig
from engine_lib.service.build import build_endpoint
from engine_lib.tokenization.text import TextTokenizer
from rose_triton.server import REPO, TritonServer

pytestmark = pytest.mark.own_server  # its own servers: scripts/test.sh runs it beside the shared-server tests


def copy_model(model_dir, dest):
    """Symlink every entry of the model folder into `dest` (cheap; entries replaced per test)."""
    dest.mkdir()
    for name in os.listdir(model_dir):
        (dest / name).symlink_to(os.path.join(model_dir, name))
    return dest


def replace(folder, name, content: bytes | None):
    (folder / name).unlink()
    if content is not None:
        (folder / name).write_bytes(content)


def set_vocab_size(folder, model_dir, vocab_size):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    replace(folder, "config.json", json.dumps({**config, "vocab_size": vocab_size}).encode())


@pytest.mark.parametrize("name, content, message", [
    ("model.safetensors", None, "no model.safetensors"),
    ("model.safetensors", b"\x00" * 64, "cannot read weights"),
    ("config.json", b"{not json", "not valid JSON"),
    ("config.json", None, "no config.json"),
])
def test_encoder_start_names_the_broken_file(model_dir, tmp_path, name, content, message):
    folder = copy_model(model_dir, tmp_path / "model")
    replace(folder, name, content)
    with pytest.raises((OSError, ValueError), match=re.escape(str(folder / name)) + ".*" + message):
        build_endpoint(EncoderConfig(model_dir=str(folder), device="cpu"))


def test_encoder_refuses_weights_of_another_shape(model_dir, tmp_path):
    folder = copy_model(model_dir, tmp_path / "model")
    set_vocab_size(folder, model_dir, 1000)
    with pytest.raises(ValueError, match=re.escape(str(folder / "model.safetensors")) + ".*shape"):
        build_endpoint(EncoderConfig(model_dir=str(folder), device="cpu"))


def test_tokenizer_missing_names_the_file(model_dir, tmp_path):
    folder = copy_model(model_dir, tmp_path / "model")
    replace(folder, "tokenizer.json", None)
    with pytest.raises(FileNotFoundError, match=re.escape(str(folder / "tokenizer.json"))):
        TextTokenizer(str(folder), TokenizerConfig())


def test_tokenizer_of_another_model_is_refused(model_dir, tmp_path):
    folder = copy_model(model_dir, tmp_path / "model")
    set_vocab_size(folder, model_dir, 1000)
    with pytest.raises(ValueError, match=re.escape(str(folder / "tokenizer.json")) + ".*does not belong"):
        TextTokenizer(str(folder), TokenizerConfig())


def test_server_with_corrupt_weights_fails_naming_the_file(model_dir, tmp_path):
    folder = copy_model(model_dir, tmp_path / "model")
    replace(folder, "model.safetensors", b"\x00" * 64)
    repository = tmp_path / "repository"  # the encoder alone: a faster failing start
    repository.mkdir()
    (repository / "rose_encoder").symlink_to(REPO / "model_repository" / "rose_encoder")
    with pytest.raises(RuntimeError, match="tritonserver exited"):
        TritonServer(tmp_path / "server.log", env={"ROSE_MODEL_DIR": str(folder)}, ready_timeout=120,
                     serve_args=["--model-repository", str(repository)])
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert f"{folder / 'model.safetensors'}: cannot read weights" in log
    assert "failed to load 'rose_encoder'" in log
