"""ComputeThread (engine_lib/runner/compute_thread.py), and build_endpoint loading an engine on the
thread that then runs its steps (one OpenMP pool in the process, not two)."""
from __future__ import annotations

import queue
import threading

import pytest

from engine_lib.config import EncoderConfig
from engine_lib.contract import RaggedTokens
from engine_lib.options import RequestOptions
from engine_lib.runner.compute_thread import OPENMP_SPIN_COUNT, ComputeThread, bound_openmp_spinning
from engine_lib.runner.model_runner import ModelRunner
from testing.tiny_models import qwen3_config, save_random_model


def test_call_runs_on_the_thread_and_returns_or_raises_there():
    compute = ComputeThread("test-compute")
    try:
        assert compute.call(threading.current_thread) is not threading.current_thread()
        assert compute.call(threading.current_thread).name == "test-compute"
        assert compute.call(lambda a, b=0: a + b, 2, b=3) == 5
        with pytest.raises(ZeroDivisionError):
            compute.call(lambda: 1 / 0)
        assert compute.is_alive()  # a failed call leaves the thread serving
    finally:
        compute.close()
    compute.join(10)
    assert not compute.is_alive()


def test_a_handed_over_loop_runs_last_and_ends_the_thread():
    compute = ComputeThread("test-compute")
    seen = queue.SimpleQueue()
    first = compute.call(threading.get_ident)
    release = threading.Event()
    compute.hand_over(lambda: (seen.put(threading.get_ident()), release.wait()))
    assert seen.get(timeout=10) == first
    assert compute.is_alive()  # the loop holds the thread until it returns
    release.set()
    compute.join(10)
    assert not compute.is_alive()


def test_the_encoder_is_loaded_timed_and_stepped_on_one_thread(tmp_path, monkeypatch):
    from engine_lib.service.build import build_endpoint

    from transformers import Qwen3Model

    save_random_model(Qwen3Model, qwen3_config(), tmp_path, seed=53)
    threads = {"load": set(), "step": set()}
    load, step = ModelRunner.__init__, ModelRunner.step

    def recording_load(self, *args, **kwargs):
        threads["load"].add(threading.get_ident())
        load(self, *args, **kwargs)

    def recording_step(self, batch):
        threads["step"].add(threading.get_ident())
        return step(self, batch)

    monkeypatch.setattr(ModelRunner, "__init__", recording_load)
    monkeypatch.setattr(ModelRunner, "step", recording_step)
    encoder = build_endpoint(EncoderConfig(model_dir=str(tmp_path), device="cpu"))  # max_cpu_step_ms times steps
    try:
        timed = set(threads["step"])  # the budget's ladder
        answers = queue.SimpleQueue()
        encoder.submit(RaggedTokens.from_rows([[5, 6, 7], [8, 9]], options=RequestOptions()),
                       lambda result, error: answers.put((result, error)))
        result, error = answers.get(timeout=60)
        assert error is None and len(next(iter(result.values()))) == 2
    finally:
        encoder.close()
    assert timed and len(threads["load"]) == 1 and threads["step"] == threads["load"] == timed
    assert threading.get_ident() not in threads["load"]


def test_a_failed_build_leaves_no_thread_behind(tmp_path):
    from engine_lib.service.build import build_endpoint

    before = {t for t in threading.enumerate() if t.name == "rose-scheduler"}
    with pytest.raises(FileNotFoundError, match="no config.json"):  # raised on the thread, seen here
        build_endpoint(EncoderConfig(model_dir=str(tmp_path), device="cpu"))
    for thread in [t for t in threading.enumerate() if t.name == "rose-scheduler" and t not in before]:
        thread.join(10)
        assert not thread.is_alive()


@pytest.mark.parametrize("environ, torch_loaded, expected", [
    ({}, False, {"GOMP_SPINCOUNT": OPENMP_SPIN_COUNT}),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, False, {"OMP_WAIT_POLICY": "PASSIVE"}),  # the operator's policy wins
    ({"GOMP_SPINCOUNT": "0"}, False, {"GOMP_SPINCOUNT": "0"}),
    ({}, True, {}),  # libgomp has read its environment already: nothing to change
])
def test_openmp_spinning_is_bounded_only_where_nobody_chose(environ, torch_loaded, expected):
    sets = environ == {} and not torch_loaded
    assert bound_openmp_spinning(environ, torch_loaded) == sets
    assert environ == expected
