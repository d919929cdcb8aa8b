"""A model repository of three floor models (perf.overhead.floor_model): served next to ours.

`floor_batched` is `floor_execute` behind Triton's dynamic batcher: several requests per
`execute` call, which needs `max_batch_size` > 0 and so a batch dimension on every input
(`[1, N]`; `allow_ragged_batch` lets their lengths differ). It measures what the batcher
would save on the encoder's hop without changing the encoder's wire."""
from __future__ import annotations

import shutil
from pathlib import Path

SOURCE = Path(__file__).with_name("floor_model.py")
MODELS = {"floor_execute": "execute", "floor_thread": "thread", "floor_batched": "execute"}
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
BATCHED_CONFIG = """backend: "python"
max_batch_size: 64
dynamic_batching {{ }}
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "INPUT_IDS", data_type: TYPE_INT64, dims: [ -1 ], allow_ragged_batch: true }},
  {{ name: "SEQ_LENS", data_type: TYPE_INT64, dims: [ -1 ], allow_ragged_batch: true }}
]
output [ {{ name: "EMBEDDINGS", data_type: TYPE_FP32, dims: [ -1 ] }} ]
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
        config = BATCHED_CONFIG if name == "floor_batched" else CONFIG
        (folder / name / "config.pbtxt").write_text(config.format(dim=dim, answer_from=answer_from))
        shutil.copy2(SOURCE, folder / name / "1" / "model.py")
    return folder
