"""Load a checkpoint's safetensors into one of our models by key mapping."""
from __future__ import annotations

import torch
from safetensors import safe_open
from safetensors.torch import load_file


def map_checkpoint_key(model, key: str) -> str | None:
    """Our parameter name for a checkpoint key, or None if the key is unused."""
    for prefix in model.checkpoint_prefixes:
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    if any(key.startswith(ignored) for ignored in model.ignored_keys):
        return None
    for old, new in model.checkpoint_renames:
        if old in key:
            return key.replace(old, new, 1)
    return key


def read_tensors(weight_files: list[str], names: list[str]) -> dict[str, torch.Tensor]:
    """Only the named checkpoint tensors (those present), over all shards."""
    found = {}
    for path in weight_files:
        try:
            with safe_open(path, framework="pt") as f:
                for name in set(names) & set(f.keys()):
                    found[name] = f.get_tensor(name)
        except Exception as exc:  # safetensors raises its own error types
            raise ValueError(f"{path}: cannot read weights ({exc})") from exc
    return found


def load_weights(model: torch.nn.Module, weight_files: list[str]) -> None:
    """Copy every checkpoint tensor (over all shards) into `model`; every parameter must be set."""
    params = dict(model.named_parameters())
    loaded = set()
    for path in weight_files:
        try:
            checkpoint = load_file(path)
        except Exception as exc:  # safetensors raises its own error types
            raise ValueError(f"{path}: cannot read weights ({exc})") from exc
        for key, tensor in checkpoint.items():
            name = map_checkpoint_key(model, key)
            if name is None:
                continue
            if name not in params:
                raise ValueError(f"{path}: unexpected weight {key!r} (mapped to {name!r})")
            if params[name].shape != tensor.shape:
                raise ValueError(f"{path}: weight {key!r} has shape {tuple(tensor.shape)}, "
                                 f"model expects {tuple(params[name].shape)}")
            with torch.no_grad():
                params[name].copy_(tensor)
            loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"{weight_files[0]}: missing weights for {missing[:5]}{' ...' if len(missing) > 5 else ''}")
