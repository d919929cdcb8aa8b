"""One asyncio gRPC stream to one replica, carrying at most one request at a time.

Triton's stream callback reports an error without the request id, so a stream
is only unambiguous with a single request outstanding: a replica gets several
slots (streams) instead of several requests on one stream. A replica's slots
share one channel (`ReplicaChannel`).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc
import numpy as np
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from rose_wire import INVALID_ARG, UNAVAILABLE, WireError, decode

_CLOSE = object()


class ReplicaError(RuntimeError):
    """A chunk failed on a replica (transport error, timeout, error response); `wire`: the
    code, field and message the server's text carries (code None when it carries none)."""

    def __init__(self, url: str, message: str):
        super().__init__(f"{url}: {message}")
        self.url = url
        self.wire: WireError = decode(message)

    @property
    def input_rejected(self) -> bool:
        """The request itself is at fault: every replica would refuse it the same way (not retried)."""
        return self.wire.code == INVALID_ARG

    @property
    def overloaded(self) -> bool:
        """Admission control refused it (encoder queue or Triton's queue policy full): retry later."""
        return self.wire.code == UNAVAILABLE


class PayloadError(ValueError):
    """A call cannot be put on the wire (a tensor that does not convert, a parameter gRPC cannot
    carry): the same on every replica; nothing was sent."""


INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class Call:
    """One request: `inputs` by name (numpy; object arrays are BYTES), one output read back, or
    with `outputs` several ({name: array} back)."""
    model: str
    inputs: dict[str, np.ndarray]
    output: str
    parameters: dict = field(default_factory=dict)
    rows: int | None = None  # expected length of each output's first axis
    outputs: tuple[str, ...] = ()  # requested instead of `output` when given


def _tensor(name: str, array: np.ndarray) -> InferInput:
    tensor = InferInput(name, list(array.shape), "BYTES" if array.dtype == np.object_ else np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def _request(call: Call) -> dict:
    """The stream request for `call`, checked here: gRPC would otherwise fail to serialise it
    inside the stream and cancel the call (no error naming the cause)."""
    for name, value in (call.parameters or {}).items():
        if isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
            raise PayloadError(f"request parameter {name!r} = {value} does not fit int64")
        if not isinstance(value, (str, bool, int, float)):
            raise PayloadError(f"request parameter {name!r} is a {type(value).__name__}: gRPC carries "
                               f"strings, booleans, int64 and floats")
    try:
        inputs = [_tensor(n, a) for n, a in call.inputs.items()]
    except (InferenceServerException, ValueError, TypeError) as exc:
        message = exc.message() if isinstance(exc, InferenceServerException) else str(exc)
        raise PayloadError(f"an input tensor does not convert: {message}") from None
    return {"model_name": call.model, "inputs": inputs,
            "outputs": [InferRequestedOutput(n) for n in call.outputs or (call.output,)],
            "parameters": call.parameters or None}


class ReplicaChannel:
    """The aio client (one HTTP/2 connection) of one replica."""

    def __init__(self, url: str):
        self.url = url
        self.client = aioclient.InferenceServerClient(url)
        # Bumped when a stream of this replica breaks (e.g. the server restarted):
        # the other slots' idle streams are as dead, so each reopens before its next call.
        self.generation = 0
        self.slots: list[AsyncStreamSlot] = []

    def drop_idle_streams(self) -> None:
        """Close the streams no call is using: a stopping Triton waits for open streams
        (up to its exit timeout) before it exits."""
        self.generation += 1
        for slot in self.slots:
            if not slot.busy:
                slot._reset()

    async def is_ready(self, model: str | None = None, timeout: float = 2.0) -> bool:
        """Server ready (false while it stops), and `model` ready when given."""
        try:
            if not await self.client.is_server_ready(client_timeout=timeout):
                return False
            return model is None or await self.client.is_model_ready(model, client_timeout=timeout)
        except (InferenceServerException, grpc.RpcError, asyncio.TimeoutError):
            return False

    async def close(self) -> None:
        await self.client.close()


class AsyncStreamSlot:
    def __init__(self, channel: ReplicaChannel, request_timeout: float = 300.0):
        self.channel = channel
        self.url = channel.url
        self.request_timeout = request_timeout
        self._requests: asyncio.Queue | None = None
        self._responses = None
        self._generation = 0
        self.busy = False
        channel.slots.append(self)

    async def call(self, call: Call) -> np.ndarray | dict[str, np.ndarray]:
        """-> the output array ({name: array} for `outputs`); raises ReplicaError (and resets the
        stream), or PayloadError (nothing sent)."""
        request = _request(call)
        self.busy = True
        try:
            self._open()
            await self._requests.put(request)
            result, error = await asyncio.wait_for(self._responses.__anext__(), self.request_timeout)
        except asyncio.CancelledError:
            self._reset()  # its reply would otherwise answer the next call
            raise
        except asyncio.TimeoutError:
            self._reset()
            raise ReplicaError(self.url, f"no response within {self.request_timeout:.0f}s") from None
        except InferenceServerException as exc:
            self._reset()
            raise ReplicaError(self.url, exc.message()) from None
        except grpc.RpcError as exc:
            self._broken()
            raise ReplicaError(self.url, f"[{exc.code()}] {exc.details()}") from None
        except StopAsyncIteration:
            self._broken()
            raise ReplicaError(self.url, "stream closed by the server") from None
        finally:
            self.busy = False
        if error is not None:
            self._reset()
            raise ReplicaError(self.url, error.message())
        arrays = {}
        for name in call.outputs or (call.output,):
            rows = result.as_numpy(name)
            if rows is None or (call.rows is not None and (rows.ndim < 1 or rows.shape[0] != call.rows)):
                self._reset()
                raise ReplicaError(self.url, f"{name} shape {None if rows is None else list(rows.shape)} "
                                             f"for {call.rows} rows")
            arrays[name] = rows
        return arrays if call.outputs else arrays[call.output]

    async def is_ready(self) -> bool:
        return await self.channel.is_ready()

    def _broken(self) -> None:
        self.channel.generation += 1
        self._reset()

    def _open(self) -> None:
        if self._responses is not None and self._generation != self.channel.generation:
            self._reset()
        if self._responses is None:
            self._requests = asyncio.Queue()
            self._responses = self.channel.client.stream_infer(_feed(self._requests))
            self._generation = self.channel.generation

    async def close(self) -> None:
        """The slot's end (its worker's): drop the stream and leave the channel's list. A failed call
        only resets the stream (`_reset`): the slot stays listed, so drop_idle_streams reaches its next one."""
        self._reset()
        if self in self.channel.slots:
            self.channel.slots.remove(self)

    def _reset(self) -> None:
        """Drop the stream; a reply still owed to it is discarded."""
        if self._responses is not None:
            self._requests.put_nowait(_CLOSE)
            self._responses.cancel()
        self._requests = self._responses = None


async def _feed(requests: asyncio.Queue):
    while (request := await requests.get()) is not _CLOSE:
        yield request
