"""The unary fronts (`embed`, `embed_batched`, `score`): their settings, and their BLS call to the encoder under a deadline."""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import Callable, Mapping

from engine_lib.errors import OverloadError
from engine_lib.service.outputs import default_outputs
from engine_lib.tokenization.steps import step_for_inputs
from engine_lib.tracing import enabled as traces_enabled

from .errors import relayed_error
from .faults import start_stub
from .parameters import config_from_parameters, config_parameters, input_names, output_names, sibling_parameters


@dataclass(frozen=True)
class FrontConfig:
    """A unary front's config.pbtxt parameters: the two models it chains, how long it waits for the
    encoder's answer (`bls_timeout_s`), and how many requests one instance has in flight before it
    refuses more (`max_requests_in_flight`); ROSE_<NAME> overrides each (rose_triton/parameters.py)."""
    tokenizer_model: str
    encoder_model: str
    bls_timeout_s: float = 120.0
    max_requests_in_flight: int = 64

    def __post_init__(self):
        if not self.tokenizer_model or not self.encoder_model:
            raise ValueError("set the parameters tokenizer_model and encoder_model")
        if not (isinstance(self.bls_timeout_s, (int, float)) and math.isfinite(self.bls_timeout_s)
                and self.bls_timeout_s > 0):
            raise ValueError(f"bls_timeout_s must be a number of seconds > 0, got {self.bls_timeout_s!r}")
        if not (isinstance(self.max_requests_in_flight, int) and self.max_requests_in_flight > 0):
            raise ValueError(f"max_requests_in_flight must be an integer > 0, got {self.max_requests_in_flight!r}")

    @classmethod
    def from_parameters(cls, params: Mapping[str, str], **overrides) -> "FrontConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"unknown parameter(s) {unknown}; known: {sorted(known)}")
        merged = {**params, **{k: v for k, v in overrides.items() if v is not None}}
        for name, kind, what in (("bls_timeout_s", float, "seconds"), ("max_requests_in_flight", int, "an integer")):
            if name in merged:
                try:
                    merged[name] = kind(merged[name])
                except ValueError:
                    raise ValueError(f"parameter {name}: expected {what}, got {merged[name]!r}") from None
        return cls(**{"tokenizer_model": "", "encoder_model": "", **merged})


@dataclass(frozen=True)
class FrontSetup:
    """What a unary front builds in `initialize`: its settings, its tensors, and the tokenize step of the
    tokenizer model it names, built from that model's parameters (so its ids equal the ensemble's)."""
    config: FrontConfig
    inputs: list[str]
    outputs: list[str]
    tokenize: Callable  # an engine_lib.tokenization.steps step: (tensors, parameters) -> wire tensors; .many
    default_outputs: tuple[str, ...]  # what the encoder is asked for when a request names nothing

    @classmethod
    def of(cls, args: dict) -> "FrontSetup":
        """From Triton's `initialize` args."""
        config = config_from_parameters(FrontConfig, config_parameters(args))
        inputs, outputs = input_names(args), output_names(args)
        step = step_for_inputs(inputs)
        tokenizer = config_from_parameters(step.config_cls, sibling_parameters(args, config.tokenizer_model))
        return cls(config, inputs, outputs, step(tokenizer), default_outputs(tokenizer.model_dir, outputs))


def initialize_front(model, args: dict, pb_utils) -> None:
    """A unary front's `initialize`: the stub's fault hooks, then FrontSetup's fields as the model's
    attributes (`config`, `inputs`, `outputs`, `tokenize`, `default_outputs`) and `traced`; a failure
    is the model's load error, naming it."""
    start_stub()
    model.traced = traces_enabled()
    try:
        front = FrontSetup.of(args)
    except Exception as exc:
        raise pb_utils.TritonModelException(f"{args['model_name']}: {exc!r}") from exc
    for name in ("config", "inputs", "outputs", "tokenize", "default_outputs"):
        setattr(model, name, getattr(front, name))


class AnswerLoop:
    """A unary front's requests in flight on an event loop of its own thread. `execute` hands each
    request over with its response sender and returns (Triton >= 2.48 lets a non-decoupled model
    answer through the sender), so one instance has many requests in flight, where an `async def
    execute` would have one (Triton 2.51 awaits a non-decoupled model's execute before it hands the
    instance the next request).

    The loop takes every request waiting at once: `answer_many(requests)` (called on the loop; must
    not raise) gives each its response as an awaitable, so requests that arrived while the loop was
    busy are answered together (rose_triton/batched.py answer_together: one tokenize call, one
    encoder call per group). An answer that raises is answered `failed(exception)`. Past
    `max_in_flight` requests a request is answered at once with `overloaded(max_in_flight)` (the
    front's UNAVAILABLE response); `send_final(sender, response)` must not raise.
    Sends wait for the server process (an IPC round trip), so they run in the executor, as do
    async_exec's waits for the encoder (a thread each while it waits)."""

    def __init__(self, name: str, max_in_flight: int, answer_many, overloaded, send_final, failed):
        self.max_in_flight, self.answer_many = max_in_flight, answer_many
        self.overloaded, self.send_final, self.failed = overloaded, send_final, failed
        self.loop = asyncio.new_event_loop()
        self.executor = concurrent.futures.ThreadPoolExecutor(2 * max_in_flight + 2, thread_name_prefix=f"{name}-io")
        self.loop.set_default_executor(self.executor)
        self.in_flight = 0
        self.waiting: list = []  # (request, sender, answered) not yet handed to answer_many
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"{name}-answers", daemon=True)
        self.thread.start()

    def submit(self, request, wait: bool = False) -> None:
        """`wait`: return once the request is answered (a request whose trace its BLS call carries:
        Triton frees the trace when `execute` returns, and a BLS call with it then crashes the server)."""
        sender = request.get_response_sender()
        answered = concurrent.futures.Future()
        with self.lock:
            admitted = self.in_flight < self.max_in_flight
            if admitted:
                self.in_flight += 1
                self.waiting.append((request, sender, answered))
                first_waiting = len(self.waiting) == 1
        if not admitted:
            self.send_final(sender, self.overloaded(self.max_in_flight))
            return
        if first_waiting:  # later ones join it until the loop takes them
            self.loop.call_soon_threadsafe(self._take_waiting)
        if wait:
            answered.result()

    def _take_waiting(self) -> None:
        with self.lock:
            taken, self.waiting = self.waiting, []
        try:
            answers = list(self.answer_many([request for request, _, _ in taken]))
            if len(answers) != len(taken):
                raise RuntimeError(f"the front gave {len(answers)} answers for {len(taken)} requests")
        except Exception as exc:  # a broken answer_many still answers every request
            answers = [self._raise(exc) for _ in taken]
        for (_, sender, answered), answer in zip(taken, answers):
            self.loop.create_task(self._send_when_answered(answer, sender, answered))

    @staticmethod
    async def _raise(exc):
        raise exc

    async def _send_when_answered(self, answer, sender, answered) -> None:
        try:
            response = await answer
        except Exception as exc:
            response = self.failed(exc)
        finally:
            with self.lock:
                self.in_flight -= 1
        try:
            await self.loop.run_in_executor(None, self.send_final, sender, response)
        finally:
            answered.set_result(None)

    def close(self, timeout_s: float = 5.0) -> None:
        """Let the requests in flight be answered (up to `timeout_s`), then stop the loop and its executor
        (a thread still blocked in an encoder wait is left to end with the stub)."""
        async def answered():
            pending = asyncio.all_tasks() - {asyncio.current_task()}
            if pending:
                await asyncio.wait(pending, timeout=timeout_s)

        try:
            asyncio.run_coroutine_threadsafe(answered(), self.loop).result(timeout_s + 1)
        except concurrent.futures.TimeoutError:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.executor.shutdown(wait=False, cancel_futures=True)


class EncoderTimeout(OverloadError):
    """The encoder did not answer a BLS call within `bls_timeout_s`: UNAVAILABLE on the wire
    (retry, or on another replica)."""


async def exec_decoupled(bls_request, encoder_model: str, timeout_s: float, barrier: Callable[[], object]):
    """`bls_request.async_exec(decoupled=True)` -> its responses, all of them; EncoderTimeout after `timeout_s`.

    Triton 2.51's async_exec waits for the first response in a thread of the event loop's
    default executor, and that wait cannot be interrupted: after a timeout the thread stays
    blocked until the encoder answers or the server restarts (the executor's size bounds how
    many), but the front answers and takes its next request.

    `barrier` must be the front's own `request.is_cancelled` (its answer is not used). The stub
    keeps a second reference to the call's response iterator, which its stub-to-parent thread
    drops, without the GIL, when it handles the clean-up the last response queued; if that
    reference is the last, the responses' tensors free their numpy arrays without the GIL
    (heap corruption: a rare segfault in libpython under load). `is_cancelled` is answered by
    the same thread in queue order, so once it returns the stub's reference is gone and the
    iterator here, the last one, is freed with the GIL."""
    try:
        iterator = await asyncio.wait_for(bls_request.async_exec(decoupled=True), timeout_s)
    except asyncio.TimeoutError:
        raise EncoderTimeout(f"{encoder_model} did not answer within {timeout_s:g} s (parameter bls_timeout_s "
                             f"of the unary front); retry, or on another replica") from None
    responses = list(iterator)  # to the final one: the encoder sends one final response per request
    barrier()
    return responses  # `iterator` is freed here, after the barrier


def encoder_answer(responses, wanted, encoder: str, pb_utils):
    """The encoder's answer among a BLS call's responses: (its tensors of `wanted`, in order, None), or
    (None, its error with the code the message encodes: BLS hands every error over as INTERNAL)."""
    for response in responses:
        if response.has_error():
            return None, relayed_error(pb_utils, response.error())
        tensors = [pb_utils.get_output_tensor_by_name(response, n) for n in wanted]
        if all(t is not None for t in tensors):
            return tensors, None
    raise RuntimeError(f"{encoder} returned no {list(wanted)}")
