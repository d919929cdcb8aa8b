"""Our packed BERT engine vs sentence-transformers on the same weights, in-process."""
import numpy as np
import pytest

from engine_lib.config import TokenizerConfig
from engine_lib.contract import PackedBatch
from engine_lib.options import RequestOptions
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.runner.self_check import MIN_COSINE
from engine_lib.service.outputs import normalize_rows
from engine_lib.tokenization.text import TextTokenizer
from testing.texts import VARIED_TEXTS


# bfloat16 on a CPU is opt-in (dtype=bfloat16: oneDNN's bf16 GEMMs where the CPU has AVX512-BF16 or AMX,
# emulated elsewhere); it must meet the same bar as the default.
@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_packed_batch_matches_reference(model_dir, reference_model, dtype):
    tokenizer = TextTokenizer(model_dir, TokenizerConfig())
    tokens = tokenizer.encode(VARIED_TEXTS, RequestOptions())
    ids, lens = tokens.input_ids, tokens.seq_lens
    assert lens.max() == 256  # the long texts were truncated to the model's maximum
    bounds = np.concatenate([[0], np.cumsum(lens)])
    batch = PackedBatch.from_sequences([ids[bounds[i]:bounds[i + 1]] for i in range(len(lens))])
    ours = normalize_rows(ModelRunner(model_dir, dtype=dtype).step(batch).wait())
    ref = reference_model.encode(VARIED_TEXTS, normalize_embeddings=True)
    cosines = (ours * ref).sum(axis=1)
    low = {VARIED_TEXTS[i][:40]: float(c) for i, c in enumerate(cosines) if c < MIN_COSINE}
    assert cosines.min() >= MIN_COSINE, low


def test_token_ids_match_reference_tokenizer(model_dir, reference_model):
    tokenizer = TextTokenizer(model_dir, TokenizerConfig())
    tokens = tokenizer.encode(VARIED_TEXTS, RequestOptions())
    ids, lens = tokens.input_ids, tokens.seq_lens
    features = reference_model.tokenize(VARIED_TEXTS)
    ref_lens = features["attention_mask"].sum(1).numpy()
    np.testing.assert_array_equal(lens, ref_lens)
    ref_ids = np.concatenate([row[:n] for row, n in zip(features["input_ids"].numpy(), ref_lens)])
    np.testing.assert_array_equal(ids, ref_ids)
