"""The int8 calibration texts as a model's token ids (engine_lib/service/calibration.py embeds them).

calibration_texts.tsv holds one text a line, `query<TAB>text` or `document<TAB>text`:
short web-search queries and passages on many topics (a few in other languages, code,
a log line), written for this repository. Each is tokenized as a request of that
input_type would be with the folder's own template and limits (TokenizerConfig defaults).
"""
from __future__ import annotations

import os

from engine_lib.config import TokenizerConfig
from engine_lib.contract import RaggedTokens
from engine_lib.options import RequestOptions
from engine_lib.tokenization.text import TextTokenizer

CALIBRATION_TEXTS = os.path.join(os.path.dirname(__file__), "calibration_texts.tsv")


def calibration_texts(path: str = CALIBRATION_TEXTS) -> list[tuple[str, str]]:
    """[(input_type, text)] in file order."""
    with open(path, encoding="utf-8") as f:
        pairs = [tuple(line.rstrip("\n").split("\t", 1)) for line in f if line.strip()]
    bad = [p for p in pairs if len(p) != 2 or p[0] not in ("query", "document") or not p[1].strip()]
    if bad:
        raise ValueError(f"{path}: malformed line {bad[0]!r}")
    return pairs


def calibration_sequences(model_dir: str) -> RaggedTokens:
    """The calibration texts for the model in `model_dir`, one sequence each, in file order."""
    tokenizer = TextTokenizer(model_dir, TokenizerConfig(model_dir=model_dir))
    encoded = [tokenizer.encode([text], RequestOptions(input_type=input_type)).input_ids.tolist()
               for input_type, text in calibration_texts()]
    return RaggedTokens.from_rows(encoded)
