"""rose_triton: engine errors on the wire (code, field) survive any wrapping; config parameters and launcher overrides."""
from __future__ import annotations

import asyncio
import json
import queue
import threading

import pytest

from engine_lib.config import EncoderConfig, PairTokenizerConfig, TokenizerConfig
from engine_lib.errors import InputError, OverloadError, RequestCancelled
from rose_triton.errors import relayed_error, triton_error, wire_error
from rose_triton.front import AnswerLoop, EncoderTimeout, FrontConfig, exec_decoupled
from rose_triton.parameters import (
    config_from_parameters,
    config_from_pbtxt,
    config_parameters,
    env_overrides,
    sibling_parameters,
)
from rose_wire import WireError, decode
from testing.fake_triton_error import FakeTritonError


class FakePbUtils:
    TritonError = FakeTritonError


@pytest.mark.parametrize("error, code, field", [
    (InputError("TEXT[1] is empty or only whitespace", field="TEXT"), "INVALID_ARG", "TEXT"),
    (InputError("request parameters are not valid JSON"), "INVALID_ARG", None),
    (OverloadError("encoder queue is full"), "UNAVAILABLE", None),
    (RequestCancelled("cancelled by the client"), "CANCELLED", None),
    (RuntimeError("inference failed: boom"), "INTERNAL", None)])
def test_engine_errors_reach_the_wire_with_their_code_and_field(error, code, field):
    triton = triton_error(FakePbUtils, error)
    assert triton.code() == getattr(FakeTritonError, code)
    assert decode(f"in ensemble 'ensemble', {triton.message()}") == WireError(code, str(error), field)


def test_a_field_the_wire_cannot_carry_is_dropped_not_raised():
    """The encoder answers from inside its error handling: building the answer must not fail."""
    assert wire_error(InputError("bad", field="not a name")) == WireError("INVALID_ARG", "bad")


def test_a_relayed_bls_error_gets_its_encoded_code_back():
    """BLS hands a step's error over as INTERNAL: the unary front restores the encoded code;
    text no model of ours encoded keeps the code it came with."""
    step = triton_error(FakePbUtils, InputError("parameter 'dimensions' is 999; the model has 384", field="dimensions"))
    relayed = relayed_error(FakePbUtils, FakeTritonError(step.message(), FakeTritonError.INTERNAL))
    assert (relayed.code(), relayed.message()) == (FakeTritonError.INVALID_ARG, step.message())
    foreign = relayed_error(FakePbUtils, FakeTritonError("Stub process 'x' is not healthy", FakeTritonError.INTERNAL))
    assert (foreign.code(), foreign.message()) == (FakeTritonError.INTERNAL, "Stub process 'x' is not healthy")


def test_launcher_environment_overrides_config_pbtxt():
    args = {"model_config": json.dumps({"parameters": {"max_batch_tokens": {"string_value": "512"},
                                                       "cuda_graphs": {"string_value": "off"}}})}
    params = config_parameters(args)
    assert params == {"max_batch_tokens": "512", "cuda_graphs": "off"}
    overrides = env_overrides(EncoderConfig, {"ROSE_MAX_BATCH_TOKENS": "1024", "ROSE_DEVICE": "",
                                              "ROSE_UNRELATED": "x"})
    assert overrides == {"max_batch_tokens": "1024"}
    config = EncoderConfig.from_parameters(params, **overrides)
    assert config.max_batch_tokens == 1024 and config.cuda_graphs == "off"


def test_another_models_config_pbtxt_parameters_and_their_env_prefix(tmp_path, monkeypatch):
    """What a unary front reads to tokenize as its tokenizer model does: the sibling folder's
    config.pbtxt parameters (escapes and comments as Triton reads them), then ROSE_* or the
    model's own env_prefix over them."""
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "config.pbtxt").write_text(
        'backend: "python"\n# a comment\nparameters [\n'
        '  { key: "query_prefix", value: { string_value: "query \\"q\\": caf\\303\\251\\n" } },\n'
        '  { key: "max_length", value: { string_value: "64" } }\n]\n')
    args = {"model_repository": str(tmp_path / "front") + "/"}
    params = sibling_parameters(args, "tok")
    assert params == {"query_prefix": 'query "q": café\n', "max_length": "64"}
    monkeypatch.setenv("ROSE_MAX_LENGTH", "32")
    monkeypatch.setenv("ROSE_RERANK_MAX_TEXT_BYTES", "99")
    config = config_from_parameters(TokenizerConfig, params)
    assert (config.query_prefix, config.max_length, config.max_text_bytes) == ('query "q": café\n', 32, 1 << 20)
    pair = config_from_parameters(PairTokenizerConfig, {"env_prefix": "ROSE_RERANK_", "max_length": "64"})
    assert (pair.max_length, pair.max_text_bytes) == (64, 99)
    with pytest.raises(FileNotFoundError, match="missing/config.pbtxt"):
        sibling_parameters(args, "missing")


def test_precedence_explicit_over_environment_over_config_pbtxt_over_default(tmp_path):
    """The one rule, as the gateway uses it: --model-dir > ROSE_MODEL_DIR > config.pbtxt > default;
    a model's env_prefix picks its variables (ROSE_RERANK_ for the reranker's)."""
    path = tmp_path / "config.pbtxt"
    path.write_text('parameters [ { key: "model_dir", value: { string_value: "from-pbtxt" } },\n'
                    '  { key: "max_length", value: { string_value: "64" } } ]\n')
    env = {"ROSE_MODEL_DIR": "from-env", "ROSE_RERANK_MODEL_DIR": "rerank-env"}
    assert config_from_pbtxt(TokenizerConfig, str(path), {}).model_dir == "from-pbtxt"
    assert config_from_pbtxt(TokenizerConfig, str(path), env).model_dir == "from-env"
    assert config_from_pbtxt(TokenizerConfig, str(path), env, model_dir="flag").model_dir == "flag"
    assert config_from_pbtxt(TokenizerConfig, str(path), env, model_dir=None).model_dir == "from-env"
    config = config_from_pbtxt(TokenizerConfig, str(path), {})
    assert (config.max_length, config.max_text_bytes) == (64, TokenizerConfig.max_text_bytes)
    path.write_text(path.read_text().replace("parameters [", 'parameters [ { key: "env_prefix", value: '
                                                                '{ string_value: "ROSE_RERANK_" } },'))
    assert config_from_pbtxt(PairTokenizerConfig, str(path), env).model_dir == "rerank-env"


class BlsRequest:
    """pb_utils.InferenceRequest's async_exec: `answer` None = the encoder never answers; else
    the stub's response iterator over `answer`, noting into `events` when it ends and is freed."""

    def __init__(self, answer=None, events=None):
        self.answer, self.events = answer, events if events is not None else []

    def async_exec(self, decoupled=False):
        assert decoupled
        future = asyncio.get_running_loop().create_future()
        if self.answer is not None:
            future.set_result(ResponseIterator(self.answer, self.events))
        return future


class ResponseIterator:
    def __init__(self, responses, events):
        self._responses, self.events = iter(responses), events

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._responses)
        except StopIteration:
            self.events.append("ended")
            raise

    def __del__(self):
        self.events.append("freed")


def test_a_bls_call_past_its_timeout_fails_unavailable_naming_the_timeout():
    with pytest.raises(EncoderTimeout) as timed_out:
        asyncio.run(exec_decoupled(BlsRequest(), "rose_encoder", 0.01, lambda: False))
    assert "rose_encoder did not answer within 0.01 s (parameter bls_timeout_s" in str(timed_out.value)
    triton = triton_error(FakePbUtils, timed_out.value)
    assert triton.code() == FakeTritonError.UNAVAILABLE and decode(triton.message()).code == "UNAVAILABLE"


def test_a_bls_call_reads_every_response_and_frees_the_iterator_only_after_the_barrier():
    """The stub's clean-up of the call is queued when its last response is read; the barrier
    (the front's request.is_cancelled) returns once the stub has handled it (rose_triton/front.py)."""
    events = []
    responses = asyncio.run(exec_decoupled(BlsRequest(["first", "final"], events), "rose_encoder", 60,
                                           lambda: events.append("barrier")))
    assert responses == ["first", "final"]
    assert events == ["ended", "barrier", "freed"]


def test_front_config_reads_the_timeout_under_the_environment_and_refuses_bad_ones():
    names = {"tokenizer_model": "tokenizer", "encoder_model": "rose_encoder"}
    assert config_from_parameters(FrontConfig, {**names, "bls_timeout_s": "2.5"}, environ={}).bls_timeout_s == 2.5
    assert config_from_parameters(FrontConfig, names, environ={}).bls_timeout_s == FrontConfig.bls_timeout_s
    assert config_from_parameters(FrontConfig, {**names, "bls_timeout_s": "2.5"},
                                  environ={"ROSE_BLS_TIMEOUT_S": "7"}).bls_timeout_s == 7
    for bad in ("0", "-1", "inf", "nan", "soon"):
        with pytest.raises(ValueError, match="bls_timeout_s"):
            FrontConfig.from_parameters({**names, "bls_timeout_s": bad})
    with pytest.raises(ValueError, match="unknown parameter"):
        FrontConfig.from_parameters({**names, "bls_timeout": "1"})
    with pytest.raises(ValueError, match="encoder_model"):
        FrontConfig.from_parameters({"tokenizer_model": "tokenizer"})


def test_a_gpu_instance_runs_on_the_gpu_triton_placed_it_on():
    from rose_triton.parameters import instance_device

    gpu_instance = {"model_instance_kind": "GPU", "model_instance_device_id": "1"}
    assert instance_device(gpu_instance, "auto") == "cuda:1"
    assert instance_device(gpu_instance, "cuda") == "cuda:1"
    assert instance_device({"model_instance_kind": "CPU", "model_instance_device_id": "0"}, "auto") == "auto"
    with pytest.raises(ValueError, match="device=cpu on a KIND_GPU instance"):
        instance_device(gpu_instance, "cpu")
    assert EncoderConfig(device="cuda:1").device == "cuda:1"
    with pytest.raises(ValueError, match="cuda:N"):
        EncoderConfig(device="cuda:x")


def test_front_config_reads_the_in_flight_bound_and_refuses_bad_ones():
    names = {"tokenizer_model": "tokenizer", "encoder_model": "rose_encoder"}
    assert FrontConfig.from_parameters({**names, "max_requests_in_flight": "3"}).max_requests_in_flight == 3
    assert config_from_parameters(FrontConfig, names, environ={"ROSE_MAX_REQUESTS_IN_FLIGHT": "5"}
                                  ).max_requests_in_flight == 5
    for bad in ("0", "-2", "1.5", "many"):
        with pytest.raises(ValueError, match="max_requests_in_flight"):
            FrontConfig.from_parameters({**names, "max_requests_in_flight": bad})


class HeldRequest:
    """A request that is its own response sender (the test's send_final records what it was sent)."""

    def __init__(self, name):
        self.name = name

    def get_response_sender(self):
        return self


def one_by_one(answer):
    """answer_many from a coroutine per request."""
    return lambda requests: [answer(request) for request in requests]


def test_answer_loop_answers_requests_together_and_refuses_past_its_bound():
    gate, entered, sent = threading.Event(), queue.Queue(), queue.Queue()

    async def answer(request):
        entered.put(request.name)
        await asyncio.get_running_loop().run_in_executor(None, gate.wait)
        return f"rows of {request.name}"

    loop = AnswerLoop("front", 2, one_by_one(answer), lambda limit: f"refused past {limit}",
                      lambda sender, response: sent.put((sender.name, response)), repr)
    try:
        loop.submit(HeldRequest("a"))
        loop.submit(HeldRequest("b"))
        assert {entered.get(timeout=30), entered.get(timeout=30)} == {"a", "b"}  # both in flight at once
        loop.submit(HeldRequest("c"))  # past the bound: answered at once, while a and b are held
        assert sent.get(timeout=30) == ("c", "refused past 2")
        gate.set()
        assert {sent.get(timeout=30), sent.get(timeout=30)} == {("a", "rows of a"), ("b", "rows of b")}
        loop.submit(HeldRequest("d"))  # their places are free again
        assert sent.get(timeout=30) == ("d", "rows of d")
    finally:
        gate.set()
        loop.close()
    assert all(task.done() for task in asyncio.all_tasks(loop.loop))  # d's answer finished, none dropped


def test_requests_that_wait_while_the_loop_is_busy_are_handed_over_together():
    busy, free, handed, sent = threading.Event(), threading.Event(), [], queue.Queue()

    async def rows(name):
        return f"rows of {name}"

    def answer_many(requests):
        handed.append([r.name for r in requests])
        if requests[0].name == "a":  # holds the loop thread, as tokenizing a group does
            busy.set()
            free.wait(30)
        return [rows(r.name) for r in requests]

    loop = AnswerLoop("front", 8, answer_many, lambda limit: "refused",
                      lambda sender, response: sent.put((sender.name, response)), repr)
    try:
        loop.submit(HeldRequest("a"))
        assert busy.wait(30)
        for name in "bcd":
            loop.submit(HeldRequest(name))
        free.set()
        assert sorted(sent.get(timeout=30) for _ in range(4)) == [(n, f"rows of {n}") for n in "abcd"]
    finally:
        free.set()
        loop.close()
    assert handed == [["a"], ["b", "c", "d"]]


def test_an_answer_that_fails_is_answered_with_its_error_and_the_others_are_not():
    sent = queue.Queue()

    async def answer(request):
        if request.name == "bad":
            raise RuntimeError("no rows for bad")
        return f"rows of {request.name}"

    def broken(requests):
        raise RuntimeError("answer_many broke")

    def one_short(requests):  # never zip short: every request is answered
        rows = asyncio.get_running_loop().create_future()
        rows.set_result("rows of one")
        return [rows]

    short = "error RuntimeError('the front gave 1 answers for 2 requests')"
    for answer_many, wanted in ((one_by_one(answer), {("bad", "error RuntimeError('no rows for bad')"),
                                                      ("good", "rows of good")}),
                                (broken, {("bad", "error RuntimeError('answer_many broke')"),
                                          ("good", "error RuntimeError('answer_many broke')")}),
                                (one_short, {("bad", short), ("good", short)})):
        loop = AnswerLoop("front", 4, answer_many, lambda limit: "refused",
                          lambda sender, response: sent.put((sender.name, response)),
                          lambda exc: f"error {exc!r}")
        held = threading.Event()  # the loop's thread waits until both are submitted: one group of two
        loop.loop.call_soon_threadsafe(held.wait)
        try:
            loop.submit(HeldRequest("bad"))
            loop.submit(HeldRequest("good"))
            held.set()
            assert {sent.get(timeout=30), sent.get(timeout=30)} == wanted
        finally:
            held.set()
            loop.close()


def test_closing_the_answer_loop_answers_the_requests_in_flight_first():
    sent = queue.Queue()

    async def answer(request):
        await asyncio.sleep(0)  # not answered yet when close() is called
        return f"rows of {request.name}"

    loop = AnswerLoop("front", 4, one_by_one(answer), lambda limit: "refused",
                      lambda sender, response: sent.put((sender.name, response)), repr)
    for name in "abc":
        loop.submit(HeldRequest(name))
    loop.close()
    assert sorted(sent.queue) == [(n, f"rows of {n}") for n in "abc"]
    assert all(task.done() for task in asyncio.all_tasks(loop.loop))
