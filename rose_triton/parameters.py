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


def config_from_parameters(config_cls, params: Mapping[str, str]):
    """`config_cls` from a model's config.pbtxt parameters + the environment under its
    `env_prefix` parameter (default ROSE_)."""
    params = dict(params)
    prefix = params.pop("env_prefix", "ROSE_")
    return config_cls.from_parameters(params, **env_overrides(config_cls, prefix=prefix))


def load_config(config_cls, args: dict):
    return config_from_parameters(config_cls, config_parameters(args))


def pbtxt_parameters(path: str) -> dict[str, str]:
    """The `parameters` of a config.pbtxt file as a plain {name: string} dict."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    with open(path, encoding="utf-8") as f:
        config = text_format.Parse(f.read(), model_config_pb2.ModelConfig())
    return {name: value.string_value for name, value in config.parameters.items()}


def sibling_parameters(args: dict, model_name: str) -> dict[str, str]:
    """config.pbtxt parameters of another model of the same repository: `model_name`'s
    folder beside this model's (the unary fronts read their tokenizer model's settings)."""
    folder = os.path.dirname(os.path.normpath(args["model_repository"]))
    return pbtxt_parameters(os.path.join(folder, model_name, "config.pbtxt"))


def output_names(args: dict) -> list[str]:
    """Output tensor names declared in the model's config.pbtxt, in order."""
    return [output["name"] for output in json.loads(args["model_config"]).get("output", [])]


def input_names(args: dict) -> list[str]:
    return [item["name"] for item in json.loads(args["model_config"]).get("input", [])]
