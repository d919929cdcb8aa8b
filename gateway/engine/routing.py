"""A request's `model` -> the Triton models that answer it.

Served: the default embedder (under its served name: --model-name, else its folder's name,
all-MiniLM-L6-v2 embedded), the default reranker (`rerank`, or --rerank-model-name, while a
replica serves it) and every model of the models file (--models-file / ROSE_MODELS_FILE: the
launcher's --model / --rerank-model), each under its own name with its own tokenizer
settings and limits (rose_triton/models_file.py). `Routes.embedder(name)` and
`Routes.reranker(name)` are the one lookup every endpoint uses; an unknown name is 404
naming the served ones. A reranker's limits are its pair tokenizer's settings."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from engine_lib.config import PairTokenizerConfig
from engine_lib.model_folder import ModelFolder
from rose_triton.models_file import ServedModel, check_models, model_configs, read_models_file
from rose_triton.parameters import config_from_pbtxt
from rose_wire import DEFAULT_EMBEDDER, DEFAULT_RERANKER, EMBEDDER, RERANK, ServedModels

from ..errors import ApiError, model_not_found
from .tokenizing import GatewayTokenizer

LONGEST_PAIR = 8192  # tokens per pair of the longest-reading family served (Qwen3 judges, XLM-RoBERTa-large)


@dataclass(frozen=True)
class EmbedderRoute:
    name: str                     # the `model` clients send
    tokenizer: GatewayTokenizer   # its tokenizer model's code, settings and limits
    triton: ServedModels          # chunks go to triton.encoder, pre-tokenized

    @property
    def encoder(self) -> str:
        return self.triton.encoder


@dataclass(frozen=True)
class RerankerRoute:
    name: str
    limits: PairTokenizerConfig   # its pair tokenizer's settings (the request limits)
    pair_tokens: int              # tokens per (query, document) pair at most (admission)
    triton: ServedModels          # chunks go to triton.ensemble, as texts

    @property
    def ensemble(self) -> str:
        return self.triton.ensemble


def read_limits(rerank_tokenizer_config: str) -> PairTokenizerConfig:
    """The rerank_tokenizer model's settings (its config.pbtxt under ROSE_RERANK_*): its limits apply here."""
    return config_from_pbtxt(PairTokenizerConfig, rerank_tokenizer_config)


def max_pair_tokens(limits: PairTokenizerConfig) -> int:
    """Tokens per (query, document) pair at most: rerank_tokenizer's max_length, else the
    reranker folder's maximum when the folder is here, else LONGEST_PAIR."""
    if limits.max_length:
        return limits.max_length
    try:
        folder = ModelFolder.open(limits.model_dir)
        return min(folder.max_length, LONGEST_PAIR) if folder.model_type == "qwen3" else folder.max_length
    except (OSError, ValueError):
        return LONGEST_PAIR


def named_routes(models: list[ServedModel], tokenizer=GatewayTokenizer) -> tuple[dict, dict]:
    """({name: EmbedderRoute}, {name: RerankerRoute}) of the models served by name."""
    embedders, rerankers = {}, {}
    for model in models:
        config = model_configs(model)["tokenizer"]
        if model.kind == EMBEDDER:
            embedders[model.name] = EmbedderRoute(model.name, tokenizer(config), model.triton)
        else:
            rerankers[model.name] = RerankerRoute(model.name, config, max_pair_tokens(config), model.triton)
    return embedders, rerankers


def read_routes(models_file: str, tokenizer=GatewayTokenizer) -> tuple[dict, dict]:
    if not models_file:
        return {}, {}
    models = read_models_file(models_file)
    check_models(models)
    return named_routes(models, tokenizer)


class Routes:
    def __init__(self, default_embedder: EmbedderRoute, default_reranker: RerankerRoute,
                 embedders: dict[str, EmbedderRoute], rerankers: dict[str, RerankerRoute],
                 serves: Callable[[str], bool]):
        """`serves(triton model)`: some replica has it ready (only the default reranker is
        listed and routed by that: the launcher serves it only with --rerank-model-dir)."""
        for name in (default_embedder.name, default_reranker.name, RERANK):
            if name in embedders or name in rerankers:
                raise ValueError(f"the models file serves {name!r}, a name of the default models: choose another")
        self.default_embedder, self.default_reranker = default_embedder, default_reranker
        self.embedders = {default_embedder.name: default_embedder, **embedders}
        self.rerankers = rerankers
        self.serves = serves

    def targets(self) -> tuple[str, ...]:
        """The Triton models of the named models whose readiness routes depend on."""
        return tuple([r.encoder for r in self.embedders.values() if r.triton != DEFAULT_EMBEDDER] +
                     [r.ensemble for r in self.rerankers.values()])

    def reranker_names(self) -> list[str]:
        default = [self.default_reranker.name] if self.serves(DEFAULT_RERANKER.ensemble) else []
        return default + list(self.rerankers)

    def names(self) -> list[str]:
        """GET /v1/models: every embedder, then every served reranker."""
        return list(self.embedders) + self.reranker_names()

    def embedder(self, model: str) -> EmbedderRoute:
        route = self.embedders.get(model)
        if route is not None:
            return route
        extra = ": it is a reranker (POST /v1/rerank)" if model in self.reranker_names() else ""
        raise model_not_found(model, list(self.embedders), extra)

    def reranker(self, model: str | None) -> RerankerRoute:
        """`model` None: the default reranker when served, else the only one served."""
        served = self.reranker_names()
        if not served:
            if model is not None and model not in (self.default_reranker.name, RERANK):
                raise model_not_found(model, [])
            raise model_not_found(model or self.default_reranker.name, [],
                                  ": no reranker is served (start the launcher with --rerank-model-dir or "
                                  "--rerank-model)")
        if model is None:
            if self.default_reranker.name in served:
                return self.default_reranker
            if len(self.rerankers) == 1:
                return next(iter(self.rerankers.values()))
            raise ApiError(400, f"'model' is required: several rerankers are served: {served}", "model",
                           "invalid_value")
        if model in (self.default_reranker.name, RERANK) and self.default_reranker.name in served:
            return self.default_reranker
        if model in self.rerankers:
            return self.rerankers[model]
        extra = ": it is an embedder (POST /v1/embeddings)" if model in self.embedders else ""
        raise model_not_found(model, served, extra)
