"""Config: config.pbtxt strings -> validated frozen dataclasses; one boolean reader for
config parameters and request options."""
from __future__ import annotations

import pytest

from engine_lib.config import AUTO, EncoderConfig, TokenizerConfig, parse_bool
from engine_lib.errors import InputError
from engine_lib.options import RequestOptions


@pytest.mark.parametrize("raw, value", [("true", True), ("ON", True), (" yes ", True), ("1", True), (True, True),
                                        ("false", False), ("Off", False), ("no", False), ("0", False), (False, False)])
def test_parse_bool_reads_the_usual_spellings(raw, value):
    assert parse_bool(raw) is value


@pytest.mark.parametrize("raw", ["", "2", "maybe", None, 1, 0.0])
def test_parse_bool_refuses_anything_else(raw):
    with pytest.raises(ValueError, match="expected true/false"):
        parse_bool(raw)


def test_request_options_and_config_read_booleans_alike():
    assert RequestOptions.from_parameters({"truncate": "off", "normalize": "YES"}) == \
        RequestOptions(truncate=False, normalize=True)
    with pytest.raises(InputError, match="'normalize' must be a boolean"):
        RequestOptions.from_parameters({"normalize": "maybe"})


def test_parameters_convert_by_field_type_and_overrides_win():
    config = EncoderConfig.from_parameters({"max_batch_tokens": "512", "device": "cpu"}, max_batch_tokens="1024")
    assert config.max_batch_tokens == 1024 and config.device == "cpu"
    assert EncoderConfig.from_parameters({"max_batch_class_tokens": "auto"}).max_batch_class_tokens == AUTO
    assert EncoderConfig.from_parameters({"max_batch_class_tokens": "512"}).max_batch_class_tokens == 512
    assert EncoderConfig.from_parameters({"max_backfill_tokens": "auto"}).max_backfill_tokens == AUTO
    assert EncoderConfig.from_parameters({"max_backfill_tokens": "0"}).max_backfill_tokens == 0


@pytest.mark.parametrize("params, message", [
    ({"max_batch_tokenz": "1"}, r"unknown parameter\(s\) \['max_batch_tokenz'\]"),
    ({"max_batch_tokens": "many"}, "parameter max_batch_tokens"),
    ({"max_batch_tokens": "0"}, "max_batch_tokens must be >= 1"),
    ({"max_batch_class_tokens": "0"}, r"max_batch_class_tokens must be >= 1 \(or auto\)"),
    ({"max_backfill_tokens": "-3"}, r"max_backfill_tokens must be >= 0 \(or auto\)"),
    ({"max_cpu_step_ms": "-1"}, r"max_cpu_step_ms must be >= 0"),
    ({"device": "tpu"}, "device must be auto, cpu, cuda or cuda:N"),
    ({"cuda_graphs": "sometimes"}, "cuda_graphs must be auto, on or off"),
    ({"max_graph_tokens": "32"}, "max_graph_tokens must be >= 64"),
])
def test_encoder_config_errors_name_the_parameter(params, message):
    with pytest.raises(ValueError, match=message):
        EncoderConfig.from_parameters(params)


def test_tokenizer_limits_must_be_positive():
    with pytest.raises(ValueError, match="max_texts_per_request"):
        TokenizerConfig.from_parameters({"max_texts_per_request": "0"})
