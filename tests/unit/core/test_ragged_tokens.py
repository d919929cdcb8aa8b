"""RaggedTokens: token id lists -> one request's flat ids + lengths, and the offsets read from them."""
import numpy as np
import pytest

from engine_lib.contract import RaggedTokens


@pytest.mark.parametrize("rows", [[[101, 7, 102]], [[101, 7, 102], [101, 102], [5]], []])
def test_rows_end_to_end_with_their_lengths(rows):
    tokens = RaggedTokens.from_rows(rows)
    assert tokens.input_ids.dtype == np.int64 and tokens.seq_lens.dtype == np.int64
    assert tokens.seq_lens.tolist() == tokens.lengths == [len(r) for r in rows]
    assert tokens.input_ids.tolist() == [t for r in rows for t in r]
    assert tokens.token_types is None and tokens.windows is None


def test_segments_travel_beside_the_ids():
    tokens = RaggedTokens.from_rows([[1, 2, 3], [4, 5]], [[0, 0, 1], [0, 1]])
    assert tokens.token_types.tolist() == [0, 0, 1, 0, 1]


def test_windows_group_sequences_into_texts():
    rows = [[1, 2], [3], [4, 5, 6], [7, 8, 9, 10]]  # text 0: two windows, text 1: one, text 2: one
    tokens = RaggedTokens.from_rows(rows, windows=[2, 1, 1], options="opts")
    assert tokens.num_texts == 3 and tokens.options == "opts"
    assert tokens.text_tokens == [3, 3, 4]
    assert tokens.window_offsets.tolist() == [0, 2, 3, 4]
    assert [tokens.input_ids[a:b].tolist() for a, b in zip(tokens.offsets[:-1], tokens.offsets[1:])] == rows


def test_without_windows_every_sequence_is_a_text():
    tokens = RaggedTokens.from_rows([[1, 2], [3]])
    assert tokens.num_texts == 2 and tokens.text_tokens == [2, 1]
    assert tokens.window_offsets.tolist() == [0, 1, 2]
