"""ModelFolder: every file of a model folder read once, each setting from the right file,
errors naming the file; sharded checkpoints load to the same weights as a single file."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine_lib.contract import PackedBatch
from engine_lib.model_folder import ModelFolder
from engine_lib.runner.model_runner import ModelRunner


def write(folder, name, data):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


@pytest.fixture
def bare(tmp_path):
    write(tmp_path, "config.json", {"model_type": "qwen3", "max_position_embeddings": 4096, "eos_token_id": [7, 8]})
    return tmp_path


def test_defaults_of_the_default_model(model_dir):
    folder = ModelFolder.open("default")
    assert folder.path == model_dir
    assert folder.model_type == "bert" and folder.pooling == "mean"
    assert folder.max_length == 256  # sentence_bert_config.json, not the 512 positions of config.json
    assert folder.weight_files == [os.path.join(model_dir, "model.safetensors")]


def test_family_defaults_when_the_folder_says_nothing(bare):
    folder = ModelFolder.open(str(bare))
    assert folder.pooling == "lasttoken"            # Qwen3 family default
    assert folder.max_length == 4096                # config.json's positions
    assert folder.eos_token_id == 7 and folder.eos_token is None


def test_sentence_transformers_files_win(bare):
    write(bare, "modules.json", [{"type": "sentence_transformers.models.Pooling", "path": "pool"}])
    write(bare, "pool/config.json", {"pooling_mode_cls_token": True})
    write(bare, "sentence_bert_config.json", {"max_seq_length": 128})
    write(bare, "tokenizer_config.json", {"model_max_length": 2048, "eos_token": {"content": "</s>"}})
    write(bare, "config_sentence_transformers.json", {"prompts": {"query": "q: "}})
    folder = ModelFolder.open(str(bare))
    assert (folder.pooling, folder.max_length, folder.eos_token, folder.st_prompts) == ("cls", 128, "</s>", {"query": "q: "})


def test_tokenizer_limit_applies_without_sentence_transformers_config(bare):
    write(bare, "tokenizer_config.json", {"model_max_length": 512})
    assert ModelFolder.open(str(bare)).max_length == 512


@pytest.mark.parametrize("files, message", [
    ({}, "no model.safetensors"),
    ({"model.safetensors.index.json": {"weight_map": {}}}, "no weight_map"),
    ({"model.safetensors.index.json": {"weight_map": {"a": "model-00001.safetensors"}}}, "model-00001.safetensors is missing"),
])
def test_weight_file_errors_name_the_file(bare, files, message):
    for name, data in files.items():
        write(bare, name, data)
    with pytest.raises((OSError, ValueError), match=message):
        ModelFolder.open(str(bare)).weight_files


def test_unknown_pooling_is_refused_naming_the_file(bare):
    write(bare, "1_Pooling/config.json", {"pooling_mode_max_tokens": True})
    with pytest.raises(ValueError, match="1_Pooling/config.json: no supported pooling mode"):
        ModelFolder.open(str(bare)).pooling


def test_sharded_checkpoint_loads_the_same_model(model_dir, tmp_path):
    checkpoint = load_file(os.path.join(model_dir, "model.safetensors"))
    keys = sorted(checkpoint)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name in os.listdir(model_dir):
        if name != "model.safetensors":
            (tmp_path / name).symlink_to(os.path.join(model_dir, name))
    for name, shard_keys in shards.items():
        save_file({k: checkpoint[k].contiguous() for k in shard_keys}, str(tmp_path / name))
    write(tmp_path, "model.safetensors.index.json",
          {"weight_map": {k: name for name, shard_keys in shards.items() for k in shard_keys}})
    assert len(ModelFolder.open(str(tmp_path)).weight_files) == 2
    batch = PackedBatch.from_sequences([torch.arange(101, 140).numpy(), torch.arange(200, 210).numpy()])
    single = ModelRunner(model_dir, device="cpu").step(batch).wait()
    sharded = ModelRunner(str(tmp_path), device="cpu").step(batch).wait()
    torch.testing.assert_close(torch.from_numpy(sharded), torch.from_numpy(single))
