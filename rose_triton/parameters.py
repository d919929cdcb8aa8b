"""config.pbtxt parameters and the launcher's environment -> the config dataclasses' string inputs.

Precedence, in one place: a ROSE_<FIELD> environment variable set by the
launcher overrides the config.pbtxt parameter, which overrides the dataclass
default; the dataclass converts and validates (engine_lib/config.py)."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping


def config_parameters(args: dict) -> dict[str, str]:
    """config.pbtxt `parameters` as a plain {name: string} dict."""
    model_config = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}


def env_overrides(config_cls, environ: Mapping[str, str] | None = None, prefix: str = "ROSE_") -> dict[str, str]:
    """Launcher environment over config.pbtxt: ROSE_<FIELD> (e.g. ROSE_MODEL_DIR,
    ROSE_MAX_BATCH_TOKENS) for each field of `config_cls`; empty values are ignored.
    The reranker's models use prefix ROSE_RERANK_ (ROSE_RERANK_MODEL_DIR, ...)."""
    environ = os.environ if environ is None else environ
    overrides = {}
    for field in dataclasses.fields(config_cls):
        value = environ.get(f"{prefix}{field.name.upper()}")
        if value:
            overrides[field.name] = value
    return overrides


def load_config(config_cls, args: dict):
    """`config_cls` from config.pbtxt parameters + the environment under the model's
    `env_prefix` parameter (default ROSE_)."""
    params = config_parameters(args)
    prefix = params.pop("env_prefix", "ROSE_")
    return config_cls.from_parameters(params, **env_overrides(config_cls, prefix=prefix))


def output_names(args: dict) -> list[str]:
    """Output tensor names declared in the model's config.pbtxt, in order."""
    return [output["name"] for output in json.loads(args["model_config"]).get("output", [])]


def input_names(args: dict) -> list[str]:
    return [item["name"] for item in json.loads(args["model_config"]).get("input", [])]
