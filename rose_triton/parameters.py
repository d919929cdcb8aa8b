"""The one configuration path: config.pbtxt parameters + the launcher's environment ->
the config dataclasses of engine_lib/config.py.

Precedence, in one place (config_from_parameters): an explicit value (a command-line
flag of the gateway) > the environment variable <prefix><FIELD> (prefix ROSE_, or the
model's `env_prefix` parameter: ROSE_RERANK_ for the reranker's models; empty values
are ignored) > the config.pbtxt parameter > the dataclass default. The dataclass
converts and validates. Triton models, unary fronts, the gateway and the tests read
config.pbtxt files only here (read_model_config: Triton's own protobuf parser)."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping

DEFAULT_ENV_PREFIX = "ROSE_"


def config_parameters(args: dict) -> dict[str, str]:
    """This model's config.pbtxt `parameters` (as Triton hands them to `initialize`) as a {name: string} dict."""
    model_config = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}


def env_overrides(config_cls, environ: Mapping[str, str] | None = None,
                  prefix: str = DEFAULT_ENV_PREFIX) -> dict[str, str]:
    """Launcher environment over config.pbtxt: <prefix><FIELD> (e.g. ROSE_MODEL_DIR,
    ROSE_MAX_BATCH_TOKENS) for each field of `config_cls`; empty values are ignored."""
    environ = os.environ if environ is None else environ
    overrides = {}
    for field in dataclasses.fields(config_cls):
        value = environ.get(f"{prefix}{field.name.upper()}")
        if value:
            overrides[field.name] = value
    return overrides


def config_from_parameters(config_cls, params: Mapping[str, str], environ: Mapping[str, str] | None = None,
                           **explicit):
    """`config_cls` from config.pbtxt parameters, under the environment (prefix: the
    `env_prefix` parameter, default ROSE_), under `explicit` values (None = not given)."""
    params = dict(params)
    prefix = params.pop("env_prefix", DEFAULT_ENV_PREFIX)
    overrides = env_overrides(config_cls, environ, prefix)
    overrides.update({k: v for k, v in explicit.items() if v is not None})
    return config_cls.from_parameters(params, **overrides)


def load_config(config_cls, args: dict):
    return config_from_parameters(config_cls, config_parameters(args))


def instance_device(args: dict, configured: str) -> str:
    """The device a model instance runs on: a KIND_GPU instance on the GPU Triton placed it on
    (`cuda:<model_instance_device_id>`, so `gpus: [0, 1]` gives one instance per GPU); any
    other instance as configured (`device` parameter: auto, cpu, cuda, cuda:N)."""
    if args.get("model_instance_kind") != "GPU":
        return configured
    if configured == "cpu":
        raise ValueError("device=cpu on a KIND_GPU instance: use KIND_CPU, or device auto/cuda")
    return f"cuda:{int(args['model_instance_device_id'])}"


def read_model_config(path: str):
    """A config.pbtxt file as Triton reads it: a `ModelConfig` protobuf message."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    with open(path, encoding="utf-8") as f:
        return text_format.Parse(f.read(), model_config_pb2.ModelConfig())


def pbtxt_parameters(path: str) -> dict[str, str]:
    """The `parameters` of a config.pbtxt file as a plain {name: string} dict."""
    return {name: value.string_value for name, value in read_model_config(path).parameters.items()}


def config_from_pbtxt(config_cls, path: str, environ: Mapping[str, str] | None = None, **explicit):
    """`config_cls` from a config.pbtxt file, same precedence (the gateway reads the tokenizer models' so)."""
    return config_from_parameters(config_cls, pbtxt_parameters(path), environ, **explicit)


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
