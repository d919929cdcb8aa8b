"""Output heads over packed hidden states: pooled embeddings, or one relevance logit per sequence.

A head maps `hidden [num_tokens, H]` (plus `cu_seqlens`, `seq_ids`) to
`[num_seqs, output_dim]`. Scoring heads give one logit per (query, document)
sequence; `activation` names what turns it into the model's score (sigmoid
for a single-logit cross-encoder, as sentence-transformers' CrossEncoder does;
sigmoid(yes - no) = softmax over ("no", "yes") for a yes/no judge).
Every head picks its rows with `pooling.pool` (classifiers the CLS token, the
judge the last token), so graph padding is handled in one place.
"""
from __future__ import annotations

import torch
from torch import nn

from engine_lib.model_folder import ModelFolder, scoring_architecture
from engine_lib.models.fused import LinearAct
from engine_lib.models.loader import read_tensors
from engine_lib.models.pooling import pool
from engine_lib.models.retrieval_heads import build_retrieval_head
from engine_lib.retrieval import retrieval_kind

TASKS = ("embed", "score")


class PoolingHead(nn.Module):
    """Embeddings: the folder's pooling (mean / CLS / last token); no weights."""

    activation = None

    def __init__(self, mode: str, hidden_size: int):
        super().__init__()
        self.mode, self.output_dim = mode, hidden_size

    def forward(self, hidden, cu_seqlens, seq_ids):
        return pool(hidden, cu_seqlens, seq_ids, self.mode)

    def load(self, weight_files: list[str]) -> None:
        pass


class _CheckpointHead(nn.Module):
    """A head whose parameters are named checkpoint tensors (`checkpoint_names`: ours -> theirs)."""

    checkpoint_names: dict[str, str] = {}

    def load(self, weight_files: list[str]) -> None:
        params = dict(self.named_parameters())
        checkpoint = read_tensors(weight_files, list(self.checkpoint_names.values()))
        path = weight_files[0]
        for ours, theirs in self.checkpoint_names.items():
            if theirs not in checkpoint:
                raise ValueError(f"{path}: missing weight {theirs!r} for the {type(self).__name__}")
            if checkpoint[theirs].shape != params[ours].shape:
                raise ValueError(f"{path}: weight {theirs!r} has shape {tuple(checkpoint[theirs].shape)}, "
                                 f"expected {tuple(params[ours].shape)}")
            with torch.no_grad():
                params[ours].copy_(checkpoint[theirs])


class BertClassifierHead(_CheckpointHead):
    """BertForSequenceClassification: classifier(tanh(pooler.dense(h[CLS])))."""

    checkpoint_names = {"dense.weight": "bert.pooler.dense.weight", "dense.bias": "bert.pooler.dense.bias",
                        "out.weight": "classifier.weight", "out.bias": "classifier.bias"}

    def __init__(self, cfg: dict):
        super().__init__()
        self.dense = LinearAct(cfg["hidden_size"], cfg["hidden_size"], "tanh")
        self.out = nn.Linear(cfg["hidden_size"], 1)
        self.output_dim = 1

    def forward(self, hidden, cu_seqlens, seq_ids):
        return self.out(self.dense(pool(hidden, cu_seqlens, seq_ids, "cls")))


class RobertaClassifierHead(BertClassifierHead):
    """XLMRobertaForSequenceClassification: out_proj(tanh(dense(h[<s>]))) (no pooler)."""

    checkpoint_names = {"dense.weight": "classifier.dense.weight", "dense.bias": "classifier.dense.bias",
                        "out.weight": "classifier.out_proj.weight", "out.bias": "classifier.out_proj.bias"}


class YesNoHead(nn.Module):
    """Causal LM judging relevance: logit("yes") - logit("no") at each sequence's last token.

    Only the two LM-head rows are kept, so the vocabulary projection costs
    2 x H per sequence instead of vocab x H.
    """

    def __init__(self, cfg: dict, yes_id: int, no_id: int):
        super().__init__()
        self.token_ids = (no_id, yes_id)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        self.weight = nn.Parameter(torch.empty(2, cfg["hidden_size"]))  # rows: "no", "yes"
        self.output_dim = 1

    def forward(self, hidden, cu_seqlens, seq_ids):
        logits = (pool(hidden, cu_seqlens, seq_ids, "lasttoken") @ self.weight.t()).float()  # [num_seqs, 2]
        return logits[:, 1:] - logits[:, :1]

    def load(self, weight_files: list[str]) -> None:
        checkpoint = read_tensors(weight_files, ["lm_head.weight", "model.embed_tokens.weight"])
        name = "lm_head.weight"
        if name not in checkpoint and self.tied:
            name = "model.embed_tokens.weight"
        if name not in checkpoint:
            raise ValueError(f"{weight_files[0]}: missing weight 'lm_head.weight' for the yes/no head")
        with torch.no_grad():
            self.weight.copy_(checkpoint[name][list(self.token_ids)])


def num_labels(cfg: dict) -> int:
    return len(cfg["id2label"]) if isinstance(cfg.get("id2label"), dict) else int(cfg.get("num_labels", 2))


def classifier_activation(cfg: dict) -> str:
    """sentence-transformers' CrossEncoder default (sigmoid for one logit) unless config.json names another."""
    name = (cfg.get("sentence_transformers") or {}).get("activation_fn") or "Sigmoid"
    for suffix, activation in (("Identity", "identity"), ("Sigmoid", "sigmoid")):
        if name.endswith(suffix):
            return activation
    raise ValueError(f"config.json: sentence_transformers.activation_fn {name!r} is not supported "
                     f"(Sigmoid or Identity)")


def _yes_no_ids(folder: ModelFolder) -> tuple[int, int]:
    from tokenizers import Tokenizer

    path = folder.tokenizer_path
    tokenizer = Tokenizer.from_file(path)
    ids = tokenizer.token_to_id("yes"), tokenizer.token_to_id("no")
    if None in ids:
        raise ValueError(f"{path}: the tokens 'yes' and 'no' must both be in the vocabulary for a yes/no reranker")
    return ids


def build_head(task: str, folder: ModelFolder) -> nn.Module:
    cfg, path = folder.config, folder.file("config.json")
    if task == "embed":
        kind = retrieval_kind(folder)
        return build_retrieval_head(kind, folder) if kind else PoolingHead(folder.pooling, cfg["hidden_size"])
    if task != "score":
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    arch = scoring_architecture(cfg, path)
    if arch == "Qwen3ForCausalLM":
        head = YesNoHead(cfg, *_yes_no_ids(folder))
        head.activation = "sigmoid"
        return head
    if num_labels(cfg) != 1:
        raise ValueError(f"{path}: {arch} with {num_labels(cfg)} labels; SCORES needs a single-logit model")
    head = BertClassifierHead(cfg) if arch == "BertForSequenceClassification" else RobertaClassifierHead(cfg)
    head.activation = classifier_activation(cfg)
    return head
