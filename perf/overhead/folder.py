"""The near-zero-compute model folder: the default model's tokenizer, a 1-layer 32-wide BERT."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHAPE = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
# Everything of the default folder but its weights and model config.
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "modules.json",
          "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling")


def build_tiny_model(folder: str | Path, default_dir: str | None = None, seed: int = 0) -> Path:
    """Write the tiny folder (random weights, fixed seed) and return it; reused if already complete."""
    from transformers import BertConfig, BertModel

    from engine_lib.model_folder import resolve_model_dir
    from testing.tiny_models import save_random_model

    folder = Path(folder)
    if (folder / "model.safetensors").is_file() and (folder / ".complete").is_file():
        return folder
    source = Path(default_dir or resolve_model_dir("default"))
    folder.mkdir(parents=True, exist_ok=True)
    base = json.loads((source / "config.json").read_text())
    config = BertConfig(vocab_size=base["vocab_size"], max_position_embeddings=base["max_position_embeddings"],
                        type_vocab_size=base.get("type_vocab_size", 2), **SHAPE)
    save_random_model(BertModel, config, folder, seed=seed)
    for name in COPIED:
        path = source / name
        if path.is_dir():
            shutil.copytree(path, folder / name, dirs_exist_ok=True)
        elif path.is_file():
            shutil.copy2(path, folder / name)
    pooling = folder / "1_Pooling" / "config.json"
    if pooling.is_file():
        pooling.write_text(json.dumps({**json.loads(pooling.read_text()),
                                       "word_embedding_dimension": SHAPE["hidden_size"]}, indent=2))
    (folder / ".complete").write_text("")
    return folder
