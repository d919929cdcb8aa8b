"""Hostile input against the real server, over HTTP and gRPC. Every case gets
an error or a correct answer (checked against sentence-transformers), each
call is bounded in time, and the server keeps serving. ROSE_FUZZ_EXAMPLES
raises the example count (random instead of the fixed CI examples)."""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from engine_lib.config import TokenizerConfig
from engine_lib.errors import InputError
from engine_lib.options import RequestOptions
from engine_lib.runner.self_check import MIN_COSINE
from engine_lib.tokenization.text import TextTokenizer
from testing.embed_clients import embed_generate, embed_stream, embed_unary_grpc, embed_unary_http
from testing.reliability_helpers import encode_ids
from testing.texts import VARIED_TEXTS

EXAMPLES = int(os.environ.get("ROSE_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize="ROSE_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CALL_SECONDS = 60  # client timeout of the stream and generate calls (a hang of the others: pytest's timeout)
DIM = 384
PATHS = {"stream": embed_stream, "unary_grpc": embed_unary_grpc, "unary_http": embed_unary_http,
         "generate": embed_generate}
CLIENT_ERRORS = (InferenceServerException, urllib.error.HTTPError)

TEXT_ITEMS = st.one_of(st.text(max_size=200), st.binary(max_size=100), st.sampled_from(VARIED_TEXTS),
                       st.just(" \t\n"), st.just("word " * 300))
OPTION_VALUES = st.one_of(st.booleans(), st.integers(-2 ** 40, 2 ** 40), st.integers(0, DIM + 2),
                          st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6),
                          st.sampled_from(["query", "document", "true", "FALSE", "0", "1", "12", "007", "٣"]))
HOSTILE_OPTIONS = st.dictionaries(st.sampled_from(["input_type", "truncate", "normalize", "dimensions", "bogus"]),
                                  OPTION_VALUES, max_size=3)
GOOD_OPTIONS = st.fixed_dictionaries({}, optional={
    "input_type": st.sampled_from(["query", "document"]), "truncate": st.booleans(),
    "normalize": st.booleans(), "dimensions": st.integers(0, DIM)})
GOOD_ITEMS = st.one_of(st.sampled_from(VARIED_TEXTS), st.text(min_size=1, max_size=200).filter(str.strip))
ITEMS = st.one_of(st.lists(GOOD_ITEMS, min_size=1, max_size=6), st.lists(TEXT_ITEMS, max_size=8))
OPTIONS = st.one_of(GOOD_OPTIONS, HOSTILE_OPTIONS)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return TextTokenizer(model_dir, TokenizerConfig())


@pytest.fixture(scope="module")
def pooled_model(reference_model):
    """The reference without its final Normalize module: pooled rows as normalize=false returns them."""
    from sentence_transformers import SentenceTransformer

    modules = [m for m in reference_model if type(m).__name__ != "Normalize"]
    return SentenceTransformer(modules=modules, device="cpu")


def expected_outcome(tokenizer, items, params):
    """(texts, options) when the contract says the request is valid, else None."""
    try:
        options = RequestOptions.from_parameters(json.dumps(params))
        if options.dimensions > DIM:
            return None
        texts = tokenizer.decode_texts(np.array(items + [None], dtype=object)[:-1])
        tokenizer.encode(texts, options)
    except InputError:
        return None
    return texts, options


def check_rows(rows, texts, options, pooled_model):
    reference = pooled_model.encode(texts)  # [N, 384], not normalised
    if options.dimensions:
        reference = reference[:, :options.dimensions]
    if options.normalize:
        reference = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    assert rows.shape == reference.shape and np.isfinite(rows).all()
    cosine = (rows * reference).sum(1) / np.linalg.norm(rows, axis=1) / np.linalg.norm(reference, axis=1)
    assert (cosine >= MIN_COSINE).all(), cosine
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), np.linalg.norm(reference, axis=1), rtol=1e-2)


def call(server, path, items, params):
    url = server.http_url if path in ("unary_http", "generate") else server.grpc_url
    try:
        if path == "stream":
            result = embed_stream(url, items, params, timeout=CALL_SECONDS)
        elif path == "generate":
            result = embed_generate(url, items, params, timeout=CALL_SECONDS)
        else:
            result = PATHS[path](url, items, params)
    except CLIENT_ERRORS as exc:
        result = exc
    return result


@FUZZ
@given(items=ITEMS, params=OPTIONS, path=st.sampled_from(sorted(PATHS)))
def test_random_requests_get_an_error_or_the_right_answer(server, pooled_model, tokenizer, items, params, path):
    if path == "generate":  # JSON carries text only
        items = [i.decode("utf-8", "replace") if isinstance(i, bytes) else i for i in items]
    expected = expected_outcome(tokenizer, items, params)
    event(f"{path}: {'valid' if expected else 'invalid'}")
    result = call(server, path, items, params)
    if expected is None:
        assert isinstance(result, CLIENT_ERRORS), f"{path} accepted an invalid request: {items!r} {params!r}"
    else:
        assert not isinstance(result, Exception), f"{path} refused a valid request: {result}"
        check_rows(result, *expected, pooled_model)


@FUZZ
@given(body=st.one_of(st.binary(max_size=200),
                      st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                                   lambda inner: st.lists(inner, max_size=4)
                                   | st.dictionaries(st.sampled_from(["TEXT", "parameters", "dimensions", "x"]),
                                                     inner, max_size=3),
                                   max_leaves=8).map(lambda v: json.dumps(v).encode())))
def test_malformed_generate_bodies_are_refused(server, body):
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/ensemble/generate", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=CALL_SECONDS) as response:
            reply = json.load(response)
        assert len(reply["EMBEDDINGS"]) % DIM == 0  # rare: a body that is a valid request
    except urllib.error.HTTPError as exc:
        error = json.loads(exc.read())["error"]
        # Triton 2.51 answers JSON it cannot parse or map with 500 before any model runs.
        assert exc.code == 400 or (exc.code == 500 and "in ensemble" not in error), (exc.code, error)


@FUZZ
@given(ids=st.lists(st.integers(-2 ** 40, 2 ** 40) | st.integers(0, 30521), max_size=40),
       lens=st.lists(st.integers(-3, 600), max_size=5))
def test_encoder_takes_valid_token_ids_and_refuses_the_rest(server, ids, lens):
    valid = (lens and all(n >= 1 for n in lens) and sum(lens) == len(ids) and max(lens) <= 512
             and all(0 <= i < 30522 for i in ids))
    rows, error = encode_ids(server.grpc_url, np.array(ids, dtype=np.int64), np.array(lens, dtype=np.int64))
    if valid:
        assert error is None and rows.shape == (len(lens), DIM) and np.isfinite(rows).all()
    else:
        assert error is not None and "invalid input" in str(error)


HUGE = [
    ("a text over max_text_bytes", ["x " * (1 << 19) + "y"], "at most 1048576"),
    ("more than max_texts_per_request", ["t"] * 4097, "at most 4096 per request"),
    ("more than max_request_bytes", ["z " * (400 << 10)] * 6, "split the request"),
]


@pytest.mark.parametrize("name, items, message", HUGE, ids=[h[0] for h in HUGE])
def test_oversized_requests_are_refused_before_the_encoder(server, name, items, message):
    with server.hold:  # the encoder computes nothing meanwhile (testing/hold.py): the refusal cannot wait for it
        for path in ("stream", "unary_http"):
            result = call(server, path, items, None)
            assert isinstance(result, CLIENT_ERRORS) and message in str(result), (path, result)


def test_a_megabyte_of_text_is_cut_and_embedded_like_its_start(server, pooled_model):
    text = (" ".join(VARIED_TEXTS) * 200).encode()[:1 << 20].decode(errors="ignore")  # cut, then truncated
    rows = embed_stream(server.grpc_url, [text])
    check_rows(rows, [text[:20_000]], RequestOptions(), pooled_model)


@pytest.mark.parametrize("datatype, array", [
    ("FP32", np.ones(3, dtype=np.float32)), ("INT64", np.arange(3, dtype=np.int64)),
    ("BYTES", np.array([[b"a", b"b"], [b"c", b"d"]], dtype=object)), ("BYTES", np.array([], dtype=object)),
])
def test_wrong_types_and_shapes_are_refused_on_both_protocols(server, datatype, array):
    for module, url in ((grpcclient, server.grpc_url), (httpclient, server.http_url)):
        client = module.InferenceServerClient(url)
        text = module.InferInput("TEXT", list(array.shape), datatype)
        text.set_data_from_numpy(array)
        with pytest.raises(InferenceServerException):
            client.infer("embed", [text])
        client.close()


def test_server_still_serves_after_the_fuzzing(server, pooled_model):
    assert server.is_ready()
    texts = ["after the storm", "calm again"]
    for path in sorted(PATHS):
        check_rows(call(server, path, texts, None), texts, RequestOptions(), pooled_model)
