"""Checkpoint loading: key mapping, refusals that name the file and the weight, sharded checkpoints,
fused q/k/v and gate/up filled from separate keys."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine_lib.contract import PackedBatch
from engine_lib.models.loader import CheckpointEmbedding, allocate, load_weights, map_checkpoint_key
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.runner.self_check import MIN_COSINE
from testing.tiny_models import cosine_rows, hf_hidden_states, qwen3_config, random_sequences, save_random_model


class Tiny(torch.nn.Module):
    checkpoint_prefixes = ("bert.",)
    checkpoint_renames = (("LayerNorm.gamma", "LayerNorm.weight"),)
    ignored_keys = ("pooler.",)

    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Linear(2, 3)
        self.LayerNorm = torch.nn.LayerNorm(3)


def test_keys_are_unprefixed_renamed_or_ignored():
    model = Tiny()
    assert map_checkpoint_key(model, "bert.dense.weight") == "dense.weight"
    assert map_checkpoint_key(model, "LayerNorm.gamma") == "LayerNorm.weight"
    assert map_checkpoint_key(model, "bert.pooler.dense.bias") is None


def test_allocate_gives_meta_modules_storage_keeping_shared_tensors_shared():
    with torch.device("meta"):
        model = torch.nn.Sequential(Tiny(), CheckpointEmbedding(5, 3))
        model[1].register_buffer("table", torch.zeros(4, dtype=torch.float64))
        model[0].tied = model[1]
        model[0].tied_weight = model[1].weight
    allocate(model)
    tensors = [*model.parameters(), *model.buffers()]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    assert model[0].tied_weight is model[1].weight and isinstance(model[1].weight, torch.nn.Parameter)
    assert model[1].table.dtype == torch.float64 and model[0].dense.weight.shape == (3, 2)


def test_building_the_default_model_imports_neither_dynamo_nor_sympy():
    """Start-up cost guard: nn.Embedding's init and Module.to_empty on the meta device go through
    torch._refs, which import torch._dynamo and sympy (3.3 s of CPU per encoder start)."""
    script = ("import sys\n"
              "from engine_lib.config import EncoderConfig\n"
              "from engine_lib.service.build import build_endpoint\n"
              "from engine_lib.tokenization.calibration import calibration_sequences\n"
              "build_endpoint(EncoderConfig(), calibration_sequences).close()\n"
              "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "[]"


def checkpoint(tmp_path, tensors, name="model.safetensors"):
    path = tmp_path / name
    save_file(tensors, str(path))
    return str(path)


def full_weights():
    return {"bert.dense.weight": torch.ones(3, 2), "bert.dense.bias": torch.zeros(3),
            "LayerNorm.gamma": torch.full((3,), 2.0), "LayerNorm.bias": torch.zeros(3),
            "bert.pooler.dense.weight": torch.ones(1)}


def test_loads_every_parameter(tmp_path):
    model = Tiny()
    load_weights(model, [checkpoint(tmp_path, full_weights())])
    assert torch.equal(model.dense.weight, torch.ones(3, 2)) and torch.equal(model.LayerNorm.weight, torch.full((3,), 2.0))


@pytest.mark.parametrize("change, message", [
    (lambda w: w.pop("bert.dense.bias"), r"missing weights for \['dense.bias'\]"),
    (lambda w: w.update({"bert.extra.weight": torch.ones(1)}), "unexpected weight 'bert.extra.weight'"),
    (lambda w: w.update({"bert.dense.weight": torch.ones(2, 2)}), r"has shape \(2, 2\), model expects \(3, 2\)"),
])
def test_refusals_name_file_and_weight(tmp_path, change, message):
    weights = full_weights()
    change(weights)
    path = checkpoint(tmp_path, weights)
    with pytest.raises(ValueError, match=f"{path}: .*{message}"):
        load_weights(Tiny(), [path])


@pytest.fixture(scope="module")
def sharded_qwen3(tmp_path_factory):
    from transformers import Qwen3Model

    folder = tmp_path_factory.mktemp("sharded")
    torch_model = save_random_model(Qwen3Model, qwen3_config(num_hidden_layers=3), folder, seed=11)
    weights = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    keys = sorted(weights)
    shards = {f"model-0000{i + 1}-of-00003.safetensors": keys[i::3] for i in range(3)}
    for name, shard_keys in shards.items():
        save_file({k: weights[k] for k in shard_keys}, str(folder / name), metadata={"format": "pt"})
    weight_map = {k: name for name, shard_keys in shards.items() for k in shard_keys}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder, torch_model


def test_sharded_checkpoint_matches_reference(sharded_qwen3):
    folder, reference = sharded_qwen3
    sequences = random_sequences([4, 31, 9], 128, seed=12)
    pooled = ModelRunner(str(folder), device="cpu").step(PackedBatch.from_sequences(sequences)).wait()
    expected = np.stack([h[-1] for h in hf_hidden_states(reference, sequences)])
    assert cosine_rows(pooled, expected).min() >= MIN_COSINE


def test_fused_projection_part_missing_is_named(sharded_qwen3, tmp_path):
    folder, _ = sharded_qwen3
    for path in folder.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["layers.1.self_attn.k_proj.weight"]
    weights = load_file(str(tmp_path / shard))
    del weights["layers.1.self_attn.k_proj.weight"]
    save_file(weights, str(tmp_path / shard), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing weights for \['layers\.1\.self_attn\.qkv_proj\.weight\[part 1\]'\]"):
        ModelRunner(str(tmp_path), device="cpu")


def test_index_naming_an_absent_shard_fails(sharded_qwen3, tmp_path):
    folder, _ = sharded_qwen3
    (tmp_path / "config.json").write_bytes((folder / "config.json").read_bytes())
    (tmp_path / "model.safetensors.index.json").write_bytes((folder / "model.safetensors.index.json").read_bytes())
    with pytest.raises(FileNotFoundError, match="shard .* is missing"):
        ModelRunner(str(tmp_path), device="cpu")
