"""ColBERT folders (PyLate's layout, testing/tiny_retrieval.py `save_colbert`) through the real tokenizer,
runner, service and endpoint against PyLate's encoding on the same weights (testing/pylate_reference.py,
transcribed from pylate/models/colbert.py): queries (prefix, [MASK] expansion to query_length, expansion
tokens masked from attention or attended), documents (prefix, punctuation skiplist), truncation, MaxSim."""
from __future__ import annotations

import numpy as np
import pytest

from engine_lib.config import TokenizerConfig
from engine_lib.contract import PackedBatch
from engine_lib.errors import InputError
from engine_lib.options import RequestOptions
from engine_lib.service.retrieval_outputs import split_multivector
from engine_lib.tokenization.colbert import ColbertTokenizer, text_tokenizer
from testing.pylate_reference import PylateColbert, colbert_scores
from testing.tiny_models import cosine_rows
from testing.tiny_retrieval import save_colbert
from tests.unit.models.test_retrieval_reference import _RUNNERS, serve

LONG = " ".join(["paris is the capital and largest city of france , paris !"] * 5)  # past both lengths
TEXTS = ["what is the capital of france ?", "paris is the capital and largest city of france , paris paris",
         "gravity", LONG, "hybrid retrieval mixes dense sparse and late interaction vectors ."]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("colbert")
    return {"masked": save_colbert(root / "masked"),
            "attended": save_colbert(root / "attended", attend_to_expansion_tokens=True)}


def encode(folder, is_query: bool, texts=TEXTS) -> list[np.ndarray]:
    options = RequestOptions(input_type="query" if is_query else "document", embedding_types=("multivector",))
    return split_multivector(serve(folder, options, texts))


def assert_same_vectors(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for vectors, reference in zip(got, want, strict=True):
        assert vectors.shape == reference.shape
        assert cosine_rows(vectors, reference).min() >= 0.999


@pytest.mark.parametrize("kind", ["masked", "attended"])
def test_queries_and_documents_match_pylate_token_for_token(folders, kind):
    reference = PylateColbert(folders[kind])
    for is_query in (True, False):
        assert_same_vectors(encode(folders[kind], is_query), reference.encode(TEXTS, is_query))


def test_a_query_is_expanded_to_query_length_and_a_document_drops_punctuation(folders):
    tokenizer = text_tokenizer(str(folders["masked"]), TokenizerConfig())
    assert isinstance(tokenizer, ColbertTokenizer)
    c = tokenizer.colbert
    query = tokenizer.encode(["gravity"], RequestOptions(input_type="query"))
    assert query.seq_lens.tolist() == [c.query_length]
    assert query.input_ids[1] == c.query_prefix_id and (query.input_ids[4:] == c.expansion_id).all()
    document = tokenizer.encode([TEXTS[0], LONG], RequestOptions())
    assert document.input_ids[1] == c.document_prefix_id and document.seq_lens[1] == c.document_length
    got = encode(folders["masked"], False, [TEXTS[0]])[0]
    assert len(got) == document.seq_lens[0] - 1  # "?" is in the skiplist
    with pytest.raises(InputError, match="more than the model's maximum"):
        tokenizer.encode([LONG], RequestOptions(input_type="query", truncate=False))


def test_queries_and_documents_in_one_batch_keep_their_own_rules(folders):
    """One step over queries and documents interleaved (the service packs requests of both kinds together)."""
    folder = folders["masked"]
    serve(folder, RequestOptions(input_type="query"), ["x"])  # builds the shared runner
    runner = _RUNNERS[folder]
    tokenizer = text_tokenizer(str(folder), TokenizerConfig())
    queries = tokenizer.encode(TEXTS[:2], RequestOptions(input_type="query"))
    documents = tokenizer.encode(TEXTS[:2], RequestOptions())
    split = lambda t: np.split(t.input_ids, np.cumsum(t.seq_lens)[:-1])
    (q0, q1), (d0, d1) = split(queries), split(documents)
    batch = PackedBatch.from_flat(np.concatenate([q0, d0, q1, d1]), [len(q0), len(d0), len(q1), len(d1)],
                                  queries=np.array([True, False, True, False]))
    rows = [row[0].multivector for row in runner.step(batch).wait()]
    reference = PylateColbert(folder)
    want_q, want_d = reference.encode(TEXTS[:2], True), reference.encode(TEXTS[:2], False)
    assert_same_vectors(rows, [want_q[0], want_d[0], want_q[1], want_d[1]])


def test_maxsim_of_served_vectors_matches_pylate_scores(folders):
    folder = folders["masked"]
    reference = PylateColbert(folder)
    query, documents = encode(folder, True, TEXTS[:1])[0], encode(folder, False, TEXTS[1:])
    want = colbert_scores(reference.encode(TEXTS[:1], True)[0], reference.encode(TEXTS[1:], False))
    from gateway.engine.retrieval_calls import late_interaction_scores

    got = late_interaction_scores({"multivector": [query, *documents]}, None, reduce="sum")
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_colbert_refuses_dense_sparse_and_chunking_naming_the_type(folders):
    for kind in ("float", "sparse"):
        with pytest.raises(InputError, match=rf"'{kind}' is not given by this model \(a colbert model"):
            serve(folders["masked"], RequestOptions(embedding_types=(kind,)))
    with pytest.raises(InputError, match="chunking"):
        text_tokenizer(str(folders["masked"]), TokenizerConfig()).encode_windows(["x"], RequestOptions())


def test_a_unary_front_asks_a_colbert_encoder_for_multivectors_when_the_client_names_nothing(folders):
    from engine_lib.service.outputs import default_outputs, requested_outputs
    from rose_wire import EMBEDDING_OUTPUTS, MULTIVECTOR, MULTIVECTOR_COUNTS, RAGGED_OUTPUTS

    declared = [*EMBEDDING_OUTPUTS, *RAGGED_OUTPUTS]
    default = default_outputs(str(folders["masked"]), declared)
    assert requested_outputs({}, declared, declared, default) == [MULTIVECTOR, MULTIVECTOR_COUNTS]
    assert requested_outputs({"embedding_types": "multivector_int8"}, declared, declared, default) != \
        [MULTIVECTOR, MULTIVECTOR_COUNTS]
