"""What the encoder answers per request: embedding rows (float and compact types) or one score per document.

The service hands back raw engine rows per request; `answer` turns them into
the response tensors by name (`finish`: the first output alone), `check` refuses
options the model cannot honour, `select` decides which outputs a request gets.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from engine_lib.errors import InputError
from engine_lib.model_folder import ModelFolder
from engine_lib.options import RequestOptions, RerankOptions, parse_embedding_types
from engine_lib.retrieval import OFFERED, retrieval_kind
from engine_lib.service.quantize import pack_signs, quantize_scalar
from rose_wire import EMBEDDINGS, OUTPUT_OF_TYPE, OUTPUTS_OF_RAGGED_TYPE, SCORES

TYPE_OF_OUTPUT = {name: kind for kind, name in OUTPUT_OF_TYPE.items()}
# sparse / multivector: the retrieval kinds' types (retrieval_outputs.py); a dense model refuses them
TYPE_OF_RAGGED_OUTPUT = {name: kind for kind, names in OUTPUTS_OF_RAGGED_TYPE.items() for name in names}
CALIBRATED_TYPES = ("int8", "uint8", "int8_ranges")  # need the model's calibrated ranges


def select_outputs(declared: Sequence[str], requested: Sequence[str], from_parameter: Sequence[str],
                   default: Sequence[str] = ()) -> list[str]:
    """The outputs a request gets, in `declared` order. Outputs the client named (requested
    outputs) are what Triton passes back to it, so they decide. When every declared output is
    requested, none was named: Triton requests them all then, and an ensemble asks its steps for
    all their mapped outputs whatever its client named; the parameter `embedding_types`
    (`from_parameter`, tensor names) decides, else `default` (the model's default type's outputs), else
    the first declared output (EMBEDDINGS, SCORES)."""
    if requested and set(requested) != set(declared):
        wanted = set(requested)
    else:
        wanted = set(from_parameter)
    return [n for n in declared if n in wanted] or [n for n in declared if n in default] or list(declared[:1])


def _type_outputs(kind: str) -> tuple[str, ...]:
    return OUTPUTS_OF_RAGGED_TYPE.get(kind, (OUTPUT_OF_TYPE.get(kind),))


def requested_outputs(parameters: dict | str | None, requested: Sequence[str], declared: Sequence[str],
                      default: Sequence[str] = ()) -> list[str]:
    """select_outputs from a request's raw parameters (the unary fronts: the BLS call's outputs)."""
    if isinstance(parameters, dict) and EMBEDDINGS in declared:
        named = [name for t in parse_embedding_types(parameters.get("embedding_types")) for name in _type_outputs(t)]
    else:
        named = []
    return select_outputs(declared, requested, named, default)


def default_outputs(model_dir: str, declared: Sequence[str]) -> tuple[str, ...]:
    """What a unary front asks its encoder for when the client names no output nor type: the outputs of
    the model's default type (a SPLADE or ColBERT model gives no EMBEDDINGS); () = the first declared."""
    kind = retrieval_kind(ModelFolder.open(model_dir)) if EMBEDDINGS in declared else None
    return _type_outputs(OFFERED[kind][0]) if kind else ()


def pool_windows(rows: np.ndarray, seq_lens: Sequence[int], windows: np.ndarray) -> np.ndarray:
    """Raw rows of every window [num_windows, H] -> one per text [len(windows), H]: the mean of a
    text's windows' rows weighted by their token counts (chunking=mean; before `dimensions`)."""
    weights = np.asarray(seq_lens, dtype=np.float64)
    starts = np.concatenate([[0], np.cumsum(windows)[:-1]])
    sums = np.add.reduceat(rows.astype(np.float64) * weights[:, None], starts, axis=0)
    return (sums / np.add.reduceat(weights, starts)[:, None]).astype(np.float32)


def normalize_rows(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)


def finish_rows(rows: np.ndarray, options: RequestOptions) -> np.ndarray:
    """Raw pooled rows [N, H] -> the answer: first `dimensions` columns, then normalised; fp32, contiguous."""
    if options.dimensions:
        rows = rows[:, :options.dimensions]
    if options.normalize:
        rows = normalize_rows(rows)
    return np.ascontiguousarray(rows, dtype=np.float32)


class EmbeddingOutput:
    """EMBEDDINGS FP32 [N, D]: Matryoshka cut (`dimensions`), then L2 normalisation (`normalize`);
    from those rows the compact types (quantize.py) and the int8 ranges they used."""

    name = EMBEDDINGS
    options_type = RequestOptions

    def __init__(self, width: int):
        self.width = width

    def select(self, options: RequestOptions, requested: Sequence[str], declared: Sequence[str]) -> RequestOptions:
        """`options` with `embedding_types` set to the types this request gets (select_outputs)."""
        named = [n for t in options.embedding_types for n in OUTPUTS_OF_RAGGED_TYPE.get(t) or (OUTPUT_OF_TYPE[t],)]
        names = select_outputs(declared, requested, named)
        kinds = (TYPE_OF_OUTPUT.get(n) or TYPE_OF_RAGGED_OUTPUT[n] for n in names)
        return dataclasses.replace(options, embedding_types=tuple(dict.fromkeys(kinds)))

    def check(self, options: RequestOptions) -> None:
        for kind in options.embedding_types:
            if kind in OUTPUTS_OF_RAGGED_TYPE:
                raise InputError(f"embedding type {kind!r} is not given by this model (a dense embedder; "
                                 f"sparse and multivector need a BGE-M3 or SPLADE model)", "embedding_types")
        options.check_width(self.width)

    @staticmethod
    def needs_ranges(options: RequestOptions) -> bool:
        return any(t in CALIBRATED_TYPES for t in options.embedding_types)

    @staticmethod
    def only_ranges(options: RequestOptions) -> bool:
        return options.embedding_types == ("int8_ranges",)

    def finish(self, rows: np.ndarray, options: RequestOptions) -> np.ndarray:
        return finish_rows(rows, options)

    def answer(self, rows: np.ndarray | None, options: RequestOptions, calibration=None) -> dict[str, np.ndarray]:
        """-> {tensor name: array} for each of `options.embedding_types` (float alone when none).
        `calibration` (calibration.Calibration, ready) gives the int8 ranges; `rows` None: ranges only."""
        kinds = options.embedding_types or ("float",)
        ranges = calibration.ranges(options) if self.needs_ranges(options) else None
        floats = self.finish(rows, options) if rows is not None else None
        made = {"int8_ranges": lambda: ranges,
                "float": lambda: floats,
                "int8": lambda: quantize_scalar(floats, ranges, signed=True),
                "uint8": lambda: quantize_scalar(floats, ranges, signed=False),
                "binary": lambda: pack_signs(floats, signed=True),
                "ubinary": lambda: pack_signs(floats, signed=False)}
        return {OUTPUT_OF_TYPE[kind]: made[kind]() for kind in kinds}


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)  # no overflow warning for large |x|


class ScoreOutput:
    """SCORES FP32 [N]: the logit (`raw_scores`) or the model's activation of it."""

    name = SCORES
    options_type = RerankOptions
    ACTIVATIONS = {"sigmoid": sigmoid, "identity": lambda x: x}

    def __init__(self, activation: str):
        if activation not in self.ACTIVATIONS:
            raise ValueError(f"unknown score activation {activation!r}")
        self.activation = activation

    def select(self, options: RerankOptions, requested: Sequence[str], declared: Sequence[str]) -> RerankOptions:
        return options

    def check(self, options: RerankOptions) -> None:
        pass

    @staticmethod
    def needs_ranges(options: RerankOptions) -> bool:
        return False

    @staticmethod
    def only_ranges(options: RerankOptions) -> bool:
        return False

    def finish(self, rows: np.ndarray, options: RerankOptions) -> np.ndarray:
        logits = rows[:, 0].astype(np.float64)
        scores = logits if options.raw_scores else self.ACTIVATIONS[self.activation](logits)
        return np.ascontiguousarray(scores, dtype=np.float32)

    def answer(self, rows: np.ndarray, options: RerankOptions, calibration=None) -> dict[str, np.ndarray]:
        return {SCORES: self.finish(rows, options)}


def output_for(engine):
    """The answer an engine's task calls for."""
    if getattr(engine, "retrieval_kind", None):
        from engine_lib.service.retrieval_outputs import RetrievalOutput

        return RetrievalOutput(engine.retrieval_kind, engine.dense_dim)
    if engine.task == "score":
        return ScoreOutput(engine.score_activation)
    return EmbeddingOutput(engine.output_dim)
