"""sentence-transformers' side of the compact-type checks (tests/e2e): the calibration rule run
by sentence-transformers, and served rows of every type compared with its own."""
from __future__ import annotations

import numpy as np

from engine_lib.runner.self_check import MIN_COSINE
from engine_lib.tokenization.calibration import calibration_texts

TYPES = ("int8", "uint8", "binary", "ubinary")


def st_calibration_rows(model) -> np.ndarray:
    """The shipped calibration texts embedded by a SentenceTransformer (raw rows, file order):
    queries with its query prompt and documents with its document prompt, where it has them."""
    pairs = calibration_texts()
    rows = np.zeros((len(pairs), model.get_embedding_dimension()), dtype=np.float32)
    for kind in ("query", "document"):
        at = [i for i, (k, _) in enumerate(pairs) if k == kind]
        rows[at] = model.encode([pairs[i][1] for i in at], normalize_embeddings=False,
                                prompt_name=kind if kind in model.prompts else None)
    return rows


def ranges_of(rows: np.ndarray, dimensions: int = 0) -> np.ndarray:
    """The calibration rule: min and max per dimension of the rows cut to `dimensions`, normalised."""
    if dimensions:
        rows = rows[:, :dimensions]
    rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return np.vstack((rows.min(axis=0), rows.max(axis=0)))


def check_types(floats: np.ndarray, compact: dict, ranges: np.ndarray, st_rows: np.ndarray,
                st_ranges: np.ndarray) -> None:
    """Served float rows, {type: served rows} and the served ranges against sentence-transformers'
    rows and its run of the calibration: floats cosine >= MIN_COSINE; the ranges equal; each
    type exactly quantize_embeddings of the served floats, int8/uint8 within one step of
    quantize_embeddings of sentence-transformers' rows, binary bit-exact with it but for signs
    within float noise of zero."""
    from sentence_transformers.util.quantization import quantize_embeddings

    assert floats.shape == st_rows.shape and ranges.shape == (2, st_rows.shape[1])
    assert (floats * st_rows).sum(axis=1).min() >= MIN_COSINE
    np.testing.assert_allclose(ranges, st_ranges, atol=2e-5)
    for precision, ours in compact.items():
        kwargs = {"ranges": ranges} if precision.endswith("int8") else {}
        np.testing.assert_array_equal(ours, quantize_embeddings(floats, precision, **kwargs), err_msg=precision)
        theirs = quantize_embeddings(st_rows, precision, **kwargs)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, precision
        if precision.endswith("int8"):
            assert np.abs(ours.astype(np.int32) - theirs.astype(np.int32)).max() <= 1, precision
        else:
            differing = np.unpackbits((ours ^ theirs).view(np.uint8), axis=1)[:, :st_rows.shape[1]].astype(bool)
            assert not differing[np.abs(st_rows) > 1e-5].any(), precision
