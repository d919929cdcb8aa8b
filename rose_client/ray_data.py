"""Ray Data integration: embed a Dataset's text column over a fleet, from an actor pool.

    ds.map_batches(RoseEmbedder, fn_constructor_kwargs={"urls": ["host1:8001", "host2:8001"]},
                   concurrency=4, batch_size=256)

Each actor holds one EmbeddingClient (client.py, the bulk CLI's client): a batch's texts are
split into token-sized chunks spread over every replica, a chunk that fails on one replica is
retried on another (up to `max_attempts`), and the rows come back in the batch's order, added as
the `output_column` (one float32 vector per row) beside the batch's own columns (ids kept). Before
its first batch an actor probes every replica, as the bulk CLI does: replicas serving different
models fail it (ModelMismatch), a replica that does not answer is left out.
With `gateway=` instead of `urls`, an actor sends the batch to the gateway's /v1/embeddings in
requests of at most `max_chunk_texts` texts (the gateway splits and spreads them), trying a
request again on 429, 503 and lost connections (after Retry-After), up to `max_attempts`.

Ray is not a dependency of the service or of rose_client: install it (`pip install "ray[data]"`)
where the pipeline runs. This module imports nothing of Ray."""
from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from typing import Sequence

import numpy as np

from rose_wire import ENSEMBLE

from .client import EmbeddingClient

DEFAULT_GATEWAY_MODEL = "all-MiniLM-L6-v2"  # the gateway's name of the default model
from .scheduling import RetryPolicy
from .tokens import ByteEstimator, TokenizerCounter


class RoseEmbedder:
    """A callable class for `Dataset.map_batches` (batch_format "numpy" or "pandas")."""

    def __init__(self, urls: Sequence[str] = (), *, gateway: str = "", api_key: str = "", model: str | None = None,
                 text_column: str = "text",
                 output_column: str = "embedding", input_type: str = "document", dimensions: int = 0,
                 normalize: bool = True, truncate: bool = True, priority: str = "batch",
                 max_inflight_per_replica: int = 4, max_chunk_tokens: int = 4096, max_chunk_texts: int = 256,
                 tokenizer: str | None = None, timeout: float = 300.0, max_attempts: int = 4):
        """`urls`: Triton gRPC addresses (dns:///name:port for every address a name resolves to);
        `model`: ensemble (the default model, the default) or a model served by name; the rest as the bulk CLI's
        flags of the same names (python -m rose_client.bulk --help). `gateway`: the gateway's base
        URL (http://host:8080) instead of `urls`, with `api_key` and `model` its served name."""
        if bool(urls) == bool(gateway):
            raise ValueError("give either `urls` (Triton replicas) or `gateway` (its base URL)")
        self.text_column, self.output_column = text_column, output_column
        if gateway:
            self.embed = GatewayEmbedder(gateway, api_key, model or DEFAULT_GATEWAY_MODEL, input_type, dimensions, truncate, priority,
                                         max_chunk_texts, timeout, max_attempts)
            return
        self.client = EmbeddingClient(
            urls, model=model or ENSEMBLE, max_inflight_per_replica=max_inflight_per_replica, max_chunk_tokens=max_chunk_tokens,
            max_chunk_texts=max_chunk_texts, request_timeout=timeout, retry=RetryPolicy(max_attempts=max_attempts),
            token_counter=TokenizerCounter(tokenizer) if tokenizer else ByteEstimator())
        self.parameters = {"input_type": input_type, "dimensions": dimensions, "normalize": normalize,
                           "truncate": truncate}
        self.client.model_identity(self.parameters)  # every replica serves one model; silent ones are left out
        self.parameters["priority_class"] = priority
        self.embed = lambda texts: self.client.embed(texts, self.parameters)

    def __call__(self, batch):
        texts = [str(text) for text in batch[self.text_column]]
        rows = self.embed(texts) if texts else np.zeros((0, 0), np.float32)
        column = np.empty(len(texts), dtype=object)
        column[:] = list(rows)  # one float32 array per row: a list column in Arrow and Parquet
        if hasattr(batch, "assign"):  # pandas
            return batch.assign(**{self.output_column: column})
        return {**batch, self.output_column: column}


class GatewayEmbedder:
    """texts -> rows through the gateway's /v1/embeddings (base64 on the wire), in requests of at
    most `max_texts`; a request the gateway answers 429 or 503, or whose connection fails, is
    sent again after Retry-After (else 1 s), up to `max_attempts` times; any other error raises."""
    RETRY = (429, 502, 503, 504)

    def __init__(self, base_url: str, api_key: str, model: str, input_type: str, dimensions: int, truncate: bool,
                 priority: str, max_texts: int, timeout: float, max_attempts: int):
        self.url = base_url.rstrip("/") + "/v1/embeddings"
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"}
                                                               if api_key else {})}
        self.body = {"model": model, "encoding_format": "base64",
                     "input_type": input_type, "truncate": truncate, "priority": priority,
                     **({"dimensions": dimensions} if dimensions else {})}
        self.max_texts, self.timeout, self.max_attempts = max_texts, timeout, max_attempts

    def __call__(self, texts: list[str]) -> np.ndarray:
        return np.concatenate([self._request(texts[i:i + self.max_texts])
                               for i in range(0, len(texts), self.max_texts)])

    def _request(self, texts: list[str]) -> np.ndarray:
        data = json.dumps({**self.body, "input": texts}).encode()
        for attempt in range(1, self.max_attempts + 1):
            try:
                request = urllib.request.Request(self.url, data, self.headers)
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    items = json.load(response)["data"]
                return np.stack([np.frombuffer(base64.b64decode(item["embedding"]), "<f4") for item in items])
            except urllib.error.HTTPError as exc:
                if exc.code not in self.RETRY or attempt == self.max_attempts:
                    raise RuntimeError(f"{self.url} answered {exc.code}: {exc.read()[:500]!r}") from None
                wait_s = float(exc.headers.get("Retry-After") or 1)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if attempt == self.max_attempts:
                    raise
                wait_s = 1.0
            time.sleep(wait_s)
        raise AssertionError("unreachable")
