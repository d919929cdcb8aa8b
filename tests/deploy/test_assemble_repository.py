"""The launcher's assembled repository: base models + a selected set, linked, never copied."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rose_triton.parameters import pbtxt_parameters, sibling_parameters
from rose_triton.server import REPO

sys.path.insert(0, str(REPO / "scripts"))
from assemble_repository import MARKER, assemble, model_folders  # noqa: E402

BASE, RERANK = REPO / "model_repository", REPO / "model_sets" / "rerank"


def test_rerank_set_beside_the_base(tmp_path):
    out = tmp_path / "repo"
    links = assemble(str(out), str(BASE), [str(RERANK)])
    assert sorted(links) == sorted(model_folders(str(BASE)) + model_folders(str(RERANK)))
    assert {"ensemble", "embed", "rerank", "score", "rerank_tokenizer", "rerank_encoder"} <= set(links)
    for name in links:
        assert os.path.isfile(out / name / "config.pbtxt")
    # One encoder implementation and one unary front serve both tasks: the same files.
    assert os.path.samefile(out / "rerank_encoder" / "1" / "model.py", BASE / "rose_encoder" / "1" / "model.py")
    assert os.path.samefile(out / "score" / "1" / "model.py", BASE / "embed" / "1" / "model.py")
    # Re-assembling the same folder replaces it.
    assert assemble(str(out), str(BASE), []) == {n: str(BASE / n) for n in model_folders(str(BASE))}
    assert not (out / "rerank").exists() and (out / MARKER).exists()


def test_refuses_name_clash_and_foreign_folders(tmp_path):
    with pytest.raises(SystemExit, match="'embed' is in both"):
        assemble(str(tmp_path / "a"), str(BASE), [str(BASE)])
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="not made by this script"):
        assemble(str(foreign), str(BASE), [])
    assert (foreign / "notes.txt").exists()


def test_every_ensemble_step_names_a_model_of_its_repository():
    for root in (BASE, RERANK):
        for name in model_folders(str(root)):
            text = (root / name / "config.pbtxt").read_text()
            for step in [line.split('"')[1] for line in text.splitlines() if "model_name:" in line]:
                assert step in model_folders(str(root)), f"{root.name}/{name} steps into {step!r}"


def test_unary_fronts_read_their_tokenizer_beside_them_in_any_layout(tmp_path):
    """`embed` and `score` tokenize with the settings of the model their `tokenizer_model`
    names, read from the folder beside theirs: in the base, the set and the assembled links."""
    out = tmp_path / "repo"
    assemble(str(out), str(BASE), [str(RERANK)])
    for root, front, tokenizer, encoder in ((BASE, "embed", "tokenizer", "rose_encoder"),
                                            (RERANK, "score", "rerank_tokenizer", "rerank_encoder")):
        params = pbtxt_parameters(str(root / front / "config.pbtxt"))
        assert (params["tokenizer_model"], params["encoder_model"]) == (tokenizer, encoder)
        expected = pbtxt_parameters(str(root / tokenizer / "config.pbtxt"))
        assert "model_dir" in expected
        for folder in (root / front, out / front, (out / front).resolve()):
            assert sibling_parameters({"model_repository": str(folder)}, tokenizer) == expected


def test_launcher_refuses_a_missing_reranker_folder(tmp_path):
    env = {**os.environ, "ROSE_SKIP_SETUP": "1", "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    (tmp_path / "tritonserver").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "tritonserver").chmod(0o755)
    run = subprocess.run([str(REPO / "scripts" / "serve.sh"), "--rerank-model-dir", str(tmp_path / "nothing")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "is not a model folder (no config.json)" in run.stderr
