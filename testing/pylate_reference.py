"""PyLate's ColBERT encoding and scoring, transcribed (PyLate 1.6 needs sentence-transformers 5.3 and
cannot load a folder under this repository's 6.x): `encode` follows pylate/models/colbert.py
(`ColBERT.tokenize`, `ColBERT.encode`, `ColBERT.skiplist_mask`) step for step over transformers'
BertModel, and `colbert_scores` pylate/scores/colbert.py. Settings come from the folder's
config_sentence_transformers.json with PyLate's defaults."""
from __future__ import annotations

import json
import string
from pathlib import Path

import torch


class PylateColbert:
    def __init__(self, folder):
        from safetensors.torch import load_file
        from transformers import AutoTokenizer, BertModel

        folder = Path(folder)
        cfg = json.loads((folder / "config_sentence_transformers.json").read_text())
        self.query_length, self.document_length = cfg.get("query_length") or 32, cfg.get("document_length") or 180
        self.do_query_expansion = cfg.get("do_query_expansion", True)
        self.attend_to_expansion_tokens = self.do_query_expansion and cfg.get("attend_to_expansion_tokens", False)
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.tokenizer.pad_token_id = self.tokenizer.mask_token_id  # "If it is a MLM model, use the MASK token"
        self.query_prefix_id = self.tokenizer.convert_tokens_to_ids(cfg.get("query_prefix", "[Q] "))
        self.document_prefix_id = self.tokenizer.convert_tokens_to_ids(cfg.get("document_prefix", "[D] "))
        self.skiplist = [self.tokenizer.convert_tokens_to_ids(w)
                         for w in cfg.get("skiplist_words", list(string.punctuation))]
        self.model = BertModel.from_pretrained(str(folder), add_pooling_layer=False).eval()
        self.dense = load_file(str(folder / "1_Dense" / "model.safetensors"))["linear.weight"]

    @staticmethod
    def insert_prefix_token(input_ids: torch.Tensor, prefix_id: int) -> torch.Tensor:
        prefix = torch.full((input_ids.size(0), 1), prefix_id, dtype=input_ids.dtype)
        return torch.cat([input_ids[:, :1], prefix, input_ids[:, 1:]], dim=1)

    def tokenize(self, texts: list[str], is_query: bool) -> dict[str, torch.Tensor]:
        max_length = self.query_length if is_query else self.document_length
        prefix_id = self.query_prefix_id if is_query else self.document_prefix_id
        padding = "max_length" if is_query and self.do_query_expansion else True  # ST's Transformer.tokenize
        out = dict(self.tokenizer([t.strip() for t in texts], padding=padding, truncation="longest_first",
                                  return_tensors="pt", max_length=max_length - 1))
        out["input_ids"] = self.insert_prefix_token(out["input_ids"], prefix_id)
        out["attention_mask"] = self.insert_prefix_token(out["attention_mask"], 1)
        if "token_type_ids" in out:
            out["token_type_ids"] = self.insert_prefix_token(out["token_type_ids"], 0)
        if is_query and self.attend_to_expansion_tokens:
            out["attention_mask"].fill_(1)
        return out

    @torch.no_grad()
    def encode(self, texts: list[str], is_query: bool) -> list:
        features = self.tokenize(texts, is_query)
        hidden = self.model(**features).last_hidden_state
        token_embeddings = hidden @ self.dense.T  # Dense: bias-free linear, Identity activation
        if not is_query:
            skiplist_mask = ~torch.isin(features["input_ids"], torch.tensor(self.skiplist))
            masks = skiplist_mask & features["attention_mask"].bool()
        elif self.do_query_expansion:
            masks = torch.ones_like(features["input_ids"], dtype=torch.bool)
        else:
            masks = features["attention_mask"].bool()
        return [torch.nn.functional.normalize(e[m], p=2, dim=1).numpy() for e, m in zip(token_embeddings, masks)]


def colbert_scores(query, documents) -> list[float]:
    """pylate/scores/colbert.py: the sum over the query's token vectors of their best dot product."""
    q = torch.as_tensor(query, dtype=torch.float64)
    return [float((q @ torch.as_tensor(d, dtype=torch.float64).T).max(-1).values.sum()) for d in documents]
