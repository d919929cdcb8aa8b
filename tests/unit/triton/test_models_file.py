"""Models served by name: the flags and the models file read into ServedModel records, the
checks on their names, and their config.pbtxt parameters (rose_triton/models_file.py)."""
import json
import re

import pytest
import yaml

from engine_lib.config import EncoderConfig, PairTokenizerConfig, TokenizerConfig
from rose_triton.models_file import (
    ServedModel,
    check_models,
    model_configs,
    model_parameters,
    parse_flag,
    parse_models,
    read_models_file,
    to_document,
)
from rose_wire import EMBEDDER, RERANKER
from testing import REPO

DOCUMENT = {"embedders": {"e5": {"model_dir": "models/e5", "max_batch_tokens": 4096, "self_check": False,
                                 "query_prefix": "query: "}},
            "rerankers": {"judge": {"model_dir": "/abs/judge", "max_length": 512}}}


def test_json_and_yaml_read_the_same_models_with_folders_from_the_files_folder(tmp_path):
    (tmp_path / "models.json").write_text(json.dumps(DOCUMENT))
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(DOCUMENT))
    models = read_models_file(str(tmp_path / "models.json"))
    assert read_models_file(str(tmp_path / "models.yaml")) == models == [
        ServedModel("e5", EMBEDDER, str(tmp_path / "models" / "e5"),
                    {"max_batch_tokens": "4096", "self_check": "false", "query_prefix": "query: "}),
        ServedModel("judge", RERANKER, "/abs/judge", {"max_length": "512"})]
    assert parse_models(to_document(models), tmp_path) == models  # the assembler's served_models.json


@pytest.mark.parametrize("document, fragment", [
    ({"embedder": {}}, "unknown section(s) ['embedder']"),
    ({"embedders": ["e5"]}, "expected a mapping of model name"),
    ({"embedders": {"e5": "/models/e5"}}, "expected a mapping with model_dir"),
    ({"embedders": {"e5": {"dtype": "bfloat16"}}}, "model_dir (a model folder) is required"),
    ({"embedders": {"bad/name": {"model_dir": "x"}}}, "model name 'bad/name'"),
    ({"embedders": {"e5": {"model_dir": "x", "dtype": ["bfloat16"]}}}, "setting 'dtype' must be a string"),
])
def test_a_bad_models_file_is_refused_naming_the_problem(tmp_path, document, fragment):
    (tmp_path / "models.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match=re.escape(fragment)):
        read_models_file(str(tmp_path / "models.json"))


def test_flags_are_name_equals_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_flag("e5=models/e5", EMBEDDER) == ServedModel("e5", EMBEDDER, str(tmp_path / "models" / "e5"))
    with pytest.raises(ValueError, match=r"--rerank-model 'judge': expected NAME=DIR"):
        parse_flag("judge", RERANKER)


@pytest.mark.parametrize("names, fragment", [
    (["rose"], "'rose_encoder' clashes with the default models"),
    (["embed"], "'embed' clashes with the default models"),
    (["e5", "e5"], "clashes with model 'e5'"),
    (["a", "a_embed"], "'a_embed' clashes with model 'a'"),
    (["bge-m3", "bge.m3"], "share the environment prefix ROSE_MODEL_BGE_M3_"),
])
def test_names_whose_triton_models_or_environment_clash_are_refused(names, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        check_models([ServedModel(n, EMBEDDER, "/m") for n in names])


def test_settings_reach_the_models_that_read_them_and_nothing_else():
    model = ServedModel("e5", EMBEDDER, "/models/e5", {"max_batch_tokens": "4096", "query_prefix": "query: ",
                                                       "bls_timeout_s": "30", "max_length": "128"})
    params = model_parameters(model)
    assert params["ensemble"] == {}
    assert params["encoder"]["max_batch_tokens"] == "4096" and "query_prefix" not in params["encoder"]
    assert params["tokenizer"]["query_prefix"] == "query: " and params["tokenizer"]["max_length"] == "128"
    assert params["front"] == {"tokenizer_model": "e5_tokenizer", "encoder_model": "e5_encoder",
                               "bls_timeout_s": "30", "max_requests_in_flight": "128", "env_prefix": "ROSE_MODEL_E5_"}
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['task'\]"):  # set by the assembler only
        model_parameters(ServedModel("judge", RERANKER, "/r", {"task": "embed"}))


def test_the_environment_reaches_a_named_model_under_its_own_prefix_only():
    model = ServedModel("bge-m3", EMBEDDER, "/models/bge-m3", {"max_batch_tokens": "4096"})
    environ = {"ROSE_MODEL_DIR": "/elsewhere", "ROSE_MAX_BATCH_TOKENS": "999", "ROSE_QUERY_PREFIX": "default: ",
               "ROSE_MODEL_BGE_M3_MAX_BATCH_TOKENS": "2048"}
    configs = model_configs(model, environ)
    assert isinstance(configs["encoder"], EncoderConfig) and isinstance(configs["tokenizer"], TokenizerConfig)
    assert (configs["encoder"].model_dir, configs["encoder"].max_batch_tokens) == ("/models/bge-m3", 2048)
    assert (configs["tokenizer"].model_dir, configs["tokenizer"].query_prefix) == ("/models/bge-m3", "")
    reranker = model_configs(ServedModel("judge", RERANKER, "/r", {"max_length": "256"}), {})
    assert isinstance(reranker["tokenizer"], PairTokenizerConfig) and reranker["tokenizer"].max_length == 256
    assert reranker["encoder"].task == "score"


def test_the_readmes_models_file_reads_and_every_setting_is_known(tmp_path):
    section = (REPO / "README.md").read_text().split("## Several models, one launch", 1)[1]
    document = json.loads(re.search(r"```json\n(.*?)```", section, flags=re.S).group(1))
    models = parse_models(document, tmp_path)
    assert [(m.name, m.kind) for m in models] == [("qwen3-embedding", EMBEDDER), ("bge-m3", EMBEDDER),
                                                   ("bge-reranker", RERANKER)]
    check_models(models)
    for model in models:
        model_configs(model, {})
