"""rose_triton: error tags and codes survive any wrapping; config parameters and launcher overrides."""
from __future__ import annotations

import json

import pytest

from engine_lib.config import EncoderConfig, PairTokenizerConfig, TokenizerConfig
from engine_lib.errors import InputError, OverloadError, RequestCancelled
from rose_triton.errors import client_message, code_name, code_name_from_message
from rose_triton.parameters import (
    config_from_parameters,
    config_from_pbtxt,
    config_parameters,
    env_overrides,
    sibling_parameters,
)


@pytest.mark.parametrize("error, name", [(InputError("x"), "INVALID_ARG"), (OverloadError("x"), "UNAVAILABLE"),
                                         (RequestCancelled("x"), "CANCELLED"), (RuntimeError("x"), "INTERNAL")])
def test_error_messages_carry_their_code(error, name):
    assert code_name(error) == name
    wrapped = f"in ensemble 'ensemble', {client_message(error)}"
    assert code_name_from_message(wrapped) == (None if name == "INTERNAL" else name)


def test_tritons_own_queue_full_message_reads_as_unavailable():
    assert code_name_from_message("Exceeds maximum queue size") == "UNAVAILABLE"
    assert code_name_from_message("some other failure") is None


def test_launcher_environment_overrides_config_pbtxt():
    args = {"model_config": json.dumps({"parameters": {"max_batch_tokens": {"string_value": "512"},
                                                       "cuda_graphs": {"string_value": "off"}}})}
    params = config_parameters(args)
    assert params == {"max_batch_tokens": "512", "cuda_graphs": "off"}
    overrides = env_overrides(EncoderConfig, {"ROSE_MAX_BATCH_TOKENS": "1024", "ROSE_DEVICE": "",
                                              "ROSE_UNRELATED": "x"})
    assert overrides == {"max_batch_tokens": "1024"}
    config = EncoderConfig.from_parameters(params, **overrides)
    assert config.max_batch_tokens == 1024 and config.cuda_graphs == "off"


def test_another_models_config_pbtxt_parameters_and_their_env_prefix(tmp_path, monkeypatch):
    """What a unary front reads to tokenize as its tokenizer model does: the sibling folder's
    config.pbtxt parameters (escapes and comments as Triton reads them), then ROSE_* or the
    model's own env_prefix over them."""
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "config.pbtxt").write_text(
        'backend: "python"\n# a comment\nparameters [\n'
        '  { key: "query_prefix", value: { string_value: "query \\"q\\": caf\\303\\251\\n" } },\n'
        '  { key: "max_length", value: { string_value: "64" } }\n]\n')
    args = {"model_repository": str(tmp_path / "front") + "/"}
    params = sibling_parameters(args, "tok")
    assert params == {"query_prefix": 'query "q": café\n', "max_length": "64"}
    monkeypatch.setenv("ROSE_MAX_LENGTH", "32")
    monkeypatch.setenv("ROSE_RERANK_MAX_TEXT_BYTES", "99")
    config = config_from_parameters(TokenizerConfig, params)
    assert (config.query_prefix, config.max_length, config.max_text_bytes) == ('query "q": café\n', 32, 1 << 20)
    pair = config_from_parameters(PairTokenizerConfig, {"env_prefix": "ROSE_RERANK_", "max_length": "64"})
    assert (pair.max_length, pair.max_text_bytes) == (64, 99)
    with pytest.raises(FileNotFoundError, match="missing/config.pbtxt"):
        sibling_parameters(args, "missing")


def test_precedence_explicit_over_environment_over_config_pbtxt_over_default(tmp_path):
    """The one rule, as the gateway uses it: --model-dir > ROSE_MODEL_DIR > config.pbtxt > default;
    a model's env_prefix picks its variables (ROSE_RERANK_ for the reranker's)."""
    path = tmp_path / "config.pbtxt"
    path.write_text('parameters [ { key: "model_dir", value: { string_value: "from-pbtxt" } },\n'
                    '  { key: "max_length", value: { string_value: "64" } } ]\n')
    env = {"ROSE_MODEL_DIR": "from-env", "ROSE_RERANK_MODEL_DIR": "rerank-env"}
    assert config_from_pbtxt(TokenizerConfig, str(path), {}).model_dir == "from-pbtxt"
    assert config_from_pbtxt(TokenizerConfig, str(path), env).model_dir == "from-env"
    assert config_from_pbtxt(TokenizerConfig, str(path), env, model_dir="flag").model_dir == "flag"
    assert config_from_pbtxt(TokenizerConfig, str(path), env, model_dir=None).model_dir == "from-env"
    config = config_from_pbtxt(TokenizerConfig, str(path), {})
    assert (config.max_length, config.max_text_bytes) == (64, TokenizerConfig.max_text_bytes)
    path.write_text(path.read_text().replace("parameters [", 'parameters [ { key: "env_prefix", value: '
                                                                '{ string_value: "ROSE_RERANK_" } },'))
    assert config_from_pbtxt(PairTokenizerConfig, str(path), env).model_dir == "rerank-env"
