"""rose_triton/batched.py: how the batched front groups requests, merges their tokens and splits the rows."""
import numpy as np
import pytest

from engine_lib.errors import InputError
from rose_triton.batched import check_row_types, group_requests, merge_tokens, split_rows, texts_of
from rose_wire import EMBEDDINGS, EMBEDDINGS_INT8, INPUT_IDS, SEQ_LENS, TEXT_WINDOWS


def wire(lens, windows=()):
    ids = np.arange(sum(lens), dtype=np.int64) + 100 * len(lens)
    return {INPUT_IDS: ids, SEQ_LENS: np.asarray(lens, dtype=np.int64),
            TEXT_WINDOWS: np.asarray(windows, dtype=np.int64)}


def test_requests_with_the_same_parameters_and_outputs_share_a_group_in_arrival_order():
    keyed = [(0, "{}", {}, [EMBEDDINGS]), (1, '{"normalize":false}', {"normalize": False}, [EMBEDDINGS]),
             (2, "{}", {}, [EMBEDDINGS]), (3, "{}", {}, [EMBEDDINGS_INT8]), (5, "{}", {}, [EMBEDDINGS])]
    groups = group_requests(keyed)
    assert [(g.members, g.outputs, g.parameters) for g in groups] == [
        ([0, 2, 5], (EMBEDDINGS,), {}), ([1], (EMBEDDINGS,), {"normalize": False}), ([3], (EMBEDDINGS_INT8,), {})]


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
