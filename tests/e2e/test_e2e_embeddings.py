"""End to end on a real tritonserver: accuracy, three call paths, batching invariance, concurrency."""
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from engine_lib.runner.self_check import MIN_COSINE
from rose_wire import EMBED, ROSE_ENCODER
from testing.embed_clients import embed_generate, embed_stream, embed_unary_grpc, embed_unary_http
from testing.hold import wait_for_metric
from testing.texts import VARIED_TEXTS
from testing.waiting import wait_until

WAYS = {
    "grpc_stream_ensemble": lambda server, texts, params=None: embed_stream(server.grpc_url, texts, params),
    "http_generate_ensemble": lambda server, texts, params=None: embed_generate(server.http_url, texts, params),
    "grpc_unary_embed": lambda server, texts, params=None: embed_unary_grpc(server.grpc_url, texts, params),
    "http_unary_embed": lambda server, texts, params=None: embed_unary_http(server.http_url, texts, params),
}


@pytest.fixture(scope="module")
def reference(reference_model):
    return dict(zip(VARIED_TEXTS, reference_model.encode(VARIED_TEXTS, normalize_embeddings=True)))


def cosines(rows, refs):
    rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return (rows * refs).sum(axis=1)


@pytest.mark.parametrize("way", WAYS)
def test_varied_texts_match_reference(server, reference, way):
    assert len(VARIED_TEXTS) >= 50
    rows = WAYS[way](server, VARIED_TEXTS)
    assert rows.shape == (len(VARIED_TEXTS), 384) and rows.dtype == np.float32
    cos = cosines(rows, np.stack([reference[t] for t in VARIED_TEXTS]))
    assert cos.min() >= MIN_COSINE, {VARIED_TEXTS[i][:30]: float(c) for i, c in enumerate(cos) if c < MIN_COSINE}
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-5)


def test_all_ways_return_the_same_numbers(server):
    texts = VARIED_TEXTS[:12]
    results = {way: call(server, texts) for way, call in WAYS.items()}
    first = results.pop("grpc_stream_ensemble")
    for way, rows in results.items():
        np.testing.assert_allclose(rows, first, atol=1e-6, err_msg=way)


def test_options_reach_the_encoder(server, reference):
    texts = VARIED_TEXTS[:4]
    raw = WAYS["grpc_unary_embed"](server, texts, {"normalize": False})
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    short = WAYS["grpc_stream_ensemble"](server, texts, {"dimensions": 64})
    assert short.shape == (4, 64)
    expected = raw[:, :64] / np.linalg.norm(raw[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, atol=1e-5)


def test_batched_equals_alone_under_concurrent_load(server):
    rng = random.Random(7)
    targets = [VARIED_TEXTS[i] for i in (0, 8, 13, 33, -1)]
    alone = {t: embed_stream(server.grpc_url, [t])[0] for t in targets}
    mixed = [rng.choice(VARIED_TEXTS) for _ in range(60)] + targets
    rng.shuffle(mixed)

    def noise(seed):
        local = random.Random(seed)
        for _ in range(3):
            embed_stream(server.grpc_url, local.sample(VARIED_TEXTS, local.randint(1, 30)))

    with ThreadPoolExecutor(4) as pool:
        background = [pool.submit(noise, s) for s in range(4)]
        batched = embed_stream(server.grpc_url, mixed)
        for f in background:
            f.result()
    for target in targets:
        row = batched[mixed.index(target)]
        assert float(row @ alone[target]) >= 0.9999, target[:40]


def test_sixteen_concurrent_clients_nothing_lost_or_crossed(server, reference):
    pool_texts = VARIED_TEXTS

    def client(seed):
        rng = random.Random(seed)
        call = list(WAYS.values())[seed % len(WAYS)]
        for _ in range(2):  # 32 requests of 1-32 texts, all clients in flight together
            texts = [rng.choice(pool_texts) for _ in range(rng.randint(1, 32))]
            rows = call(server, texts)
            assert rows.shape == (len(texts), 384), (seed, rows.shape)
            cos = cosines(rows, np.stack([reference[t] for t in texts]))
            assert cos.min() >= MIN_COSINE, (seed, float(cos.min()))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(client, range(16)))  # each client asserts its own rows; map re-raises a failure


@pytest.mark.parametrize("params", [{"input_type": "query", "dimensions": 96, "normalize": False},
                                    {"input_type": "document", "truncate": True, "normalize": False},
                                    {"priority_class": "batch", "normalize": False}])
def test_unary_front_equals_the_ensemble_stream_with_options(server, params):
    """The unary front tokenizes in its own process and calls the encoder itself: the same
    numbers as the ensemble (tokenizer model -> encoder) for the same options."""
    texts = VARIED_TEXTS[:6] + [VARIED_TEXTS[-1] * 8]  # the last one is cut at the model's maximum
    streamed = WAYS["grpc_stream_ensemble"](server, texts, params)
    assert streamed.shape == (len(texts), params.get("dimensions", 384))
    assert not np.allclose(np.linalg.norm(streamed, axis=1), 1.0)
    for way in ("grpc_unary_embed", "http_unary_embed"):
        np.testing.assert_allclose(WAYS[way](server, texts, params), streamed, atol=1e-6, err_msg=way)


def model_counts(server, model):
    """(execute calls, requests) Triton's statistics count for `model` so far."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    headers = {"triton-grpc-protocol-rose-admin-key": server.admin_key}
    (row,) = client.get_inference_statistics(model, headers=headers, as_json=True)["model_stats"]
    return int(row.get("execution_count", 0)), int(row.get("inference_count", 0))


def test_requests_waiting_for_the_tokenizer_are_each_answered_their_own(server, reference):
    """While the tokenizer is held on one request, others wait in its dynamic batcher's queue and
    are then handed to one `execute` and tokenized as one group (engine_lib/tokenization/grouped.py):
    each gets its own rows, with its own options, and a bad one its own error."""
    texts = [VARIED_TEXTS[1 + 3 * i: 4 + 3 * i] for i in range(6)]
    params = [{"dimensions": 64} if i == 2 else None for i in range(6)]
    before = model_counts(server, "tokenizer")
    with ThreadPoolExecutor(8) as pool:
        with server.tokenizer_hold:
            first = pool.submit(embed_stream, server.grpc_url, [VARIED_TEXTS[0]])
            server.tokenizer_hold.wait_entered()
            waiting = [pool.submit(embed_stream, server.grpc_url, t, p) for t, p in zip(texts, params)]
            too_long = pool.submit(embed_stream, server.grpc_url, ["word " * 2000], {"truncate": False})
            wait_for_metric(server.metrics_url, 'nv_inference_pending_request_count{model="tokenizer"', 7,
                            why="(the 7 requests never queued behind the held one)")
        assert cosines(first.result(), reference[VARIED_TEXTS[0]][None]).min() >= MIN_COSINE
        for request_texts, request_params, future in zip(texts, params, waiting):
            rows = future.result()
            refs = np.stack([reference[t] for t in request_texts])
            if request_params:
                assert rows.shape == (3, 64)
                refs = refs[:, :64]
                refs = refs / np.linalg.norm(refs, axis=1, keepdims=True)
            assert cosines(rows, refs).min() >= MIN_COSINE, request_texts[0][:30]
        with pytest.raises(InferenceServerException, match=r"TEXT\[0\] has \d+ tokens, more than the model's maximum"):
            too_long.result()
    executions, requests = (after - was for after, was in zip(model_counts(server, "tokenizer"), before))
    # alone: one execute a request; together: the held one, then the 7 behind it in one (a watchdog
    # probe in between adds one of each)
    assert requests >= 8 and executions <= requests - 6, (executions, requests)


@pytest.mark.parametrize("shape", [[1, 3], [3, 1]])
def test_a_direct_call_to_the_tokenizer_keeps_every_text(server, model_dir, shape):
    """The tokenizer model takes a batch dimension (its dynamic batcher): the ensemble's one row of N
    texts and a caller's N rows of one text each give the ids the model's own tokenizer gives."""
    from engine_lib.config import TokenizerConfig
    from engine_lib.options import RequestOptions
    from engine_lib.tokenization.text import TextTokenizer

    texts = VARIED_TEXTS[:3]
    text = grpcclient.InferInput("TEXT", shape, "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object).reshape(shape))
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("tokenizer", [text])
    expected = TextTokenizer(model_dir, TokenizerConfig()).encode(texts, RequestOptions())
    assert list(result.as_numpy("SEQ_LENS")) == list(expected.seq_lens)
    assert list(result.as_numpy("INPUT_IDS")) == list(expected.input_ids)


def test_embed_requests_waiting_together_share_encoder_calls_and_each_gets_its_own(server, reference):
    """While the tokenizer is held, requests queue in the unary front's instances; released, each
    instance takes its waiting ones as one group (rose_triton/batched.py answer_together): those with
    the same options share one encoder call, and each request gets its own rows, a request with other
    options its own, a bad one its own error."""
    def executions(model):
        return model_counts(server, model)[0]

    plain = [VARIED_TEXTS[2 * i: 2 * i + 2] for i in range(10)]
    asks = [(t, None) for t in plain] + [(VARIED_TEXTS[30:33], {"dimensions": 64}),
                                         (["word " * 2000], {"truncate": False})]
    fronts, encoder = executions(EMBED), executions(ROSE_ENCODER)
    with ThreadPoolExecutor(len(asks) + 1) as pool:
        with server.tokenizer_hold:
            first = pool.submit(embed_unary_grpc, server.grpc_url, [VARIED_TEXTS[40]])
            server.tokenizer_hold.wait_entered()
            waiting = [pool.submit(embed_unary_grpc, server.grpc_url, t, p) for t, p in asks]
            # every request is in an instance (its execute returned) before the hold is released
            wait_until(lambda: executions(EMBED) - fronts >= 1 + len(asks), 60,
                       f"the {1 + len(asks)} requests to reach the unary front's instances")
        assert cosines(first.result(), reference[VARIED_TEXTS[40]][None]).min() >= MIN_COSINE
        for (texts, params), future in zip(asks, waiting):
            if params and params.get("truncate") is False:
                with pytest.raises(InferenceServerException, match=r"TEXT\[0\] has \d+ tokens, more than"):
                    future.result()
                continue
            rows = future.result()
            refs = np.stack([reference[t] for t in texts])
            if params:
                assert rows.shape == (3, 64)
                refs = refs[:, :64] / np.linalg.norm(refs[:, :64], axis=1, keepdims=True)
            assert rows.shape[0] == len(texts) and cosines(rows, refs).min() >= MIN_COSINE, texts[0][:30]
    # 12 requests reached the encoder's front; alone they are 12 calls. Together: per instance, the
    # one held plus one call per set of options that waited behind it (at most 2 + 2 + 1 with two).
    calls = executions(ROSE_ENCODER) - encoder
    reached = 1 + len(asks) - 1  # the first and the asks but the one refused while tokenized
    assert 1 <= calls < reached, f"{calls} encoder calls for the {reached} requests that reached it: none shared"
