"""chunking=mean in the Endpoint: a text's windows pooled into one row, weighted by their tokens."""
import numpy as np
import pytest

from engine_lib.contract import RaggedTokens
from engine_lib.errors import InputError
from engine_lib.options import RequestOptions
from engine_lib.service.endpoint import Endpoint
from rose_wire import EMBEDDINGS, EMBEDDINGS_UBINARY
from testing.fake_engine import FakeEngine, Replies, expected_row, make_service


def test_windows_are_pooled_by_token_count_then_cut_and_normalised():
    endpoint = Endpoint(make_service(FakeEngine()))
    seqs = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]  # text 0: windows 0-2, text 1: window 3
    replies = Replies()
    endpoint.submit(RaggedTokens.from_rows(seqs, windows=[3, 1], options=RequestOptions(normalize=False)),
                    replies.callback("raw"))
    endpoint.submit(RaggedTokens.from_rows(seqs, windows=[3, 1], options=RequestOptions(
        dimensions=2, embedding_types=("float", "ubinary"))), replies.callback("cut"))
    replies.wait_for(2)
    rows = np.array([expected_row(s) for s in seqs], dtype=np.float64)
    weights = np.array([3, 2, 1], dtype=np.float64)
    first = (rows[:3] * weights[:, None]).sum(axis=0) / weights.sum()
    np.testing.assert_allclose(replies.results["raw"][0][EMBEDDINGS], [first, rows[3]], rtol=1e-6)
    cut = np.array([first[:2], rows[3, :2]])
    cut /= np.linalg.norm(cut, axis=1, keepdims=True)
    result = replies.results["cut"][0]
    np.testing.assert_allclose(result[EMBEDDINGS], cut, rtol=1e-6)
    assert result[EMBEDDINGS_UBINARY].shape == (2, 1)
    endpoint.close()


@pytest.mark.parametrize("windows", [[2, 1], [4, 0], [1, 1, 1, 1, 1]])
def test_windows_that_do_not_add_up_are_refused(windows):
    endpoint = Endpoint(make_service(FakeEngine()))
    with pytest.raises(InputError, match="TEXT_WINDOWS") as refused:
        endpoint.submit(RaggedTokens(np.arange(1, 5), np.array([1, 1, 1, 1]), windows=np.array(windows),
                                     options=RequestOptions()), lambda *a: None)
    assert refused.value.field == "TEXT_WINDOWS"
    endpoint.close()
