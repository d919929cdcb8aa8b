"""Model families, selected by `model_type` in the model folder's config.json."""
from __future__ import annotations

from engine_lib.models.bert import BertModel, XLMRobertaModel
from engine_lib.models.qwen3 import Qwen3Model

MODEL_FAMILIES = {
    "bert": BertModel,
    "xlm-roberta": XLMRobertaModel,
    "qwen3": Qwen3Model,
}


def model_class(cfg: dict):
    model_type = cfg.get("model_type")
    if model_type not in MODEL_FAMILIES:
        raise ValueError(f"config.json model_type {model_type!r} is not supported; "
                         f"supported: {sorted(MODEL_FAMILIES)}")
    return MODEL_FAMILIES[model_type]
