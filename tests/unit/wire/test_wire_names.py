"""rose_wire's tensor and model names are the ones every shipped config.pbtxt declares."""
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

import rose_wire
from rose_wire.names import MODELS, TENSORS
from testing import REPO

CONFIGS = sorted([*REPO.glob("model_repository/*/config.pbtxt"), *REPO.glob("model_sets/*/*/config.pbtxt")])


def read(path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_every_name_is_exported_and_every_model_is_shipped():
    exported = [getattr(rose_wire, n) for n in rose_wire.__all__]
    assert {v for v in exported if isinstance(v, str)} >= {*MODELS, *TENSORS}
    assert set(rose_wire.OUTPUT_OF_TYPE.values()) == set(rose_wire.EMBEDDING_OUTPUTS) <= set(TENSORS)
    assert sorted(path.parent.name for path in CONFIGS) == sorted(MODELS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.parent.name)
def test_config_pbtxt_names_are_rose_wire_names(path):
    config = read(path)
    assert {t.name for t in [*config.input, *config.output]} <= set(TENSORS)
    for step in config.ensemble_scheduling.step:
        assert step.model_name in MODELS
        assert set(step.input_map) | set(step.output_map) <= set(TENSORS)  # the step model's own tensor names
    parameters = {k: v.string_value for k, v in config.parameters.items()}
    for key in ("tokenizer_model", "encoder_model"):  # the unary fronts' steps
        if key in parameters:
            assert parameters[key] in MODELS


def test_a_model_served_by_name_is_four_triton_models_named_after_it():
    assert rose_wire.served_models("bge-m3", rose_wire.EMBEDDER) == ("bge-m3", "bge-m3_embed", "bge-m3_tokenizer",
                                                                     "bge-m3_encoder")
    judge = rose_wire.served_models("judge", rose_wire.RERANKER)
    assert (judge.ensemble, judge.front, judge.tokenizer, judge.encoder) == ("judge", "judge_score", "judge_tokenizer",
                                                                             "judge_encoder")
    # the default models keep their names, in the same roles
    assert rose_wire.DEFAULT_EMBEDDER == ("ensemble", "embed", "tokenizer", "rose_encoder")
    assert rose_wire.DEFAULT_RERANKER == ("rerank", "score", "rerank_tokenizer", "rerank_encoder")
    with pytest.raises(ValueError, match="kind"):
        rose_wire.served_models("x", "classifier")
