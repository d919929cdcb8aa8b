"""rose_triton: error tags and codes survive any wrapping; config parameters and launcher overrides."""
from __future__ import annotations

import json

import pytest

from engine_lib.config import EncoderConfig
from engine_lib.errors import InputError, OverloadError, RequestCancelled
from rose_triton.errors import client_message, code_name, code_name_from_message
from rose_triton.parameters import config_parameters, env_overrides


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
