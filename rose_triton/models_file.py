"""Models served by name: the launcher's `--model NAME=DIR` / `--rerank-model NAME=DIR` and the
models file, read into ServedModel records, and each one's config.pbtxt parameters.

A models file (JSON; YAML when it ends in .yaml/.yml, read with PyYAML):

    {"embedders": {"NAME": {"model_dir": "DIR", "max_batch_tokens": 16384, "dtype": "bfloat16"}},
     "rerankers": {"NAME": {"model_dir": "DIR", "max_length": 512}}}

Every other key of an entry is a setting: a `parameters` key of the shipped config.pbtxt of
one of the model's Triton models (its tokenizer, encoder or unary front; the serving
templates below), applied to each of them that declares it; anything else is refused,
naming the keys there are. A relative model_dir is read from the file's folder.

A named model's Triton models are the shipped ones (model_repository/ for an embedder,
model_sets/rerank/ for a reranker) under the names rose_wire.served_models gives, with
model_dir and the settings written into their parameters and environment prefix
ROSE_MODEL_<NAME>_ (NAME upper-cased, other characters than A-Z 0-9 as _): the launcher's
ROSE_<PARAMETER> variables reach the default model only. The assembler
(rose_triton/repository.py) writes these parameters into the repository; the gateway builds
its tokenizers from the same function, so both read the same settings.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from rose_wire.names import DEFAULT_EMBEDDER, DEFAULT_RERANKER, EMBEDDER, MODELS, NAME_PATTERN, RERANKER, ServedModels
from rose_wire.names import served_models as triton_names

from .parameters import pbtxt_parameters

REPO = Path(__file__).resolve().parents[1]
MODELS_FILE_ENV = "ROSE_MODELS_FILE"
SECTIONS = {"embedders": EMBEDDER, "rerankers": RERANKER}
# The shipped models a named model is made from, and their folder.
TEMPLATES = {EMBEDDER: (REPO / "model_repository", DEFAULT_EMBEDDER),
             RERANKER: (REPO / "model_sets" / "rerank", DEFAULT_RERANKER)}
# Parameters the assembler sets, never a user: the chain between the models, the task, the
# environment prefix and the folder (model_dir is the entry's own key).
RESERVED = ("env_prefix", "task", "tokenizer_model", "encoder_model", "model_dir")


@dataclass(frozen=True)
class ServedModel:
    name: str
    kind: str                    # rose_wire EMBEDDER or RERANKER
    model_dir: str               # absolute
    settings: Mapping[str, str] = field(default_factory=dict)

    @property
    def triton(self) -> ServedModels:
        return triton_names(self.name, self.kind)

    @property
    def env_prefix(self) -> str:
        return "ROSE_MODEL_" + re.sub(r"[^A-Z0-9]", "_", self.name.upper()) + "_"


def _setting_text(name: str, key: str, value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ValueError(f"model {name!r}: setting {key!r} must be a string, number or boolean, got {value!r}")


def _model(name, kind: str, entry, folder: Path) -> ServedModel:
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise ValueError(f"model name {name!r}: use 1-64 characters of A-Z a-z 0-9 . _ -, starting with a "
                         "letter or digit")
    if not isinstance(entry, dict):
        raise ValueError(f"model {name!r}: expected a mapping with model_dir and settings, got {entry!r}")
    model_dir = entry.get("model_dir")
    if not isinstance(model_dir, str) or not model_dir:
        raise ValueError(f"model {name!r}: model_dir (a model folder) is required")
    settings = {k: _setting_text(name, k, v) for k, v in entry.items() if k != "model_dir" and v is not None}
    return ServedModel(name, kind, os.path.abspath(folder / os.path.expanduser(model_dir)), settings)


def parse_flag(value: str, kind: str) -> ServedModel:
    """`NAME=DIR` (serve.sh --model / --rerank-model) -> a model without settings."""
    name, sep, model_dir = value.partition("=")
    if not sep or not name or not model_dir:
        flag = "--model" if kind == EMBEDDER else "--rerank-model"
        raise ValueError(f"{flag} {value!r}: expected NAME=DIR")
    return _model(name, kind, {"model_dir": model_dir}, Path.cwd())


def parse_models(document, folder: Path) -> list[ServedModel]:
    """A models file's content -> its models, embedders first, in file order."""
    if not isinstance(document, dict):
        raise ValueError(f"a models file holds a mapping with {sorted(SECTIONS)}, got {type(document).__name__}")
    unknown = sorted(set(document) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown section(s) {unknown} in the models file; known: {sorted(SECTIONS)}")
    models = []
    for section, kind in SECTIONS.items():
        entries = document.get(section) or {}
        if not isinstance(entries, dict):
            raise ValueError(f"{section}: expected a mapping of model name -> settings")
        models += [_model(name, kind, entry, folder) for name, entry in entries.items()]
    return models


def read_models_file(path: str) -> list[ServedModel]:
    text = Path(path).read_text(encoding="utf-8")
    if str(path).endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise ValueError(f"{path}: reading YAML needs PyYAML; write the models file as JSON instead") from None
        document = yaml.safe_load(text)
    else:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}); a YAML file must end in .yaml or .yml") from None
    try:
        return parse_models(document, Path(path).resolve().parent)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def to_document(models: Iterable[ServedModel]) -> dict:
    """The models file that reads back as `models` (what the assembler leaves for the gateway and watchdog)."""
    document: dict = {section: {} for section in SECTIONS}
    sections = {kind: section for section, kind in SECTIONS.items()}
    for model in models:
        document[sections[model.kind]][model.name] = {"model_dir": model.model_dir, **model.settings}
    return document


def check_models(models: list[ServedModel]) -> None:
    """Every Triton model name once, none of the default models' names; environment prefixes distinct."""
    owner: dict[str, str] = {name: "the default models" for name in MODELS}
    prefixes: dict[str, str] = {}
    for model in models:
        for triton in model.triton:
            if triton in owner:
                raise ValueError(f"model {model.name!r}: its Triton model {triton!r} clashes with {owner[triton]}; "
                                 "choose another name")
            owner[triton] = f"model {model.name!r}"
        if model.env_prefix in prefixes:
            raise ValueError(f"models {prefixes[model.env_prefix]!r} and {model.name!r} share the environment "
                             f"prefix {model.env_prefix}: names must differ in more than . _ -")
        prefixes[model.env_prefix] = model.name


def template_parameters(kind: str) -> dict[str, dict[str, str]]:
    """{role: the shipped config.pbtxt parameters of that role's model} (role: ServedModels' fields)."""
    folder, names = TEMPLATES[kind]
    found = {}
    for role, name in zip(ServedModels._fields, names):
        config = folder / name / "config.pbtxt"
        found[role] = pbtxt_parameters(str(config))
    return found


def config_classes(kind: str) -> dict[str, type]:
    """{role: the config dataclass its model reads its parameters into} (the ensemble has none)."""
    from engine_lib.config import EncoderConfig, PairTokenizerConfig, TokenizerConfig

    from .front import FrontConfig

    return {"front": FrontConfig, "tokenizer": TokenizerConfig if kind == EMBEDDER else PairTokenizerConfig,
            "encoder": EncoderConfig}


def settable(kind: str) -> dict[str, set[str]]:
    """{role: the settings a models-file entry may give it}: its config's fields but RESERVED."""
    return {role: {f for f in cls.__dataclass_fields__ if f not in RESERVED} for role, cls in config_classes(kind).items()}


def model_parameters(model: ServedModel, templates: Mapping[str, Mapping[str, str]] | None = None
                     ) -> dict[str, dict[str, str]]:
    """{role: config.pbtxt parameters} of `model`'s Triton models (the ensemble has none):
    the template's, with this model's chain, folder, environment prefix and settings (each
    to every role whose config has that field)."""
    templates = template_parameters(model.kind) if templates is None else templates
    keys = settable(model.kind)
    unknown = sorted(set(model.settings) - set().union(*keys.values()))
    if unknown:
        raise ValueError(f"model {model.name!r}: unknown setting(s) {unknown}; known: "
                         f"{sorted(set().union(*keys.values()))}")
    names = model.triton
    result = {"ensemble": dict(templates.get("ensemble", {}))}
    for role in keys:
        params = dict(templates[role])
        params["env_prefix"] = model.env_prefix
        if role == "front":
            params["tokenizer_model"], params["encoder_model"] = names.tokenizer, names.encoder
        else:
            params["model_dir"] = model.model_dir
        params.update({key: value for key, value in model.settings.items() if key in keys[role]})
        result[role] = params
    return result


def model_configs(model: ServedModel, environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """{role: its config dataclass} as the Triton model will read it (under the environment with
    the model's prefix): a bad setting fails here, naming it."""
    from .parameters import config_from_parameters

    params = model_parameters(model)
    configs = {}
    for role, cls in config_classes(model.kind).items():
        try:
            configs[role] = config_from_parameters(cls, params[role], environ)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"model {model.name!r} ({model.triton._asdict()[role]}): {exc}") from None
    return configs
