"""Assemble the model repository Triton serves: the base repository, the selected model sets
and the models served by name.

Triton (model control mode `none`) loads every folder of its repository and exits if one
fails, so optional models cannot sit in model_repository/. The launcher serves
model_repository/ as is when nothing optional is selected; otherwise this makes OUT with
one symlink per model folder of the base and of each selected set (model_sets/<set>/), and
for each model served by name (rose_triton/models_file.py) four folders of its own: a
config.pbtxt written from the shipped one (its steps, chain and parameters renamed and
set) and a link to the shipped model.py. Model code is never copied. OUT/served_models.json
then lists the named models (a models file: the gateway and the watchdog read it).

    python3 -m rose_triton.repository OUT BASE [SET_DIR ...] [--model NAME=DIR ...]
        [--rerank-model NAME=DIR ...] [--models-file FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from rose_wire.names import EMBEDDER, RERANKER

from .models_file import (
    MODELS_FILE_ENV,
    TEMPLATES,
    ServedModel,
    check_models,
    model_configs,
    model_parameters,
    parse_flag,
    read_models_file,
    to_document,
)
from .parameters import read_model_config

MARKER = ".rose-assembled"  # OUT is only ever emptied when it carries this (never a user's folder)
SERVED_MODELS = "served_models.json"


def model_folders(root: str) -> list[str]:
    return sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "config.pbtxt")))


def named_config(model: ServedModel, role: str, params: dict[str, str]) -> str:
    """The config.pbtxt text of `model`'s `role` model: the shipped one, renamed and parameterised."""
    from google.protobuf import text_format

    folder, template_names = TEMPLATES[model.kind]
    config = read_model_config(str(folder / getattr(template_names, role) / "config.pbtxt"))
    renamed = dict(zip(template_names, model.triton))
    for step in config.ensemble_scheduling.step:
        step.model_name = renamed[step.model_name]
    config.ClearField("parameters")
    for key, value in params.items():
        config.parameters[key].string_value = value
    return f"# Written by rose_triton/repository.py for the served model {model.name!r}.\n" + \
        text_format.MessageToString(config)


def _write_named(out: str, model: ServedModel) -> dict[str, str]:
    folder, template_names = TEMPLATES[model.kind]
    written = {}
    for role, params in model_parameters(model).items():
        name, template = getattr(model.triton, role), folder / getattr(template_names, role)
        os.makedirs(os.path.join(out, name, "1"))
        with open(os.path.join(out, name, "config.pbtxt"), "w", encoding="utf-8") as f:
            f.write(named_config(model, role, params))
        code = template / "1" / "model.py"
        if code.exists():
            os.symlink(os.path.realpath(code), os.path.join(out, name, "1", "model.py"))
        written[name] = f"{role} of {model.kind} {model.name!r}"
    return written


def check_named(models: list[ServedModel]) -> None:
    """Names, folders and settings, before anything is written (the Triton models would fail at load)."""
    check_models(models)
    for model in models:
        if not os.path.isfile(os.path.join(model.model_dir, "config.json")):
            raise ValueError(f"model {model.name!r}: {model.model_dir} is not a model folder (no config.json)")
        model_configs(model)


def assemble(out: str, base: str, sets: list[str], models: list[ServedModel] = ()) -> dict[str, str]:
    """{Triton model name: folder it links to, or what was written}; refuses a name that two sources define."""
    models = list(models)
    links: dict[str, str] = {}
    for source in [base, *sets]:
        if not os.path.isdir(source):
            raise SystemExit(f"rose_triton.repository: {source} is not a folder")
        for name in model_folders(source):
            if name in links:
                raise SystemExit(f"rose_triton.repository: model {name!r} is in both {links[name]} and {source}")
            links[name] = os.path.abspath(os.path.join(source, name))
    try:
        check_named(models)
    except ValueError as exc:
        raise SystemExit(f"rose_triton.repository: {exc}") from None
    for model in models:
        for name in model.triton:
            if name in links:
                raise SystemExit(f"rose_triton.repository: model {name!r} of {model.name!r} is also in {links[name]}")
    if os.path.isdir(out) and os.listdir(out):
        if not os.path.isfile(os.path.join(out, MARKER)):
            raise SystemExit(f"rose_triton.repository: {out} is not empty and was not made by this script")
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, MARKER), "w").close()
    for name, target in links.items():
        os.symlink(target, os.path.join(out, name))
    for model in models:
        links.update(_write_named(out, model))
    if models:
        with open(os.path.join(out, SERVED_MODELS), "w", encoding="utf-8") as f:
            json.dump(to_document(models), f, indent=2)
    return links


def selected_models(flags: list[tuple[str, str]], models_file: str | None) -> list[ServedModel]:
    """--model / --rerank-model flags (in order), then the models file's entries."""
    models = [parse_flag(value, kind) for kind, value in flags]
    if models_file:
        models += read_models_file(models_file)
    return models


def describe(model: ServedModel) -> str:
    return f"{model.kind} {model.name!r} from {model.model_dir} (Triton models {', '.join(model.triton)})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m rose_triton.repository", description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("base")
    p.add_argument("sets", nargs="*")
    p.add_argument("--model", dest="flags", action="append", default=[], type=lambda v: (EMBEDDER, v),
                   metavar="NAME=DIR", help="an embedder served as NAME (repeatable)")
    p.add_argument("--rerank-model", dest="flags", action="append", type=lambda v: (RERANKER, v),
                   metavar="NAME=DIR", help="a reranker served as NAME (repeatable)")
    p.add_argument("--models-file", default=os.environ.get(MODELS_FILE_ENV) or None,
                   help=f"models served by name with their settings (JSON or YAML; also {MODELS_FILE_ENV})")
    args = p.parse_args(argv)
    try:
        models = selected_models(args.flags, args.models_file)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"rose_triton.repository: {exc}") from None
    for name, target in assemble(args.out, args.base, args.sets, models).items():
        print(f"{name} -> {target}")
    for model in models:
        print(f"[serve] {describe(model)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
