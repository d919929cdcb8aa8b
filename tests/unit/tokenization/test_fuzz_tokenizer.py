"""Property tests without a server: request options, text decoding and the
long-text cut never fail other than with InputError, and the cut never
changes the tokens. ROSE_FUZZ_EXAMPLES raises the example count."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_lib.config import TokenizerConfig
from engine_lib.errors import InputError
from engine_lib.model_folder import ModelFolder
from engine_lib.options import RequestOptions
from engine_lib.tokenization.long_text import CUT_CHARS_PER_TOKEN, cut_long_text
from engine_lib.tokenization.text import TextTokenizer, load_tokenizer

EXAMPLES = int(os.environ.get("ROSE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize="ROSE_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                      max_size=3),
                           max_leaves=5)
OPTION_KEYS = st.sampled_from(["input_type", "truncate", "normalize", "dimensions", "bogus", "triton_x", ""])
PIECES = ["hello", "Über", "naïve", "你好世界", "🎉", " ", "  ", "\n", "\t", ",", "...", "a" * 150, "x" * 90,
          "don't", "e\u0301", "\u200b", "ﬁ", "\x00", "\u3000", "Ⅻ", "ǅ"]


@pytest.fixture(scope="module")
def raw_tokenizer(model_dir):
    return load_tokenizer(ModelFolder.open(model_dir))


@pytest.fixture(scope="module")
def strict_tokenizer(model_dir):
    return TextTokenizer(model_dir, TokenizerConfig(max_texts_per_request=4, max_text_bytes=32, max_request_bytes=64))


@FUZZ
@given(params=st.one_of(st.dictionaries(OPTION_KEYS, JSON_VALUES, max_size=4), JSON_VALUES))
def test_options_parse_or_refuse_with_input_error(params):
    try:
        options = RequestOptions.from_parameters(json.dumps(params))
    except InputError:
        return
    assert options.input_type in ("query", "document")
    assert isinstance(options.dimensions, int) and 0 <= options.dimensions < 1 << 63


@FUZZ
@given(items=st.lists(st.one_of(st.binary(max_size=40), st.text(max_size=40)), max_size=6))
def test_decode_texts_returns_texts_or_refuses(strict_tokenizer, items):
    tokenizer = strict_tokenizer
    raw = np.array(items + [None], dtype=object)[:-1]  # keep a 1-D object array even for equal-length bytes
    try:
        texts = tokenizer.decode_texts(raw)
    except InputError:
        return
    assert 1 <= len(texts) <= 4 and all(t.strip() for t in texts)
    assert sum(len(t.encode()) for t in texts) <= 64


@FUZZ
@given(words=st.lists(st.sampled_from(PIECES), min_size=60, max_size=400), query=st.booleans())
def test_cutting_long_texts_never_changes_the_tokens(raw_tokenizer, words, query):
    max_length = 16  # cut at 512 characters
    text = ("query: " if query else "") + "".join(words)
    if len(text) <= max_length * CUT_CHARS_PER_TOKEN or not text.strip():
        return
    cut = cut_long_text(raw_tokenizer, text, max_length)
    first = lambda t: raw_tokenizer.encode(t, add_special_tokens=False).ids[:max_length]
    assert first(cut) == first(text)
