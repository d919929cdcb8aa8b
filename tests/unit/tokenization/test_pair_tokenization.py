"""PairTokenizer edge cases and score activations (the reference comparisons are in test_rerank_models.py)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from engine_lib.config import PairTokenizerConfig
from engine_lib.errors import InputError
from engine_lib.options import RerankOptions
from engine_lib.tokenization.pairs import PairTokenizer
from testing.tiny_rerankers import save_reranker

QUERY = "what is the capital of france"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for kind in ("bert", "xlm-roberta", "qwen3"):
        out[kind] = str(tmp_path_factory.mktemp(kind))
        save_reranker(kind, out[kind])
    return out


def test_decode_names_the_bad_item(folders):
    tok = PairTokenizer(folders["bert"], PairTokenizerConfig())
    as_bytes = lambda items: np.array(items, dtype=object)
    with pytest.raises(InputError, match="DOCUMENTS is empty"):
        tok.decode(as_bytes([b"q"]), as_bytes([]))
    with pytest.raises(InputError, match=r"DOCUMENTS\[1\] is not valid UTF-8") as refused:
        tok.decode(as_bytes([b"q"]), as_bytes([b"ok", b"\xff"]))
    assert refused.value.field == "DOCUMENTS"
    with pytest.raises(InputError, match="QUERY must hold exactly one text") as refused:
        tok.decode(as_bytes([b"a", b"b"]), as_bytes([b"ok"]))
    assert refused.value.field == "QUERY"
    with pytest.raises(InputError, match=r"QUERY\[0\] is empty"):
        tok.decode(as_bytes([b" "]), as_bytes([b"ok"]))
    assert tok.decode(as_bytes([b"q"]), as_bytes([b"a", b"b"])) == ("q", ["a", "b"])


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta", "qwen3"])
def test_truncation_keeps_the_query_and_refusal_names_the_document(folders, kind):
    limit = 100 if kind == "qwen3" else 24
    tok = PairTokenizer(folders[kind], PairTokenizerConfig(max_length=limit))
    docs = ["paris", "the eiffel tower stands in paris " * 20, "berlin"]
    tokens = tok.encode(QUERY, docs, RerankOptions())
    ids, lens = tokens.input_ids, tokens.seq_lens
    assert lens[1] == limit and lens[0] < limit and lens[2] < limit
    full_short = tok.encode(QUERY, ["paris"], RerankOptions()).input_ids
    long_pair = ids[lens[0]:lens[0] + lens[1]]
    prefix = len(full_short) - (len(tok.suffix) if kind == "qwen3" else 1) - 1  # up to the document's first token
    assert long_pair[:prefix].tolist() == full_short[:prefix].tolist()  # template + whole query kept
    with pytest.raises(InputError, match=rf"DOCUMENTS\[1\] with the query is \d+ tokens, more than the model's "
                                         rf"maximum of {limit}, and truncate=false"):
        tok.encode(QUERY, docs, RerankOptions(truncate=False))
    with pytest.raises(InputError, match="QUERY leaves no room"):
        tok.encode("what " * 80, docs, RerankOptions())


def test_instruction_only_for_models_that_take_one(folders):
    options = RerankOptions(instruction="Judge relevance")
    for kind in ("bert", "xlm-roberta"):
        with pytest.raises(InputError, match="takes no instruction"):
            PairTokenizer(folders[kind], PairTokenizerConfig()).encode(QUERY, ["paris"], options)
    judge = PairTokenizer(folders["qwen3"], PairTokenizerConfig())
    assert judge.encode(QUERY, ["paris"], options).input_ids.tolist() != judge.encode(QUERY, ["paris"], RerankOptions()).input_ids.tolist()


def test_segment_ids_only_where_the_family_has_them(folders):
    for kind, segments in (("bert", True), ("xlm-roberta", False), ("qwen3", False)):
        tokens = PairTokenizer(folders[kind], PairTokenizerConfig()).encode(QUERY, ["paris"], RerankOptions())
        ids, types = tokens.input_ids, tokens.token_types
        assert (types.size == ids.size) if segments else types is None, kind


def test_xlm_roberta_pairs_fit_its_positions(folders):
    assert PairTokenizer(folders["xlm-roberta"], PairTokenizerConfig()).max_length == 128  # 130 positions - offset 2


def test_identity_activation_from_config_matches_cross_encoder(tmp_path):
    """A folder whose config.json names Identity (as sentence-transformers saves it): raw logits, as CrossEncoder."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import CrossEncoder

    from engine_lib.contract import PackedBatch
    from engine_lib.runner.model_runner import ModelRunner
    from engine_lib.service.outputs import ScoreOutput

    save_reranker("bert", tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["sentence_transformers"] = {"activation_fn": "torch.nn.modules.linear.Identity"}
    path.write_text(json.dumps(config))
    docs = ["paris is the capital", "berlin"]
    tokens = PairTokenizer(str(tmp_path), PairTokenizerConfig()).encode(QUERY, docs, RerankOptions())
    ids, lens, types = tokens.input_ids, tokens.seq_lens, tokens.token_types
    bounds = np.concatenate([[0], np.cumsum(lens)])
    split = lambda flat: [flat[bounds[i]:bounds[i + 1]] for i in range(len(lens))]
    engine = ModelRunner(str(tmp_path), device="cpu", task="score")
    assert engine.score_activation == "identity"
    rows = engine.step(PackedBatch.from_sequences(split(ids), split(types))).wait()
    output = ScoreOutput(engine.score_activation)
    scores = output.finish(rows, RerankOptions())
    np.testing.assert_array_equal(scores, output.finish(rows, RerankOptions(raw_scores=True)))
    expected = CrossEncoder(str(tmp_path), device="cpu").predict([(QUERY, d) for d in docs])
    assert np.abs(scores - expected).max() < 1e-3
