"""Checkpoint loading: key mapping, and refusals that name the file and the weight."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from engine_lib.loader import load_weights, map_checkpoint_key


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
