"""flatten: token id lists -> flat int64 ids + lengths, the encoder's ragged input."""
import numpy as np
import pytest

from engine_lib.tokenization.ragged import flatten


@pytest.mark.parametrize("rows", [[[101, 7, 102]], [[101, 7, 102], [101, 102], [5]], []])
def test_rows_end_to_end_with_their_lengths(rows):
    ids, lens = flatten(rows)
    assert ids.dtype == np.int64 and lens.dtype == np.int64
    assert lens.tolist() == [len(r) for r in rows]
    assert ids.tolist() == [t for r in rows for t in r]
