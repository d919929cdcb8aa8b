"""Each shipped config.pbtxt agrees with the code: its parameters parse through the model's
config dataclass, a value that repeats a dataclass default equals it (only the deviations
listed here are meant), and the models that work together (tokenizer, encoder, unary
front, ensemble) agree on the folder, the environment prefix and the tensors they pass."""
from __future__ import annotations

import dataclasses
import os

import pytest

from engine_lib.config import EncoderConfig
from engine_lib.tokenization.steps import step_for_inputs
from gateway.config import GatewayConfig
from rose_triton.front import FrontConfig
from rose_triton.parameters import DEFAULT_ENV_PREFIX, pbtxt_parameters, read_model_config
from rose_triton.server import REPO

ROOTS = {"model_repository": REPO / "model_repository", "rerank": REPO / "model_sets" / "rerank"}
ENV_PREFIX = {"model_repository": DEFAULT_ENV_PREFIX, "rerank": "ROSE_RERANK_"}
FRONT_PARAMETERS = {"tokenizer_model", "encoder_model", "bls_timeout_s", "max_requests_in_flight"}
# Parameters meant to differ from the dataclass default, and why.
DEVIATIONS = {
    ("rerank", "rerank_encoder", "task"): "score",  # scores pairs instead of pooling
    ("rerank", "rerank_encoder", "model_dir"): "unset: serve with --rerank-model-dir",  # no embedded reranker
    ("rerank", "rerank_tokenizer", "model_dir"): "unset: serve with --rerank-model-dir",
}
MODELS = [(root, name) for root, folder in ROOTS.items() for name in sorted(os.listdir(folder))
          if (folder / name / "config.pbtxt").is_file()]


def folder(root: str, name: str):
    return ROOTS[root] / name


def kind(root: str, name: str) -> str:
    """What runs the model: the base model whose model.py it is (sets link to the base's), or ensemble."""
    config = read_model_config(str(folder(root, name) / "config.pbtxt"))
    if config.platform == "ensemble":
        return "ensemble"
    code = os.path.realpath(folder(root, name) / "1" / "model.py")
    for base in ("rose_encoder", "tokenizer", "embed", "embed_batched"):
        if os.path.samefile(code, ROOTS["model_repository"] / base / "1" / "model.py"):
            return base
    raise AssertionError(f"{root}/{name}: model.py is none of the base models' ({code})")


def config_cls(root: str, name: str):
    if kind(root, name) == "rose_encoder":
        return EncoderConfig
    inputs = [i.name for i in read_model_config(str(folder(root, name) / "config.pbtxt")).input]
    return step_for_inputs(inputs).config_cls


def tensors(specs) -> dict[str, tuple]:
    return {t.name: (t.data_type, list(t.dims), getattr(t, "optional", False)) for t in specs}


def test_every_model_folder_is_known():
    assert {kind(r, n) for r, n in MODELS} == {"ensemble", "rose_encoder", "tokenizer", "embed", "embed_batched"}
    assert len(MODELS) == 9


@pytest.mark.parametrize("root, name", [(r, n) for r, n in MODELS if kind(r, n) in ("rose_encoder", "tokenizer")])
def test_parameters_parse_and_repeat_the_defaults_in_code(root, name):
    params = pbtxt_parameters(str(folder(root, name) / "config.pbtxt"))
    assert params.pop("env_prefix", DEFAULT_ENV_PREFIX) == ENV_PREFIX[root]
    cls = config_cls(root, name)
    config = cls.from_parameters(params)  # no environment: the file alone
    defaults = cls()
    for parameter in params:
        value, default = getattr(config, parameter), getattr(defaults, parameter)
        if (root, name, parameter) in DEVIATIONS:
            assert params[parameter] == DEVIATIONS[root, name, parameter] and value != default
        else:
            assert value == default, (f"{root}/{name}/config.pbtxt sets {parameter}={params[parameter]!r}; "
                                      f"the default in {cls.__name__} is {default!r}")


def test_listed_deviations_exist():
    for root, name, parameter in DEVIATIONS:
        assert parameter in pbtxt_parameters(str(folder(root, name) / "config.pbtxt"))


def test_the_encoders_list_the_same_engine_settings():
    """rerank_encoder sets everything rose_encoder sets (a new engine setting is added to both)."""
    base = set(pbtxt_parameters(str(folder("model_repository", "rose_encoder") / "config.pbtxt")))
    rerank = set(pbtxt_parameters(str(folder("rerank", "rerank_encoder") / "config.pbtxt")))
    assert base - rerank <= {"self_check", "cache_dir"} and rerank - base == {"env_prefix", "task"}  # cache_dir: int8 calibration
    assert {f.name for f in dataclasses.fields(EncoderConfig)} >= base


@pytest.mark.parametrize("root", ROOTS)
def test_each_set_pairs_one_tokenizer_with_one_encoder(root):
    """The ensemble and the unary front of a set name the same tokenizer and encoder; those two
    read the same model folder under the same environment prefix, and the tensors line up."""
    (ensemble,) = [n for r, n in MODELS if r == root and kind(r, n) == "ensemble"]
    (front,) = [n for r, n in MODELS if r == root and kind(r, n) == "embed"]
    steps = [s.model_name for s in read_model_config(str(folder(root, ensemble) / "config.pbtxt"))
             .ensemble_scheduling.step]
    params = pbtxt_parameters(str(folder(root, front) / "config.pbtxt"))
    assert set(params) == FRONT_PARAMETERS
    assert FrontConfig.from_parameters(params).bls_timeout_s == FrontConfig.bls_timeout_s
    tokenizer, encoder = params["tokenizer_model"], params["encoder_model"]
    assert steps == [tokenizer, encoder]
    assert (kind(root, tokenizer), kind(root, encoder)) == ("tokenizer", "rose_encoder")

    tokenizer_params = pbtxt_parameters(str(folder(root, tokenizer) / "config.pbtxt"))
    encoder_params = pbtxt_parameters(str(folder(root, encoder) / "config.pbtxt"))
    for shared in ("model_dir", "env_prefix"):
        assert tokenizer_params.get(shared) == encoder_params.get(shared), shared

    configs = {n: read_model_config(str(folder(root, n) / "config.pbtxt")) for n in (front, ensemble, tokenizer, encoder)}
    for entry in (front, ensemble):
        assert tensors(configs[entry].input) == tensors(configs[tokenizer].input)
        assert tensors(configs[entry].output) == tensors(configs[encoder].output)
    produced = tensors(configs[tokenizer].output)
    for name, (dtype, dims, optional) in tensors(configs[encoder].input).items():
        assert optional or name in produced, f"{encoder} needs {name}, which {tokenizer} does not produce"
        if name in produced:
            assert produced[name][:2] == (dtype, dims)


def test_the_gateway_reads_the_tokenizer_models_it_stands_in_for():
    assert GatewayConfig.tokenizer_config == str(folder("model_repository", "tokenizer") / "config.pbtxt")
    assert GatewayConfig.rerank_tokenizer_config == str(folder("rerank", "rerank_tokenizer") / "config.pbtxt")


def test_the_batched_front_chains_the_unary_fronts_models_and_gives_their_row_outputs():
    """embed_batched reads the tokenizer and encoder the unary front names, takes one text per batch
    row and gives the encoder's row outputs per row (rose_triton/batched.py ROW_OUTPUTS)."""
    from rose_triton.batched import ROW_OUTPUTS

    root = "model_repository"
    front, batched = (read_model_config(str(folder(root, n) / "config.pbtxt")) for n in ("embed", "embed_batched"))
    unary = pbtxt_parameters(str(folder(root, "embed") / "config.pbtxt"))
    unary.pop("max_requests_in_flight")  # the unary front's AnswerLoop; the batched front waits in execute
    assert pbtxt_parameters(str(folder(root, "embed_batched") / "config.pbtxt")) == unary
    assert batched.max_batch_size > 0 and front.max_batch_size == 0 and batched.HasField("dynamic_batching")
    assert tensors(batched.input) == {"TEXT": (front.input[0].data_type, [1], False)}
    encoder = tensors(read_model_config(str(folder(root, "rose_encoder") / "config.pbtxt")).output)
    assert list(tensors(batched.output)) == list(ROW_OUTPUTS)
    for name, (dtype, dims, _) in tensors(batched.output).items():
        assert (dtype, [-1]) == (encoder[name][0], encoder[name][1][1:])  # the encoder's [N, D] as rows of [D]
