"""Assemble the model repository Triton serves from the selected model sets (stdlib only).

Triton (model control mode `none`) loads every folder of its repository and
exits if one fails, so optional models cannot sit in model_repository/. The
launcher serves model_repository/ as is when nothing optional is selected;
otherwise this script makes OUT with one symlink per model folder: every
folder of the base repository, then every folder of each selected set
(model_sets/<set>/). Model code is never copied: a set's model.py may itself
be a link to the base repository's (the `rerank_encoder` runs rose_encoder's).

    python3 scripts/assemble_repository.py OUT BASE [SET_DIR ...]
"""
from __future__ import annotations

import os
import shutil
import sys

MARKER = ".rose-assembled"  # OUT is only ever emptied when it carries this (never a user's folder)


def model_folders(root: str) -> list[str]:
    return sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "config.pbtxt")))


def assemble(out: str, base: str, sets: list[str]) -> dict[str, str]:
    """{model name: folder it links to}; refuses a name that two sources both define."""
    links: dict[str, str] = {}
    for source in [base, *sets]:
        if not os.path.isdir(source):
            raise SystemExit(f"assemble_repository: {source} is not a folder")
        for name in model_folders(source):
            if name in links:
                raise SystemExit(f"assemble_repository: model {name!r} is in both {links[name]} and {source}")
            links[name] = os.path.abspath(os.path.join(source, name))
    if os.path.isdir(out) and os.listdir(out):
        if not os.path.isfile(os.path.join(out, MARKER)):
            raise SystemExit(f"assemble_repository: {out} is not empty and was not made by this script")
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, MARKER), "w").close()
    for name, target in links.items():
        os.symlink(target, os.path.join(out, name))
    return links


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    for name, target in assemble(sys.argv[1], sys.argv[2], sys.argv[3:]).items():
        print(f"{name} -> {target}")
