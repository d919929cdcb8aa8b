"""Heads of the retrieval kinds (engine_lib/retrieval.py): several outputs from one forward pass.

Each maps `hidden [num_tokens, H]` (+ `cu_seqlens`, `seq_ids`) to a dict of device tensors; the
runner turns them into one `TextOutputs` per sequence (runner/ragged_outputs.py). They run eagerly
(`ragged = True`: no CUDA graphs), so there is no graph padding to skip.
"""
from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from torch import nn

from engine_lib.model_folder import ModelFolder
from engine_lib.models.fused import ACTIVATIONS
from engine_lib.models.loader import read_tensors
from engine_lib.models.pooling import pool
from engine_lib.retrieval import BGE_M3, COLBERT, SPLADE, SpladeConfig

# SPLADE: MLM logits of at most this many elements exist at once (tokens x vocabulary, chunked over
# tokens): 16 Mi elements is 64 MiB in fp32, whatever the batch.
SPLADE_CHUNK_ELEMENTS = 1 << 24


def _load_pt(path: str) -> dict[str, torch.Tensor]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is named
        raise ValueError(f"{path}: cannot read weights ({exc})") from exc


class M3Head(nn.Module):
    """BGE-M3: dense = h[CLS]; token weights = relu(sparse_linear(h)); token vectors =
    normalize(colbert_linear(h)) (the runner keeps those after CLS)."""

    ragged = True
    activation = None

    def __init__(self, folder: ModelFolder):
        super().__init__()
        self._paths = folder.file("sparse_linear.pt"), folder.file("colbert_linear.pt")
        shapes = [_load_pt(p)["weight"].shape for p in self._paths]
        hidden = folder.config["hidden_size"]
        for path, shape in zip(self._paths, shapes):
            if shape[1] != hidden:
                raise ValueError(f"{path}: weight has shape {tuple(shape)}; the body's hidden size is {hidden}")
        if shapes[0][0] != 1:
            raise ValueError(f"{self._paths[0]}: sparse_linear must have one output, has {shapes[0][0]}")
        self.sparse_linear = nn.Linear(hidden, 1)
        self.colbert_linear = nn.Linear(hidden, shapes[1][0])
        self.output_dim, self.multivector_dim = hidden, shapes[1][0]

    def load(self, weight_files: list[str]) -> None:
        for module, path in zip((self.sparse_linear, self.colbert_linear), self._paths):
            state = _load_pt(path)
            missing = {"weight", "bias"} - set(state)
            if missing:
                raise ValueError(f"{path}: missing {sorted(missing)}")
            with torch.no_grad():
                module.weight.copy_(state["weight"])
                module.bias.copy_(state["bias"])

    def forward(self, hidden, cu_seqlens, seq_ids) -> dict[str, torch.Tensor]:
        return {"dense": pool(hidden, cu_seqlens, seq_ids, "cls").float(),
                "token_weights": torch.relu(self.sparse_linear(hidden)).squeeze(-1).float(),
                "multivector": F.normalize(self.colbert_linear(hidden).float(), dim=-1)}


class _MlmTransform(nn.Module):
    def __init__(self, hidden: int, eps: float, activation: str):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x):
        return self.norm(self.activation(self.dense(x)))


class SpladeHead(nn.Module):
    """SPLADE over a BertForMaskedLM / XLMRobertaForMaskedLM: MLM logits chunked over tokens, each
    chunk's log(1 + relu(logits)) pooled into its sequence's row; only the rows' nonzeros leave."""

    ragged = True
    activation = None
    # family -> (transform dense, transform norm, decoder weight, decoder bias, tied embedding)
    NAMES = {"bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                      "cls.predictions.decoder.weight", "cls.predictions.bias",
                      "bert.embeddings.word_embeddings.weight"),
             "xlm-roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder.weight", "lm_head.bias",
                             "roberta.embeddings.word_embeddings.weight")}

    def __init__(self, folder: ModelFolder):
        super().__init__()
        cfg = folder.config
        if folder.model_type not in self.NAMES:
            raise ValueError(f"{folder.file('config.json')}: SPLADE over model_type {folder.model_type!r} is not "
                             f"supported; supported: {sorted(self.NAMES)}")
        self.config = SpladeConfig.of(folder)
        self.names = self.NAMES[folder.model_type]
        act = cfg.get("hidden_act", "gelu") if folder.model_type == "bert" else "gelu"
        self.transform = _MlmTransform(cfg["hidden_size"], cfg.get("layer_norm_eps", 1e-12), act)
        self.decoder = nn.Linear(cfg["hidden_size"], cfg["vocab_size"])
        self.vocab_size, self.output_dim = cfg["vocab_size"], cfg["vocab_size"]

    def load(self, weight_files: list[str]) -> None:
        dense, norm, decoder, bias, embedding = self.names
        wanted = {f"{dense}.weight": self.transform.dense.weight, f"{dense}.bias": self.transform.dense.bias,
                  f"{norm}.weight": self.transform.norm.weight, f"{norm}.bias": self.transform.norm.bias,
                  decoder: self.decoder.weight, bias: self.decoder.bias}
        found = read_tensors(weight_files, [*wanted, embedding])
        if decoder not in found and embedding in found:  # tied to the input embeddings
            found[decoder] = found[embedding]
        for name, param in wanted.items():
            if name not in found:
                raise ValueError(f"{weight_files[0]}: missing weight {name!r} for the SPLADE head")
            if found[name].shape != param.shape:
                raise ValueError(f"{weight_files[0]}: weight {name!r} has shape {tuple(found[name].shape)}, "
                                 f"expected {tuple(param.shape)}")
            with torch.no_grad():
                param.copy_(found[name])

    def forward(self, hidden, cu_seqlens, seq_ids) -> dict[str, torch.Tensor]:
        num_seqs = cu_seqlens.shape[0] - 1
        pooled = torch.zeros(num_seqs, self.vocab_size, dtype=torch.float32, device=hidden.device)
        chunk = max(1, SPLADE_CHUNK_ELEMENTS // self.vocab_size)
        for start in range(0, hidden.shape[0], chunk):
            logits = self.decoder(self.transform(hidden[start:start + chunk])).float()
            weights = torch.log1p(torch.relu(logits))
            if self.config.activation == "log1p_relu":
                weights = torch.log1p(weights)
            rows = seq_ids[start:start + chunk]
            if self.config.pooling == "max":  # from 0: every weight is >= 0, as the reference's masked max
                pooled.scatter_reduce_(0, rows[:, None].expand_as(weights), weights, "amax")
            else:
                pooled.index_add_(0, rows, weights)
        rows, cols = pooled.nonzero(as_tuple=True)  # row-major: ascending ids within each row
        return {"rows": rows, "cols": cols, "values": pooled[rows, cols]}


# sentence-transformers' Dense activation_function names -> the function
DENSE_ACTIVATIONS = {"torch.nn.modules.linear.Identity": lambda x: x, "torch.nn.modules.activation.Tanh": torch.tanh}


class ColbertHead(nn.Module):
    """ColBERT as PyLate saves it: the Dense modules of modules.json in order (sentence-transformers'
    folders: config.json + model.safetensors or pytorch_model.bin with `linear.weight`/`linear.bias`),
    then every token vector normalised; the runner keeps a query's tokens all, a document's but the
    skiplist's (runner/ragged_outputs.py)."""

    ragged = True
    activation = None

    def __init__(self, folder: ModelFolder):
        super().__init__()
        self._paths, activations, linears = [], [], []
        width = folder.config["hidden_size"]
        with open(folder.file("modules.json")) as f:
            modules = json.load(f)
        for module in modules:
            if not module.get("type", "").endswith("Dense"):
                continue
            path = os.path.join(folder.path, module.get("path", ""))
            with open(os.path.join(path, "config.json")) as f:
                config = json.load(f)
            name = config.get("activation_function", "torch.nn.modules.linear.Identity")
            if name not in DENSE_ACTIVATIONS or config.get("use_residual"):
                raise ValueError(f"{path}/config.json: a Dense module with activation {name!r} and use_residual "
                                 f"{config.get('use_residual', False)} is not supported (supported: "
                                 f"{sorted(DENSE_ACTIVATIONS)}, no residual)")
            if config["in_features"] != width:
                raise ValueError(f"{path}/config.json: in_features {config['in_features']}, the previous module "
                                 f"gives {width}")
            linears.append(nn.Linear(width, config["out_features"], bias=config.get("bias", True)))
            activations.append(DENSE_ACTIVATIONS[name])
            self._paths.append(path)
            width = config["out_features"]
        if not linears:
            raise ValueError(f"{folder.file('modules.json')}: a ColBERT folder needs a Dense projection module")
        self.linears, self._activations = nn.ModuleList(linears), activations
        self.output_dim = self.multivector_dim = width

    def load(self, weight_files: list[str]) -> None:
        for linear, path in zip(self.linears, self._paths):
            file = os.path.join(path, "model.safetensors")
            if os.path.isfile(file):
                state = read_tensors([file], ["linear.weight", "linear.bias"])
            else:
                state = _load_pt(os.path.join(path, "pytorch_model.bin"))
            for name, param in (("weight", linear.weight), ("bias", linear.bias)):
                if param is None:
                    continue
                tensor = state.get(f"linear.{name}")
                if tensor is None or tensor.shape != param.shape:
                    raise ValueError(f"{path}: linear.{name} is missing or not of shape {tuple(param.shape)}")
                with torch.no_grad():
                    param.copy_(tensor)

    def forward(self, hidden, cu_seqlens, seq_ids) -> dict[str, torch.Tensor]:
        for linear, activation in zip(self.linears, self._activations):
            hidden = activation(linear(hidden))
        return {"multivector": F.normalize(hidden.float(), dim=-1)}


def build_retrieval_head(kind: str, folder: ModelFolder) -> nn.Module:
    if kind == BGE_M3:
        return M3Head(folder)
    if kind == SPLADE:
        return SpladeHead(folder)
    if kind == COLBERT:
        return ColbertHead(folder)
    raise ValueError(f"unknown retrieval kind {kind!r}")
