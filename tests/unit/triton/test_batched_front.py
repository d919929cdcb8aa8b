"""rose_triton/batched.py: how the unary fronts group requests, merge their tokens, share encoder calls and split the rows."""
import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest

from engine_lib.errors import InputError
from rose_triton.batched import Ask, answer_together, check_row_types, group_requests, merge_tokens, split_rows, texts_of
from rose_wire import (EMBEDDINGS, EMBEDDINGS_INT8, INPUT_IDS, SEQ_LENS, TEXT_WINDOWS, TOKEN_TYPE_IDS, WireError,
                       decode, encode)
from testing.fake_triton_error import FakeTritonError


def wire(lens, windows=()):
    ids = np.arange(sum(lens), dtype=np.int64) + 100 * len(lens)
    return {INPUT_IDS: ids, SEQ_LENS: np.asarray(lens, dtype=np.int64),
            TEXT_WINDOWS: np.asarray(windows, dtype=np.int64)}


def test_requests_with_the_same_parameters_and_outputs_share_a_group_in_arrival_order():
    keyed = [(0, "{}", {}, [EMBEDDINGS], 10, True), (1, '{"normalize":false}', {"normalize": False}, [EMBEDDINGS], 10, True),
             (2, "{}", {}, [EMBEDDINGS], 10, True), (3, "{}", {}, [EMBEDDINGS_INT8], 10, True),
             (5, "{}", {}, [EMBEDDINGS], 10, True)]
    groups = group_requests(keyed)
    assert [(g.members, g.outputs, g.parameters) for g in groups] == [
        ([0, 2, 5], (EMBEDDINGS,), {}), ([1], (EMBEDDINGS,), {"normalize": False}), ([3], (EMBEDDINGS_INT8,), {})]


def test_a_group_stops_at_its_token_bound_and_requests_that_cannot_share_go_alone():
    keyed = [(0, "{}", {}, [EMBEDDINGS], 60, True), (1, "{}", {}, [EMBEDDINGS], 50, True),
             (2, "{}", {}, [EMBEDDINGS], 30, True), (3, "{}", {}, [EMBEDDINGS], 500, True),
             (4, "{}", {}, [EMBEDDINGS], 5, False), (5, "{}", {}, [EMBEDDINGS], 5, False),
             (6, "{}", {}, [EMBEDDINGS], 5, True)]
    assert [g.members for g in group_requests(keyed, max_tokens=100)] == [[0], [1, 2], [3], [4], [5], [6]]


def test_merged_tokens_are_the_requests_tokens_in_order():
    a, b = wire([3, 2]), wire([4])
    merged = merge_tokens([a, b])
    np.testing.assert_array_equal(merged[INPUT_IDS], np.concatenate([a[INPUT_IDS], b[INPUT_IDS]]))
    np.testing.assert_array_equal(merged[SEQ_LENS], [3, 2, 4])
    assert merged[TEXT_WINDOWS].size == 0  # one sequence a text for all
    assert [texts_of(a), texts_of(b)] == [2, 1]


def test_windows_are_kept_and_requests_without_them_count_one_window_a_text():
    chunked, plain = wire([5, 5, 2], windows=[2, 1]), wire([3, 4])
    merged = merge_tokens([plain, chunked])
    np.testing.assert_array_equal(merged[TEXT_WINDOWS], [1, 1, 2, 1])
    assert int(merged[TEXT_WINDOWS].sum()) == merged[SEQ_LENS].size
    assert [texts_of(plain), texts_of(chunked)] == [2, 2]


def test_rows_are_split_by_texts_in_order():
    rows = np.arange(12, dtype=np.float32).reshape(6, 2)
    codes = np.arange(6, dtype=np.int8)[:, None]
    parts = split_rows({EMBEDDINGS: rows, EMBEDDINGS_INT8: codes}, [2, 3, 1])
    np.testing.assert_array_equal(np.concatenate([p[EMBEDDINGS] for p in parts]), rows)
    assert [len(p[EMBEDDINGS]) for p in parts] == [2, 3, 1]
    np.testing.assert_array_equal(parts[1][EMBEDDINGS_INT8][:, 0], [2, 3, 4])


def test_rows_that_do_not_add_up_are_an_error_not_a_wrong_answer():
    with pytest.raises(RuntimeError, match="5 rows of EMBEDDINGS for 6 texts"):
        split_rows({EMBEDDINGS: np.zeros((5, 2), np.float32)}, [2, 4])


@pytest.mark.parametrize("types", ["float,int8", ["binary", "ubinary", "uint8"], None, ""])
def test_row_types_pass(types):
    check_row_types({"embedding_types": types})


@pytest.mark.parametrize("types, named", [("sparse", "sparse"), (["float", "int8_ranges"], "int8_ranges"),
                                          ("multivector", "multivector")])
def test_types_that_are_not_one_row_a_text_are_refused_by_name(types, named):
    with pytest.raises(InputError, match=named) as caught:
        check_row_types({"embedding_types": types})
    assert caught.value.field == "embedding_types"


def test_token_types_are_merged_with_their_tokens():
    a, b = wire([2]), wire([1, 2])
    for t in (a, b):
        t[TOKEN_TYPE_IDS] = np.arange(t[INPUT_IDS].size, dtype=np.int64) % 2
    np.testing.assert_array_equal(merge_tokens([a, b])[TOKEN_TYPE_IDS], [0, 1, 0, 1, 0])
    a[TOKEN_TYPE_IDS], b[TOKEN_TYPE_IDS] = np.zeros(0, np.int64), np.zeros(0, np.int64)
    assert merge_tokens([a, b])[TOKEN_TYPE_IDS].size == 0  # the model's single segment for all


class FakeTensor:
    def __init__(self, name, array):
        self._name, self.array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self.array


class FakeResponse:
    def __init__(self, output_tensors=(), error=None):
        self.tensors, self.error_ = list(output_tensors), error

    def has_error(self):
        return self.error_ is not None

    def error(self):
        return self.error_


class FakeEncoder:
    """An encoder a BLS call reaches: a row [first id, length] per sequence; a sequence starting
    with id 666 makes the whole call an input error. `calls` records each call's sequence lengths."""

    def __init__(self):
        self.calls, self.parameters = [], []

    def request(self, model_name, inputs, requested_output_names, parameters):
        tensors = {t.name(): t.array for t in inputs}
        self.calls.append(tensors[SEQ_LENS].tolist())
        self.parameters.append(parameters)
        starts = np.concatenate([[0], np.cumsum(tensors[SEQ_LENS])[:-1]]).astype(int)
        firsts = tensors[INPUT_IDS][starts]
        if (firsts == 666).any():
            answer = FakeResponse(error=FakeTritonError(encode(WireError("INVALID_ARG", "id 666 is refused", None))))
        else:
            rows = np.stack([firsts, tensors[SEQ_LENS]], axis=1).astype(np.float32)
            answer = FakeResponse([FakeTensor(n, rows * (1 + i)) for i, n in enumerate(requested_output_names)])
        return FakeBls(answer)


class FakeBls:
    def __init__(self, answer):
        self.answer = answer

    def async_exec(self, decoupled=False):
        future = asyncio.get_running_loop().create_future()
        future.set_result(iter([self.answer]))
        return future


def fake_pb_utils(encoder):
    return SimpleNamespace(TritonError=FakeTritonError, Tensor=FakeTensor, InferenceResponse=FakeResponse,
                           InferenceRequest=encoder.request,
                           get_output_tensor_by_name=lambda r, n: next((t for t in r.tensors if t.name() == n), None))


class Request:
    def __init__(self, ids, parameters="{}", outputs=(EMBEDDINGS,), shareable=True):
        self.ids, self.raw, self.outputs, self.shareable = ids, parameters, outputs, shareable

    def is_cancelled(self):
        return False


def read(request):
    if request.raw == "bad":
        raise InputError("parameters: not JSON", "parameters")
    return Ask(request.raw, json.loads(request.raw), request.outputs, {"ids": request.ids}, request.shareable)


class Tokenize:
    """The step's `many`: a text is its ids; a text with id 13 is that request's input error."""

    def many(self, items):
        out = []
        for arrays, _ in items:
            texts = arrays["ids"]
            if any(13 in t for t in texts):
                out.append(InputError("text 13 is unlucky", "TEXT"))
            else:
                out.append({INPUT_IDS: np.array([i for t in texts for i in t], np.int64),
                            SEQ_LENS: np.array([len(t) for t in texts], np.int64),
                            TEXT_WINDOWS: np.zeros(0, np.int64)})
        return out


def answered(requests):
    encoder = FakeEncoder()
    front = SimpleNamespace(tokenize=Tokenize(), traced=False,
                            config=SimpleNamespace(encoder_model="rose_encoder", bls_timeout_s=60))

    async def run():
        return await asyncio.gather(*answer_together(requests, read, front, fake_pb_utils(encoder)))

    answered.parameters = encoder.parameters
    return asyncio.run(run()), encoder.calls


def rows_of(response, name=EMBEDDINGS):
    assert not response.has_error(), response.error().message()
    return next(t.as_numpy() for t in response.tensors if t.name() == name).tolist()


def test_requests_answered_together_share_encoder_calls_and_each_gets_its_own_rows():
    requests = [Request([[1, 2], [3]]), Request([[4, 4, 4]], '{"normalize": false}'), Request([[5]]),
                Request([[6, 6]], outputs=(EMBEDDINGS, EMBEDDINGS_INT8)), Request([[7]], parameters="bad"),
                Request([[13]]), Request([[8, 8]], outputs=(EMBEDDINGS, EMBEDDINGS_INT8)),
                Request([[9]], shareable=False)]
    answers, calls = answered(requests)
    assert calls == [[2, 1, 1], [3], [2, 2], [1]]  # the requests by options, in arrival order
    assert rows_of(answers[0]) == [[1, 2], [3, 1]] and rows_of(answers[2]) == [[5, 1]]
    assert rows_of(answers[1]) == [[4, 3]]
    assert rows_of(answers[3]) == [[6, 2]] and rows_of(answers[3], EMBEDDINGS_INT8) == [[12, 4]]
    assert rows_of(answers[6]) == [[8, 2]] and rows_of(answers[6], EMBEDDINGS_INT8) == [[16, 4]]
    assert decode(answers[4].error().message()).message == "parameters: not JSON"
    assert answers[4].error().code() == FakeTritonError.INVALID_ARG
    assert decode(answers[5].error().message()).field == "TEXT"
    assert rows_of(answers[7]) == [[9, 1]]


def test_an_input_error_of_a_shared_call_is_only_the_request_that_caused_it():
    answers, calls = answered([Request([[1]]), Request([[666, 1]]), Request([[2]])])
    assert calls == [[1, 2, 1], [1], [2], [1]]  # the shared call, then each member alone
    assert rows_of(answers[0]) == [[1, 1]] and rows_of(answers[2]) == [[2, 1]]
    assert answers[1].error().code() == FakeTritonError.INVALID_ARG
    assert "id 666 is refused" in answers[1].error().message()


def test_a_group_of_small_requests_stays_interactive_and_a_large_request_keeps_its_class():
    """The encoder classes a request without priority_class by its size (engine_lib.options
    default_priority: up to 32 texts): 2 x 20 texts share a call as interactive; 40 alone are batch."""
    small = [[i + 20] for i in range(20)]
    answers, calls = answered([Request(small), Request(small), Request([[i + 20] for i in range(40)]),
                               Request(small, '{"priority_class": "batch"}')])
    assert calls == [[1] * 40, [1] * 40, [1] * 20]
    assert [p["priority_class"] for p in answered.parameters] == ["interactive", "batch", "batch"]
    assert [len(rows_of(a)) for a in answers] == [20, 20, 40, 20]
