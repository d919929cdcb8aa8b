"""int8/uint8 ranges of one served model, calibrated on its own embeddings of the shipped calibration texts.

The rule (docs/engine.md, "Quantized outputs"): the texts of
engine_lib/tokenization/calibration_texts.tsv are tokenized by the model's own
tokenizer and template (queries as queries, documents as documents), embedded by
the served engine, and their raw pooled rows kept. A request's ranges are then
the per-dimension min and max of those rows after the request's own `dimensions`
and `normalize` (outputs.finish_rows), so a Matryoshka cut gets ranges of cut rows.

The rows are computed once, on the first request that needs them, through the
service like any request, and cached as `<cache_dir>/calibration/<key>.npy`, where
the key hashes the model folder (model_folder.folder_fingerprint), the calibration
token ids and the engine's device type and dtype. The model folder is never written.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
from typing import Callable, Optional

import numpy as np

from engine_lib.contract import RaggedTokens
from engine_lib.options import RequestOptions
from engine_lib.service.outputs import finish_rows
from engine_lib.service.quantize import min_max

log = logging.getLogger(__name__)

def default_cache_dir() -> str:
    """$XDG_CACHE_HOME/rose, else ~/.cache/rose."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rose")


def cache_key(folder_fingerprint: str, sequences: RaggedTokens, engine_kind: str) -> str:
    digest = hashlib.sha256(f"{folder_fingerprint}\0{engine_kind}\0".encode())
    digest.update(np.ascontiguousarray(sequences.input_ids, dtype=np.int64).tobytes())
    digest.update(np.asarray(sequences.seq_lens, dtype=np.int64).tobytes())
    return digest.hexdigest()[:32]


class Calibration:
    """Raw calibration rows, computed at most once at a time; ranges per (dimensions, normalize)."""

    def __init__(self, sequences: Callable[[], RaggedTokens], cache_file: Callable[[RaggedTokens], Optional[str]]):
        """`sequences`: the calibration token ids; `cache_file`: where their rows are cached (None: nowhere)."""
        self._sequences = sequences
        self._cache_file = cache_file
        self._rows: Optional[np.ndarray] = None
        self._path: Optional[str] = None
        self._waiting: list[Callable[[Optional[Exception]], None]] = []
        self._running = False
        self._ranges: dict[tuple[int, bool], np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def ready(self) -> bool:
        return self._rows is not None

    def ranges(self, options: RequestOptions) -> np.ndarray:
        """[2, D'] float32: per-dimension min and max of the calibration rows as this request's rows are made."""
        key = (options.dimensions, options.normalize)
        if key not in self._ranges:
            self._ranges[key] = min_max(finish_rows(self._rows, options))
        return self._ranges[key]

    def when_ready(self, submit: Callable, then: Callable[[Optional[Exception]], None]) -> None:
        """Call `then(None)` once the rows exist (now, if they do), or `then(error)` if computing them
        failed. `submit(tokens, on_done)` queues the calibration sequences (BatchingService.submit)."""
        with self._lock:
            ready = self._rows is not None
            if not ready:
                self._waiting.append(then)
                start, self._running = not self._running, True
        if ready:
            then(None)
        elif start:
            self._start(submit)

    def _start(self, submit: Callable) -> None:
        try:
            sequences = self._sequences()
            self._path = self._cache_file(sequences)
            cached = self._load(self._path)
            if cached is not None:
                self._done(cached, None, from_cache=True)
                return
            log.info("calibrating int8 ranges on %d texts", len(sequences.seq_lens))
            submit(sequences, self._done)
        except Exception as exc:  # tokenizing, a refused submit: the waiting requests get the error
            self._done(None, exc)

    def _done(self, rows: Optional[np.ndarray], error: Optional[Exception], from_cache: bool = False) -> None:
        if rows is not None and not from_cache:
            rows = np.ascontiguousarray(rows, dtype=np.float32)
            self._save(self._path, rows)
        with self._lock:
            if rows is not None:
                self._rows = rows
            waiting, self._waiting, self._running = self._waiting, [], False
        if error is not None:
            error = RuntimeError(f"calibrating the int8 ranges failed: {error}")
        for then in waiting:
            try:
                then(error)
            except Exception:  # one waiter's failure must not leave the others unanswered
                log.exception("answering a request after calibration failed")

    @staticmethod
    def _load(path: Optional[str]) -> Optional[np.ndarray]:
        if not path or not os.path.isfile(path):
            return None
        try:
            rows = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            log.warning("calibration cache %s unreadable (%s); computing again", path, exc)
            return None
        return rows if rows.ndim == 2 and rows.dtype == np.float32 else None

    @staticmethod
    def _save(path: Optional[str], rows: np.ndarray) -> None:
        if not path:
            return
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            temporary = f"{path}.{os.getpid()}.tmp"
            with open(temporary, "wb") as f:
                np.save(f, rows, allow_pickle=False)
            os.replace(temporary, path)
        except OSError as exc:
            log.warning("cannot write the calibration cache %s (%s); kept in memory only", path, exc)
