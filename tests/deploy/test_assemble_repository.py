"""The launcher's assembled repository: base models + a selected set, linked, never copied; models
served by name written from the shipped configs (rose_triton/repository.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rose_triton.models_file import ServedModel, read_models_file
from rose_triton.parameters import pbtxt_parameters, read_model_config, sibling_parameters
from rose_triton.repository import MARKER, SERVED_MODELS, assemble, model_folders
from rose_triton.server import REPO
from rose_wire import DEFAULT_EMBEDDER, DEFAULT_RERANKER, EMBEDDER, RERANKER

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


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Two model folders (config.json is all the assembler looks at)."""
    root = tmp_path_factory.mktemp("folders")
    for name in ("embedder", "reranker"):
        (root / name).mkdir()
        (root / name / "config.json").write_text("{}")
    return root


def test_named_models_get_their_own_four_models_chained_by_name(tmp_path, folders):
    out = tmp_path / "repo"
    models = [ServedModel("bge-m3", EMBEDDER, str(folders / "embedder"), {"max_batch_tokens": "16384",
                                                                          "query_prefix": "query: "}),
              ServedModel("judge", RERANKER, str(folders / "reranker"), {"max_length": "512", "dtype": "float32"})]
    links = assemble(str(out), str(BASE), [], models)
    assert set(links) == set(model_folders(str(BASE))) | {
        "bge-m3", "bge-m3_embed", "bge-m3_tokenizer", "bge-m3_encoder", "judge", "judge_score", "judge_tokenizer",
        "judge_encoder"} == set(model_folders(str(out)))
    for model, template_root, template in ((models[0], BASE, DEFAULT_EMBEDDER), (models[1], RERANK, DEFAULT_RERANKER)):
        names = model.triton
        ensemble = read_model_config(str(out / names.ensemble / "config.pbtxt"))
        assert [step.model_name for step in ensemble.ensemble_scheduling.step] == [names.tokenizer, names.encoder]
        shipped = read_model_config(str(template_root / template.ensemble / "config.pbtxt"))
        assert ensemble.input == shipped.input and ensemble.output == shipped.output
        front = pbtxt_parameters(str(out / names.front / "config.pbtxt"))
        assert (front["tokenizer_model"], front["encoder_model"]) == (names.tokenizer, names.encoder)
        for role in ("tokenizer", "encoder"):
            params = pbtxt_parameters(str(out / getattr(names, role) / "config.pbtxt"))
            assert params["model_dir"] == model.model_dir and params["env_prefix"] == model.env_prefix
        for role in ("front", "tokenizer", "encoder"):  # the shipped code, linked
            assert os.path.samefile(out / getattr(names, role) / "1" / "model.py",
                                    template_root / getattr(template, role) / "1" / "model.py")
        # a front finds its tokenizer's settings beside it, as Triton will hand them over
        assert sibling_parameters({"model_repository": str(out / names.front)}, names.tokenizer) == \
            pbtxt_parameters(str(out / names.tokenizer / "config.pbtxt"))
    assert pbtxt_parameters(str(out / "bge-m3_encoder" / "config.pbtxt"))["max_batch_tokens"] == "16384"
    assert pbtxt_parameters(str(out / "bge-m3_tokenizer" / "config.pbtxt"))["query_prefix"] == "query: "
    assert pbtxt_parameters(str(out / "judge_tokenizer" / "config.pbtxt"))["max_length"] == "512"
    assert pbtxt_parameters(str(out / "judge_encoder" / "config.pbtxt"))["task"] == "score"
    assert pbtxt_parameters(str(out / "rose_encoder" / "config.pbtxt"))["max_batch_tokens"] == "8192"  # untouched
    assert read_models_file(str(out / SERVED_MODELS)) == models  # what the gateway and the watchdog read


@pytest.mark.parametrize("entry, fragment", [
    ({"model_dir": "embedder", "max_batch_tokenz": 1}, "unknown setting(s) ['max_batch_tokenz']; known:"),
    ({"model_dir": "embedder", "dtype": "float8"}, "'bad' (bad_encoder): dtype must be auto, float32"),
    ({"model_dir": "embedder", "bls_timeout_s": "soon"}, "'bad' (bad_embed): parameter bls_timeout_s"),
    ({"model_dir": "nothing"}, "is not a model folder (no config.json)"),
])
def test_bad_settings_and_folders_are_refused_before_anything_is_written(tmp_path, folders, entry, fragment):
    models = [ServedModel("bad", EMBEDDER, str(folders / entry["model_dir"]),
                          {k: str(v) for k, v in entry.items() if k != "model_dir"})]
    with pytest.raises(SystemExit) as caught:
        assemble(str(tmp_path / "repo"), str(BASE), [], models)
    assert fragment in str(caught.value) and not (tmp_path / "repo").exists()


def test_launcher_serves_named_models_and_refuses_a_bad_models_file(tmp_path, folders):
    """serve.sh assembles the repository with the named models and hands Triton, the watchdog
    and the gateway what they need (a stand-in tritonserver prints its arguments); a models
    file naming an unknown setting stops it before Triton starts."""
    path = f"{tmp_path}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}"  # python3: the image's has the packages
    env = {**os.environ, "ROSE_SKIP_SETUP": "1", "ROSE_WATCHDOG": "0", "PATH": path, "TMPDIR": str(tmp_path)}
    (tmp_path / "tritonserver").write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = --model-repository ] '
                                           '&& ls -A "$2"; shift; done\n')
    (tmp_path / "tritonserver").chmod(0o755)
    good = tmp_path / "models.json"
    good.write_text(json.dumps({"embedders": {"e5": {"model_dir": str(folders / "embedder")}}}))
    run = subprocess.run([str(REPO / "scripts" / "serve.sh"), "--no-gateway", "--models-file", str(good),
                          "--rerank-model", f"judge={folders / 'reranker'}"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert {"ensemble", "e5", "e5_embed", "e5_tokenizer", "e5_encoder", "judge", "judge_score", SERVED_MODELS} <= \
        set(run.stdout.split())
    assert "embedder 'e5' from" in run.stderr and "reranker 'judge' from" in run.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"embedders": {"e5": {"model_dir": str(folders / "embedder"), "batch": 3}}}))
    run = subprocess.run([str(REPO / "scripts" / "serve.sh"), "--no-gateway", "--models-file", str(bad)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "unknown setting(s) ['batch']" in run.stderr and "ensemble" not in run.stdout
