"""encode_fast: the ids and type ids of `encode_batch_fast`, with a small batch kept off tokenizers' pool."""
import os

import pytest
from tokenizers import Tokenizer

from engine_lib.tokenization.fast_encode import POOL_MIN_CHARS, encode_fast


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))


def _same(got, expected):
    assert [e.ids for e in got] == [e.ids for e in expected]
    assert [e.type_ids for e in got] == [e.type_ids for e in expected]


def test_small_and_large_batches_give_encode_batch_fast_ids(tokenizer):
    small = ["a query", "another short text, with punctuation!", "naïve café"]
    large = [f"text number {i} " + "word " * 200 for i in range(POOL_MIN_CHARS // 1000 + 1)]
    assert sum(map(len, small)) < POOL_MIN_CHARS <= sum(map(len, large))
    for texts in (small, large, []):
        _same(encode_fast(tokenizer, texts), tokenizer.encode_batch_fast(texts))


def test_pairs_keep_their_segments(tokenizer):
    pairs = [("capital of france", "paris is the capital"), ("q", "berlin is a city")]
    got = encode_fast(tokenizer, pairs)
    _same(got, tokenizer.encode_batch_fast(pairs))
    assert 1 in got[0].type_ids


class Recording:
    """The tokenizer, with the size of every batch it was handed."""

    def __init__(self, tokenizer):
        self.tokenizer, self.batch_sizes = tokenizer, []

    def encode_batch_fast(self, inputs):
        self.batch_sizes.append(len(inputs))
        return self.tokenizer.encode_batch_fast(inputs)


def test_only_a_large_batch_goes_to_the_tokenizer_whole(tokenizer):
    """A batch of one input is never split across the pool, so a small batch goes one input a call."""
    recording = Recording(tokenizer)
    encode_fast(recording, ["a short query", "and another one", "a third"])
    assert recording.batch_sizes == [1, 1, 1]
    recording.batch_sizes.clear()
    encode_fast(recording, ["word " * 100] * (POOL_MIN_CHARS // 500 + 1))
    assert recording.batch_sizes == [POOL_MIN_CHARS // 500 + 1]
