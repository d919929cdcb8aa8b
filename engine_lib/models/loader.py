"""Load a checkpoint's safetensors (one file or every shard ModelFolder lists) into one of our models.

Checkpoints keep their layout: keys are renamed onto our module paths, and
separate projections our model fuses (q/k/v, gate/up) are copied into their
rows of the `FusedLinear` (models/fused.py). Every parameter row must be
filled exactly once, or loading fails naming what is missing.
"""
from __future__ import annotations

from typing import Iterator

import torch
from safetensors import safe_open
from torch import nn


class CheckpointEmbedding(nn.Embedding):
    """An nn.Embedding without random initialization: models are built on the meta device and
    their weights come from the checkpoint. (nn.Embedding's normal_ on meta goes through
    torch._refs, which imports torch._dynamo: 2.2 s of CPU at every model build.)"""

    def reset_parameters(self) -> None:
        pass


def allocate(module: nn.Module, device: str | torch.device = "cpu") -> nn.Module:
    """Give a module built on the meta device uninitialized storage on `device`, in place (shared
    tensors stay shared). What Module.to_empty does, without its torch._refs path, which
    imports sympy (1.1 s of CPU at every model build)."""
    allocated: dict[int, torch.Tensor] = {}

    def empty(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in allocated:
            storage = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
            is_param = isinstance(tensor, nn.Parameter)
            allocated[id(tensor)] = nn.Parameter(storage, tensor.requires_grad) if is_param else storage
        return allocated[id(tensor)]

    for submodule in module.modules():
        for tensors in (submodule._parameters, submodule._buffers):
            for name, tensor in tensors.items():
                if tensor is not None:
                    tensors[name] = empty(tensor)
    return module


def map_checkpoint_key(model, key: str) -> str | None:
    """Our parameter name for a checkpoint key (a fused one's whole name), or None if unused."""
    mapped = checkpoint_target(model, key)
    return None if mapped is None else mapped[0]


def checkpoint_target(model, key: str) -> tuple[str, int | None] | None:
    """(our parameter name, fused part index or None) for a checkpoint key, or None if unused."""
    for prefix in model.checkpoint_prefixes:
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    if any(key.startswith(ignored) for ignored in model.ignored_keys):
        return None
    for old, new, part in getattr(model, "checkpoint_fusions", ()):
        if old in key:
            return key.replace(old, new, 1), part
    for old, new in model.checkpoint_renames:
        if old in key:
            return key.replace(old, new, 1), None
    return key, None


def _tensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """One tensor at a time, so a sharded model never holds two copies of its weights."""
    try:
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)
    except (OSError, RuntimeError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read weights ({exc})") from exc
    except Exception as exc:  # safetensors raises its own error types
        if type(exc).__module__.startswith("safetensors"):
            raise ValueError(f"{path}: cannot read weights ({exc})") from exc
        raise


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
    """Copy every checkpoint tensor (over all shards) into `model`; every parameter row must be set."""
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    loaded: set[tuple[str, int | None]] = set()
    for path in weight_files:
        for key, tensor in _tensors(path):
            mapped = checkpoint_target(model, key)
            if mapped is None:
                continue
            name, part = mapped
            if name not in params:
                raise ValueError(f"{path}: unexpected weight {key!r} (mapped to {name!r})")
            target = params[name]
            if part is not None:
                start, length = modules[name.rsplit(".", 1)[0]].part_rows(part)
                target = target.narrow(0, start, length)
            if target.shape != tensor.shape:
                raise ValueError(f"{path}: weight {key!r} has shape {tuple(tensor.shape)}, "
                                 f"model expects {tuple(target.shape)}")
            with torch.no_grad():
                target.copy_(tensor)
            loaded.add((name, part))
    _check_complete(model, params, modules, loaded, weight_files[0])


def _check_complete(model, params, modules, loaded, where: str) -> None:
    missing = []
    for name in params:
        if name in getattr(model, "tied_parameters", ()):
            continue
        parts = getattr(modules[name.rsplit(".", 1)[0]] if "." in name else model, "parts", None)
        expected = [(name, i) for i in range(len(parts))] if parts else [(name, None)]
        missing += [f"{n}[part {p}]" if p is not None else n for n, p in expected if (n, p) not in loaded]
    if missing:
        raise ValueError(f"{where}: missing weights for {missing[:5]}{' ...' if len(missing) > 5 else ''}")
