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


def env_overrides(config_cls, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Launcher environment over config.pbtxt: ROSE_<FIELD> (e.g. ROSE_MODEL_DIR,
    ROSE_MAX_BATCH_TOKENS) for each field of `config_cls`; empty values are ignored."""
    environ = os.environ if environ is None else environ
    overrides = {}
    for field in dataclasses.fields(config_cls):
        value = environ.get(f"ROSE_{field.name.upper()}")
        if value:
            overrides[field.name] = value
    return overrides
