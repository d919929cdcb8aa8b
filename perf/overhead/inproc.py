"""The same model in this process, no server: ModelRunner.step, the tokenizer, and BatchingService alone."""
from __future__ import annotations

import threading
import time

import numpy as np


class InProcess:
    def __init__(self, model_dir: str):
        import torch

        from engine_lib.config import TokenizerConfig
        from engine_lib.runner.model_runner import ModelRunner
        from engine_lib.tokenization.text import TextTokenizer

        self.engine = ModelRunner(model_dir)
        self.tokenizer = TextTokenizer(model_dir, TokenizerConfig())
        self.threads = torch.get_num_threads()
        self._service = None

    def service(self):
        if self._service is None:
            from engine_lib.service.batching import BatchingService
            from engine_lib.service.endpoint import Endpoint

            self._service = Endpoint(BatchingService(self.engine, 8192, 256))
        return self._service

    def step_ms(self, requests, threads: int | None = None) -> list[float]:
        """ModelRunner.step at torch's default intra-op threads, or at `threads` (then restored)."""
        import torch

        from engine_lib.contract import PackedBatch

        out = []
        if threads:
            torch.set_num_threads(threads)
        try:
            for request in requests:
                start = time.perf_counter()
                self.engine.step(PackedBatch.from_sequences([request.input_ids])).wait()
                out.append((time.perf_counter() - start) * 1e3)
        finally:
            torch.set_num_threads(self.threads)
        return out

    def tokenizer_ms(self, requests) -> list[float]:
        """What the tokenizer model does per request: decode the BYTES tensor, template, encode."""
        from engine_lib.options import RequestOptions

        out = []
        for request in requests:
            raw = np.array([t.encode() for t in request.texts], dtype=object)
            start = time.perf_counter()
            self.tokenizer.encode(self.tokenizer.decode_texts(raw), RequestOptions())
            out.append((time.perf_counter() - start) * 1e3)
        return out

    def service_ms(self, requests) -> list[float]:
        """Submit -> callback through the Endpoint (validation, BatchingService's threads, post-processing)."""
        from engine_lib.options import RequestOptions

        service, done, out = self.service(), threading.Event(), []
        for request in requests:
            done.clear()
            start = time.perf_counter()
            service.submit(request.input_ids, request.seq_lens, RequestOptions(), lambda rows, error: done.set())
            done.wait(60)
            out.append((time.perf_counter() - start) * 1e3)
        return out

    def close(self):
        if self._service is not None:
            self._service.close()
