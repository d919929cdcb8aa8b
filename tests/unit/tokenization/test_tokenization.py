"""TextTokenizer: decoding checks, templates, truncation or refusal, no padding."""
import numpy as np
import pytest

from engine_lib.config import TokenizerConfig
from engine_lib.errors import InputError, InputTooLarge
from engine_lib.options import RequestOptions
from engine_lib.tokenization.text import TextTokenizer
from engine_lib.tokenization.text_input import check_texts


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return TextTokenizer(model_dir, TokenizerConfig(query_prefix="query: ", document_prefix="passage: ",
                                                    max_texts_per_request=8, max_text_bytes=2000))


def as_bytes(*items):
    return np.array(list(items), dtype=object)


def test_max_length_from_sentence_transformers_config(tokenizer):
    assert tokenizer.max_length == 256


def test_no_padding_flat_output(tokenizer):
    tokens = tokenizer.encode(["hi", "a longer sentence here"], RequestOptions())
    ids, lens = tokens.input_ids, tokens.seq_lens
    assert ids.dtype == np.int64 and lens.tolist()[0] < lens.tolist()[1]
    assert ids.size == lens.sum() and 0 not in ids  # 0 is [PAD]


def test_templates_by_input_type(tokenizer):
    tokens = tokenizer.encode(["cats"], RequestOptions(input_type="query"))
    query_ids = tokens.input_ids
    tokens = tokenizer.encode(["cats"], RequestOptions(input_type="document"))
    doc_ids = tokens.input_ids
    plain = tokenizer._full.encode("query: cats").ids
    assert query_ids.tolist() == plain and doc_ids.tolist() != plain


def test_truncation_and_refusal(tokenizer):
    long_text = "word " * 600
    tokens = tokenizer.encode([long_text, "short"], RequestOptions())
    ids, lens = tokens.input_ids, tokens.seq_lens
    assert lens[0] == 256 and ids.size == lens.sum()
    with pytest.raises(InputError, match=r"TEXT\[0\] has \d+ tokens, more than the model's maximum of 256"):
        tokenizer.encode([long_text], RequestOptions(truncate=False))


@pytest.mark.parametrize("raw, message", [
    (as_bytes(), "TEXT is empty"),
    (as_bytes(b"ok", b""), r"TEXT\[1\] is empty"),
    (as_bytes(b"ok", b"   \n"), r"TEXT\[1\] is empty or only whitespace"),
    (as_bytes(b"\xff\xfeok"), r"TEXT\[0\] is not valid UTF-8"),
    (as_bytes(*([b"x"] * 9)), "at most 8 per request"),
    (as_bytes(b"y" * 2001), r"TEXT\[0\] is 2001 bytes"),
    (np.array([[b"a"]], dtype=object), "1-D"),
])
def test_bad_text_input(tokenizer, raw, message):
    with pytest.raises(InputError, match=message):
        tokenizer.decode_texts(raw)


@pytest.mark.parametrize("items, too_large, message", [
    (["ok", " "], False, r"in\[1\] is empty or only whitespace"),
    (["x"] * 9, True, "in has 9 texts; at most 8 per request"),
    (["é" * 1001], True, r"in\[0\] is 2002 bytes; at most 2000"),
    (["é" * 1000, "é" * 1000, "é" * 1000], True, "more than 2500 bytes in all"),
    (["ok", "\ud800"], False, r"in\[1\] is not valid UTF-8"),
])
def test_text_limits_are_the_same_for_strings_and_bytes(tokenizer, items, too_large, message):
    """The gateway checks JSON strings, the tokenizer models UTF-8 bytes: one function, same answers."""
    limits = TokenizerConfig(max_texts_per_request=8, max_text_bytes=2000, max_request_bytes=2500)
    for form in (items, [t.encode("utf-8", "surrogatepass") for t in items]):
        with pytest.raises(InputError, match=message) as info:
            check_texts(form, limits, "in")
        assert isinstance(info.value, InputTooLarge) == too_large and info.value.field == "in"
    assert check_texts(["é", b"\xc3\xa9"], limits, "in") == ["é", "é"]


@pytest.mark.parametrize("params, message", [
    ({"bogus": 1}, "unknown request parameter"),
    ({"input_type": "poem"}, "input_type"),
    ({"dimensions": -3}, "dimensions"),
    ({"dimensions": 1.5}, "dimensions"),
    ({"dimensions": 1 << 63}, r"'dimensions' is 9223372036854775808; it must lie in \[0, 9223372036854775807\]"),
    ({"dimensions": str(1 << 63)}, "dimensions"),  # Triton's string parameters: digits, but past int64
    ({"dimensions": "9" * 40}, "dimensions"),
    ({"normalize": "maybe"}, "normalize"),
])
def test_bad_options(params, message):
    with pytest.raises(InputError, match=message) as info:
        RequestOptions.from_parameters(params)
    assert info.value.field == next(iter(params))


def test_integer_options_take_the_int64_range_and_digits_only_outside_json_bodies():
    assert RequestOptions.from_parameters({"dimensions": str((1 << 63) - 1)}).dimensions == (1 << 63) - 1
    assert RequestOptions.from_parameters({"dimensions": "12"}).dimensions == 12
    with pytest.raises(InputError, match="must be an integer, got '12'") as info:
        RequestOptions.from_parameters({"dimensions": "12"}, json_body=True)
    assert info.value.field == "dimensions"
    with pytest.raises(InputError, match="'dimensions' is 385; the model has 384"):
        RequestOptions(dimensions=385).check_width(384)
    RequestOptions(dimensions=384).check_width(384)


def test_options_from_triton_json():
    options = RequestOptions.from_parameters('{"normalize": false, "dimensions": 64, "triton_x": 1}')
    assert options == RequestOptions(normalize=False, dimensions=64)


@pytest.mark.parametrize("text", [
    " ".join(f"w{i} sentence {i}." for i in range(200)),       # past the maximum: truncated
    " ".join(f"w{i} sentence {i}." for i in range(3000)),      # past the character cut too (long_text.py)
])
def test_truncation_from_the_left_keeps_the_end_as_transformers_does(model_dir, text):
    from transformers import AutoTokenizer

    ours = TextTokenizer(model_dir, TokenizerConfig())
    for side, direction in (("left", "left"), ("right", "right")):
        reference = AutoTokenizer.from_pretrained(model_dir, truncation_side=side)
        expected = reference(text, truncation=True, max_length=256)["input_ids"]
        tokens = ours.encode([text], RequestOptions(truncation_direction=direction))
        ids, lens = tokens.input_ids, tokens.seq_lens
        assert ids.tolist() == expected and lens.tolist() == [256], direction
    tokens = ours.encode([text], RequestOptions(truncation_direction="left"))
    left = tokens.input_ids
    assert left[-2] == ours._full.encode(text).ids[-2]  # the text's last token before [SEP]


@pytest.mark.parametrize("value", ["middle", "LEFT", 1, True])
def test_truncation_direction_values_are_refused_naming_the_field(value):
    with pytest.raises(InputError, match="truncation_direction") as refused:
        RequestOptions.from_parameters({"truncation_direction": value})
    assert refused.value.field == "truncation_direction"


def test_calibration_texts_tokenize_as_requests_of_their_input_type(model_dir):
    from engine_lib.tokenization.calibration import calibration_sequences, calibration_texts

    pairs = calibration_texts()
    assert len(pairs) >= 150 and {k for k, _ in pairs} == {"query", "document"}
    sequences = calibration_sequences(model_dir)
    ids, lens = sequences.input_ids, sequences.lengths
    tokenizer = TextTokenizer(model_dir, TokenizerConfig())
    expected = [tokenizer.encode([t], RequestOptions(input_type=k)).input_ids.tolist() for k, t in pairs]
    assert lens == [len(e) for e in expected] and ids.tolist() == [t for e in expected for t in e]


LONG_DOC = " ".join(f"w{i} sentence {i}." for i in range(400))  # about 2,400 tokens


@pytest.mark.parametrize("input_type", ["query", "document"])
def test_chunking_splits_a_long_text_into_windows_of_its_own_tokens(tokenizer, input_type):
    options = RequestOptions(input_type=input_type, chunking="mean")
    tokens = tokenizer.encode_windows([LONG_DOC, "short one"], options)
    ids, lens, windows = tokens.input_ids, tokens.seq_lens, tokens.windows
    assert lens.sum() == ids.size and windows.sum() == lens.size and windows[1] == 1
    parts = np.split(ids, np.cumsum(lens)[:-1])
    tokens = tokenizer.encode(["short one"], options)
    plain = tokens.input_ids
    assert parts[-1].tolist() == plain.tolist()  # a text within the maximum: one window, as without chunking
    prefix = tokenizer._full.encode(tokenizer.prefixes[input_type], add_special_tokens=False).ids
    body = tokenizer._full.encode(LONG_DOC, add_special_tokens=False).ids
    cls, sep = parts[0][0], parts[0][-1]
    joined = []
    for part in parts[:windows[0]]:
        assert len(part) <= 256 and part[0] == cls and part[-1] == sep
        assert part[1:1 + len(prefix)].tolist() == prefix  # every window carries the template
        joined += part[1 + len(prefix):-1].tolist()
    assert joined == body and all(len(p) == 256 for p in parts[:windows[0] - 1])


def test_chunking_caps_windows_per_text(model_dir):
    small = TextTokenizer(model_dir, TokenizerConfig(max_windows_per_text=3))
    with pytest.raises(InputTooLarge, match=r"TEXT\[1\] needs more than 3 windows") as refused:
        small.encode_windows(["fine", LONG_DOC], RequestOptions(chunking="mean"))
    assert refused.value.field == "TEXT"


def test_chunking_option_values():
    assert RequestOptions.from_parameters({"chunking": "mean"}).chunking == "mean"
    assert RequestOptions.from_parameters({"chunking": None}).chunking == "none"
    with pytest.raises(InputError) as refused:
        RequestOptions.from_parameters({"chunking": "max"})
    assert refused.value.field == "chunking"
