"""Ray Data integration: embed a Dataset's text column over a fleet, from an actor pool.

    ds.map_batches(RoseEmbedder, fn_constructor_kwargs={"urls": ["host1:8001", "host2:8001"]},
                   concurrency=4, batch_size=256)

Each actor holds one EmbeddingClient (client.py, the bulk CLI's client): a batch's texts are
split into token-sized chunks spread over every replica, a chunk that fails on one replica is
retried on another (up to `max_attempts`), and the rows come back in the batch's order, added as
the `output_column` (a list of float32 per row) beside the batch's own columns (ids kept). Before
its first batch an actor probes every replica, as the bulk CLI does: replicas serving different
models fail it (ModelMismatch), a replica that does not answer is left out.

Ray is not a dependency of the service or of rose_client: install it (`pip install "ray[data]"`)
where the pipeline runs. This module imports nothing of Ray."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from rose_wire import ENSEMBLE

from .client import EmbeddingClient
from .scheduling import RetryPolicy
from .tokens import ByteEstimator, TokenizerCounter


class RoseEmbedder:
    """A callable class for `Dataset.map_batches` (batch_format "numpy" or "pandas")."""

    def __init__(self, urls: Sequence[str], *, model: str = ENSEMBLE, text_column: str = "text",
                 output_column: str = "embedding", input_type: str = "document", dimensions: int = 0,
                 normalize: bool = True, truncate: bool = True, priority: str = "batch",
                 max_inflight_per_replica: int = 4, max_chunk_tokens: int = 4096, max_chunk_texts: int = 256,
                 tokenizer: str | None = None, timeout: float = 300.0, max_attempts: int = 4):
        """`urls`: Triton gRPC addresses (dns:///name:port for every address a name resolves to);
        `model`: ensemble (the default model) or a model served by name; the rest as the bulk CLI's
        flags of the same names (python -m rose_client.bulk --help)."""
        self.text_column, self.output_column = text_column, output_column
        self.client = EmbeddingClient(
            urls, model=model, max_inflight_per_replica=max_inflight_per_replica, max_chunk_tokens=max_chunk_tokens,
            max_chunk_texts=max_chunk_texts, request_timeout=timeout, retry=RetryPolicy(max_attempts=max_attempts),
            token_counter=TokenizerCounter(tokenizer) if tokenizer else ByteEstimator())
        self.parameters = {"input_type": input_type, "dimensions": dimensions, "normalize": normalize,
                           "truncate": truncate}
        self.client.model_identity(self.parameters)  # every replica serves one model; silent ones are left out
        self.parameters["priority_class"] = priority

    def __call__(self, batch):
        texts = [str(text) for text in batch[self.text_column]]
        rows = self.client.embed(texts, self.parameters) if texts else np.zeros((0, 0), np.float32)
        column = np.empty(len(texts), dtype=object)
        column[:] = list(rows)  # one float32 array per row: a list column in Arrow and Parquet
        if hasattr(batch, "assign"):  # pandas
            return batch.assign(**{self.output_column: column})
        return {**batch, self.output_column: column}
