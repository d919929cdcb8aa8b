"""The tokenize steps the tokenizer models and the unary fronts share: ids as the model's own
tokenizer gives them, request options applied, bad input refused with a named InputError."""
from __future__ import annotations

import json
import os
import re
import threading

import numpy as np
import pytest
from tokenizers import Tokenizer

from engine_lib import faults
from engine_lib.config import PairTokenizerConfig, TokenizerConfig
from engine_lib.errors import InputError
from engine_lib.tokenization.steps import PairStep, TextStep, step_for_inputs
from rose_triton.faults import entered_file, gate_file
from testing.hold import held_in_process
from testing.tiny_rerankers import save_reranker
from testing.waiting import wait_until

TEXTS = ["the first text", "a second, longer text about tokenizers"]


def unpadded(path):
    tokenizer = Tokenizer.from_file(path)
    tokenizer.no_padding()
    return tokenizer


def as_bytes(items):
    return np.array([t.encode() if isinstance(t, str) else t for t in items], dtype=object)


@pytest.fixture(scope="module")
def text_step(model_dir):
    return TextStep(TokenizerConfig(model_dir=model_dir, query_prefix="query: ", document_prefix="passage: "))


@pytest.fixture(scope="module")
def reference_tokenizer(model_dir):
    return unpadded(os.path.join(model_dir, "tokenizer.json"))


@pytest.mark.parametrize("input_type, prefix", [("query", "query: "), ("document", "passage: ")])
def test_text_step_gives_the_folder_tokenizers_ids_with_the_configured_prefix(text_step, reference_tokenizer,
                                                                              input_type, prefix):
    out = text_step({"TEXT": as_bytes(TEXTS)}, json.dumps({"input_type": input_type, "normalize": False}))
    expected = [reference_tokenizer.encode(prefix + t).ids for t in TEXTS]
    assert set(out) == {"INPUT_IDS", "SEQ_LENS", "TEXT_WINDOWS"} and out["TEXT_WINDOWS"].size == 0  # no chunking
    assert out["SEQ_LENS"].dtype == np.int64 and out["SEQ_LENS"].tolist() == [len(e) for e in expected]
    assert out["INPUT_IDS"].tolist() == [i for e in expected for i in e]


@pytest.mark.parametrize("texts, params, message, field", [
    ([""], None, "TEXT[0] is empty", "TEXT"),
    ([b"\xc3\x28"], None, "TEXT[0] is not valid UTF-8", "TEXT"),
    (["x"], {"input_type": "passage"}, "input_type", "input_type"),
    (["x"], {"truncate": "maybe"}, "'truncate' must be a boolean", "truncate"),
    (["x"], {"normalise": False}, "unknown request parameter", "normalise"),
    (["word " * 400], {"truncate": False}, "more than the model's maximum", "TEXT"),
])
def test_text_step_refuses_bad_input_by_name(text_step, texts, params, message, field):
    with pytest.raises(InputError, match=re.escape(message)) as refused:
        text_step({"TEXT": as_bytes(texts)}, json.dumps(params) if params else "")
    assert refused.value.field == field


def test_missing_input_is_named(text_step):
    with pytest.raises(InputError, match="input TEXT is missing") as refused:
        text_step({"TEXT": None}, None)
    assert refused.value.field == "TEXT"


def test_many_requests_in_one_call_give_what_each_gives_alone(text_step):
    """`many` (the tokenizer lane's group) answers each request as a call of its own would:
    its ids with its options, chunked windows, or its own InputError."""
    requests = [({"TEXT": as_bytes(TEXTS)}, json.dumps({"input_type": "query"})),
                ({"TEXT": as_bytes([""])}, None),
                ({"TEXT": as_bytes(["word " * 400])}, json.dumps({"chunking": "mean"})),
                ({"TEXT": as_bytes(TEXTS[::-1])}, None),
                ({"TEXT": as_bytes(["word " * 400])}, json.dumps({"truncate": False}))]
    grouped = text_step.many(requests)
    assert len(grouped) == len(requests)
    for (tensors, params), result in zip(requests, grouped):
        try:
            alone = text_step(tensors, params)
        except InputError as exc:
            assert isinstance(result, InputError) and str(result) == str(exc)
            continue
        assert set(result) == set(alone)
        for name in alone:
            np.testing.assert_array_equal(result[name], alone[name], err_msg=name)
    assert grouped[2]["TEXT_WINDOWS"].tolist()[0] > 1  # the chunked one was windowed


@pytest.fixture(scope="module")
def reranker_folders(tmp_path_factory):
    out = {}
    for kind in ("bert", "qwen3"):
        out[kind] = str(tmp_path_factory.mktemp(kind))
        save_reranker(kind, out[kind])
    return out


def test_pair_step_gives_the_pair_template_and_segments(reranker_folders):
    folder = reranker_folders["bert"]
    step = PairStep(PairTokenizerConfig(model_dir=folder))
    documents = ["paris is the capital", "berlin is a city"]
    out = step({"QUERY": as_bytes(["capital of france"]), "DOCUMENTS": as_bytes(documents)}, "{}")
    expected = unpadded(os.path.join(folder, "tokenizer.json")).encode_batch(
        [("capital of france", d) for d in documents])
    assert out["SEQ_LENS"].tolist() == [len(e.ids) for e in expected]
    assert out["INPUT_IDS"].tolist() == [i for e in expected for i in e.ids]
    assert out["TOKEN_TYPE_IDS"].tolist() == [t for e in expected for t in e.type_ids]
    assert 1 in out["TOKEN_TYPE_IDS"]


def test_pair_step_without_segments_sends_empty_token_types_and_refuses_by_name(reranker_folders):
    step = PairStep(PairTokenizerConfig(model_dir=reranker_folders["qwen3"]))
    out = step({"QUERY": as_bytes(["q"]), "DOCUMENTS": as_bytes(["d one", "d two"])}, None)
    assert out["TOKEN_TYPE_IDS"].size == 0 and out["SEQ_LENS"].size == 2
    with pytest.raises(InputError, match="DOCUMENTS\\[1\\] is empty"):
        step({"QUERY": as_bytes(["q"]), "DOCUMENTS": as_bytes(["d", " "])}, None)
    with pytest.raises(InputError, match="unknown request parameter"):
        step({"QUERY": as_bytes(["q"]), "DOCUMENTS": as_bytes(["d"])}, {"normalize": False})


def test_step_is_chosen_by_the_fronts_inputs():
    assert step_for_inputs(["TEXT"]) is TextStep
    assert step_for_inputs(["DOCUMENTS", "QUERY"]) is PairStep
    with pytest.raises(ValueError, match="no tokenize step takes inputs \\['INPUT_IDS'\\]"):
        step_for_inputs(["INPUT_IDS"])


def test_the_test_hold_keeps_a_request_before_tokenizing_until_released(model_dir, tmp_path):
    step = TextStep(TokenizerConfig(model_dir=model_dir))
    with held_in_process(tmp_path):
        assert step({"TEXT": as_bytes(TEXTS)}, None)["SEQ_LENS"].shape == (2,)  # no file: no hold
        hold = gate_file(tmp_path, faults.TOKENIZE)
        hold.touch()
        results = []
        worker = threading.Thread(target=lambda: results.append(step({"TEXT": as_bytes(TEXTS)}, None)), daemon=True)
        worker.start()
        wait_until(entered_file(tmp_path, faults.TOKENIZE).exists, 60, "the request to enter the hold")
        assert not results and worker.is_alive()
        hold.unlink()
        worker.join(60)
    assert len(results) == 1 and results[0]["SEQ_LENS"].shape == (2,)
