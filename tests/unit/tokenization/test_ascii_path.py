"""The ASCII path (engine_lib/tokenization/ascii_path.py) gives the whole tokenizer's ids and type ids."""
import json
import os
import random

import pytest
from tokenizers import Tokenizer, normalizers

from engine_lib.tokenization.ascii_path import AsciiPathTokenizer, ascii_path

SPECIALS = ["[MASK]", "[mask]", "[CLS]", "[SEP]", "[UNK]", "[PAD]", "[Mask]", "##"]
OTHERS = ["naïve café", "東京タワー", "emoji 🙂 here", "ﬁne ligature", "Ａ fullwidth", "\u00a0nbsp", "\ufffd"]


def ascii_texts(count: int, seed: int = 0) -> list[str]:
    """Random ASCII: every code point (controls, tab/newline/return, DEL), mixed case, words, specials."""
    rng = random.Random(seed)
    words = ["The", "capital", "of", "FRANCE", "is", "Paris.", "don't", "e-mail", "x1", "(a)", "#tag", "U.S.A."]
    texts = ["", " ", "\t\n\r", "a\x00b", "a\x01b\x7fc", "a\x0bb\x0cc", "a\x1fb"]
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 40)):
            roll = rng.random()
            if roll < 0.6:
                parts.append(rng.choice(words))
            elif roll < 0.62:
                parts.append(rng.choice(SPECIALS))
            else:
                parts.append("".join(chr(rng.randrange(128)) for _ in range(rng.randint(1, 6))))
            parts.append(rng.choice([" ", "", "\t", "\n", "  "]))
        texts.append("".join(parts))
    return texts


def same(got, expected):
    assert [e.ids for e in got] == [e.ids for e in expected]
    assert [e.type_ids for e in got] == [e.type_ids for e in expected]


def variant(tokenizer: Tokenizer, **normalizer) -> Tokenizer:
    spec = json.loads(tokenizer.to_str())
    spec["normalizer"].update(normalizer)
    return Tokenizer.from_str(json.dumps(spec))


@pytest.fixture(scope="module")
def bert(model_dir):
    tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


@pytest.mark.parametrize("settings", [{}, {"lowercase": False, "strip_accents": False}, {"clean_text": False}])
def test_texts_and_pairs_get_the_whole_tokenizers_ids(bert, settings):
    tokenizer = variant(bert, **settings)
    fast = ascii_path(tokenizer)
    assert isinstance(fast, AsciiPathTokenizer)
    texts = ascii_texts(300) + OTHERS
    assert sum(fast.normalized(t) is not None for t in texts) > 150  # the path is taken...
    assert all(fast.normalized(t) is None for t in OTHERS + ["[MASK] it", "the [SEP]"])  # ...but not everywhere
    same(fast.encode_batch_fast(texts), tokenizer.encode_batch_fast(texts))  # mixed batches keep their order
    for text in texts[:60] + OTHERS:
        same(fast.encode_batch_fast([text]), tokenizer.encode_batch_fast([text]))
    pairs = list(zip(texts[::2], texts[1::2]))
    same(fast.encode_batch_fast(pairs), tokenizer.encode_batch_fast(pairs))


@pytest.mark.parametrize("direction", ["right", "left"])
def test_truncation_is_the_copied_tokenizers(bert, direction):
    bert = Tokenizer.from_str(bert.to_str())
    bert.enable_truncation(16, direction=direction)
    texts = [t for t in ascii_texts(50, seed=1) if len(t) > 40]
    same(ascii_path(bert).encode_batch_fast(texts), bert.encode_batch_fast(texts))


def test_other_normalizers_keep_the_tokenizer(bert):
    nfc = Tokenizer.from_str(bert.to_str())
    nfc.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    assert ascii_path(nfc) is nfc
