"""A model repository of two floor models (perf.overhead.floor_model): served next to ours."""
from __future__ import annotations

import shutil
from pathlib import Path

SOURCE = Path(__file__).with_name("floor_model.py")
MODELS = {"floor_execute": "execute", "floor_thread": "thread"}
CONFIG = """backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "INPUT_IDS", data_type: TYPE_INT64, dims: [ -1 ] }},
  {{ name: "SEQ_LENS", data_type: TYPE_INT64, dims: [ -1 ] }}
]
output [ {{ name: "EMBEDDINGS", data_type: TYPE_FP32, dims: [ -1, -1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
parameters [
  {{ key: "dim", value: {{ string_value: "{dim}" }} }},
  {{ key: "answer_from", value: {{ string_value: "{answer_from}" }} }}
]
"""


def write_floor_repository(folder: str | Path, dim: int) -> Path:
    folder = Path(folder)
    for name, answer_from in MODELS.items():
        (folder / name / "1").mkdir(parents=True, exist_ok=True)
        (folder / name / "config.pbtxt").write_text(CONFIG.format(dim=dim, answer_from=answer_from))
        shutil.copy2(SOURCE, folder / name / "1" / "model.py")
    return folder
