"""Helpers shared by the model.py adapters (no triton import here)."""
from __future__ import annotations

import json
import os


def config_parameters(args: dict) -> dict[str, str]:
    """config.pbtxt `parameters` as a plain {name: string} dict."""
    model_config = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}


def model_dir_override() -> dict[str, str]:
    """The launcher's ROSE_MODEL_DIR wins over config.pbtxt (one model folder for all steps)."""
    value = os.environ.get("ROSE_MODEL_DIR")
    return {"model_dir": value} if value else {}
