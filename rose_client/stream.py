"""One gRPC stream to one replica, carrying at most one request at a time.

Triton's stream callback reports an error without the request id, so a stream
is only unambiguous with a single request outstanding: a replica gets several
slots (streams) instead of several requests on one stream.
"""
from __future__ import annotations

import functools
import itertools
import queue

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from rose_triton.errors import code_name_from_message


class ReplicaError(RuntimeError):
    """A chunk failed on a replica (transport error, timeout, error response)."""

    def __init__(self, url: str, message: str):
        super().__init__(f"{url}: {message}")
        self.url = url
        # The server tags errors caused by the request itself (docs/operations.md):
        # every replica would refuse it the same way, so it is not retried.
        code = code_name_from_message(message)
        self.input_rejected = code == "INVALID_ARG"
        # Admission control refused it (encoder queue or Triton's queue policy full): retry later.
        self.overloaded = code == "UNAVAILABLE"


def _text_tensor(texts: list[str]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("TEXT", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode("utf-8") for t in texts], dtype=np.object_))
    return tensor


class StreamSlot:
    def __init__(self, url: str, model: str = "ensemble", request_timeout: float = 300.0):
        self.url = url
        self.model = model
        self.request_timeout = request_timeout
        self._client: grpcclient.InferenceServerClient | None = None
        self._responses: queue.Queue | None = None
        self._request_ids = itertools.count()

    def embed(self, texts: list[str], parameters: dict | None = None) -> np.ndarray:
        """-> EMBEDDINGS [len(texts), D]; raises ReplicaError (and resets the stream)."""
        try:
            responses = self._open()
            self._client.async_stream_infer(self.model, [_text_tensor(texts)], parameters=parameters,
                                            request_id=str(next(self._request_ids)))
            result, error = responses.get(timeout=self.request_timeout)
        except InferenceServerException as exc:
            self.reset()
            raise ReplicaError(self.url, exc.message()) from None
        except queue.Empty:
            self.reset()
            raise ReplicaError(self.url, f"no response within {self.request_timeout:.0f}s") from None
        if error is not None:
            self.reset()
            raise ReplicaError(self.url, error.message())
        rows = result.as_numpy("EMBEDDINGS")
        if rows is None or rows.ndim != 2 or rows.shape[0] != len(texts):
            self.reset()
            shape = None if rows is None else list(rows.shape)
            raise ReplicaError(self.url, f"EMBEDDINGS shape {shape} for {len(texts)} texts")
        return rows

    def is_ready(self, timeout: float = 2.0) -> bool:
        """Server health, without touching the stream."""
        client = grpcclient.InferenceServerClient(self.url)
        try:
            return client.is_server_ready(client_timeout=timeout)
        except InferenceServerException:
            return False
        finally:
            client.close()

    def reset(self) -> None:
        """Drop the stream; responses still owed to it land in a discarded queue."""
        if self._client is not None:
            try:
                self._client.stop_stream(cancel_requests=True)
            finally:
                self._client.close()
        self._client = None
        self._responses = None

    close = reset

    def _open(self) -> queue.Queue:
        if self._client is None:
            responses: queue.Queue = queue.Queue()
            client = grpcclient.InferenceServerClient(self.url)
            client.start_stream(callback=functools.partial(_deliver, responses))
            self._client, self._responses = client, responses
        return self._responses


def _deliver(responses: queue.Queue, result, error) -> None:
    responses.put((result, error))
