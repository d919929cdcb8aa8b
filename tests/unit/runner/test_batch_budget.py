"""max_batch_tokens=auto: the saturation rule on fake timing sources, and the timer on a real CPU engine;
max_cpu_step_ms: the bounded rule likewise; the host lock that keeps encoders' ladders apart."""
from __future__ import annotations

import fcntl
import itertools
import logging
import os

import pytest

from engine_lib.config import EncoderConfig
from engine_lib.runner.batch_budget import (auto_batch_tokens, bounded_tokens, ladder, probe_batch,
                                            saturation_tokens, timing_alone)
from engine_lib.runner.model_runner import ModelRunner
from testing.tiny_models import qwen3_config, save_random_model


def roofline(fixed_s: float, per_token_s: float):
    """A device that costs `fixed_s` per step until it saturates, then `per_token_s` per token."""
    return lambda n: max(fixed_s, n * per_token_s)


@pytest.mark.parametrize("fixed, per_token, expected", [
    (1e-3, 1e-3 / 512, 512),    # saturates at 512 tokens (the seed's sub-1B model on a GPU)
    (1e-3, 1e-3 / 2048, 2048),
    (1e-3, 1e-3 / 64, 64),      # a CPU: every token costs from the start
])
def test_budget_is_where_step_time_starts_growing_with_tokens(fixed, per_token, expected):
    budget, timings = saturation_tokens(roofline(fixed, per_token))
    assert budget == expected
    assert max(timings) == 2 * expected  # stops measuring right after the crossover


def test_never_saturating_device_uses_the_largest_size():
    budget, timings = saturation_tokens(lambda n: 1e-3, largest=4096)
    assert budget == 4096 and sorted(timings) == [64, 128, 256, 512, 1024, 2048, 4096]


def test_slack_tolerates_noise_below_saturation():
    noisy = {64: 1.0, 128: 1.3, 256: 1.7, 512: 3.3, 1024: 6.6}  # 256 -> 512 nearly doubles: saturated
    assert saturation_tokens(noisy.__getitem__, largest=1024)[0] == 256
    assert saturation_tokens(noisy.__getitem__, largest=1024, slack=0.0)[0] == 512  # without slack: 3.3 < 2 x 1.7


def test_bounded_budget_is_the_largest_step_within_the_bound():
    per_token = 0.25 / 1000  # a CPU: 1000 tokens take the bound exactly
    budget, timings = bounded_tokens(lambda n: n * per_token, 0.25, largest=8192)
    assert budget == 512 and sorted(timings) == [64, 128, 256, 512, 1024]  # stops at the first step over


def test_bounded_budget_keeps_the_smallest_step_when_none_fits_and_the_largest_when_all_do():
    assert bounded_tokens(lambda n: 1.0, 0.25, largest=8192) == (64, {64: 1.0})
    budget, timings = bounded_tokens(lambda n: 1e-3, 0.25, largest=3000)
    assert budget == 3000 and sorted(timings) == [64, 128, 256, 512, 1024, 2048, 3000]
    assert ladder(64, 32) == [32] and bounded_tokens(lambda n: 1e-3, 0.25, largest=32)[0] == 32


def lock_is_held(path) -> bool:
    """Whether someone holds the flock of `path` (tried from a descriptor of this test's own)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_timing_alone_holds_the_host_lock_until_it_is_left(tmp_path):
    lock = str(tmp_path / "timing.lock")
    with timing_alone(lock) as held:
        assert held and lock_is_held(lock)
    assert not lock_is_held(lock)


def test_timing_alone_goes_on_past_a_holder_that_keeps_the_lock(tmp_path, caplog):
    """Another encoder holding the lock past `wait_s` (its clock the test's: no wall time waited)."""
    lock = str(tmp_path / "timing.lock")
    now, pauses = [0.0], []

    def pause(seconds):
        pauses.append(seconds)
        now[0] += seconds

    with timing_alone(lock) as first, caplog.at_level(logging.WARNING):
        with timing_alone(lock, wait_s=1.0, clock=lambda: now[0], pause=pause) as second:
            assert first and not second and now[0] >= 1.0 and pauses
    assert "held by another encoder" in caplog.text


def test_timing_alone_without_a_usable_lock_file_still_times(tmp_path, caplog):
    with caplog.at_level(logging.WARNING), timing_alone(str(tmp_path / "no-such-folder" / "timing.lock")) as held:
        assert not held
    assert "without the host lock" in caplog.text


def test_cpu_encoder_budget_is_bounded_by_max_cpu_step_ms(tmp_path, monkeypatch):
    """build_endpoint on a CPU: the bounded rule's pick (from the engine's own timed steps) is the budget."""
    from transformers import Qwen3Model

    from engine_lib.runner import batch_budget
    from engine_lib.service.build import build_endpoint

    save_random_model(Qwen3Model, qwen3_config(), tmp_path, seed=52)
    lock = str(tmp_path / "timing.lock")
    monkeypatch.setattr(batch_budget, "TIMING_LOCK", lock)
    seen = {}

    def bounded(step_seconds, bound_s, largest, start=64):
        seen.update(bound_s=bound_s, largest=largest, one_step=step_seconds(64), locked=lock_is_held(lock))
        return 128, {}

    monkeypatch.setattr(batch_budget, "bounded_tokens", bounded)
    encoder = build_endpoint(EncoderConfig(model_dir=str(tmp_path), device="cpu", max_batch_tokens=4096,
                                           max_cpu_step_ms=300))
    try:
        assert encoder.service.max_batch_tokens == 128 and not lock_is_held(lock)
        assert seen["bound_s"] == 0.3 and seen["largest"] == 4096 and seen["one_step"] > 0 and seen["locked"]
    finally:
        encoder.close()
    unbounded = build_endpoint(EncoderConfig(model_dir=str(tmp_path), device="cpu", max_batch_tokens=4096,
                                             max_cpu_step_ms=0))
    try:
        assert unbounded.service.max_batch_tokens == 4096
    finally:
        unbounded.close()


def test_timer_uses_the_engine_and_the_injected_clock(tmp_path):
    from transformers import Qwen3Model

    save_random_model(Qwen3Model, qwen3_config(), tmp_path, seed=51)
    engine = ModelRunner(str(tmp_path), device="cpu")
    ticks = itertools.count()
    # Fake clock: each step "takes" one tick, so every size costs the same -> never saturates.
    budget = auto_batch_tokens(engine, largest=256, runs=2, clock=lambda: float(next(ticks)))
    assert budget == 256
    assert probe_batch(600, 256, 128).seq_lens.tolist() == [256, 256, 88]


def test_config_takes_auto():
    from engine_lib.config import AUTO

    assert EncoderConfig.from_parameters({"max_batch_tokens": "auto"}).max_batch_tokens == AUTO
    assert EncoderConfig.from_parameters({}).max_graph_tokens == AUTO  # graphs cover the batches by default
    with pytest.raises(ValueError, match="max_batch_tokens must be >= 1"):
        EncoderConfig.from_parameters({"max_batch_tokens": "0"})
    with pytest.raises(ValueError, match="max_batch_sequences"):
        EncoderConfig.from_parameters({"max_batch_sequences": "auto"})


def rerun_capture(fn):
    output = fn()
    return (lambda: output.copy_(fn())), output


def test_built_encoder_measures_the_budget_and_its_graph_grid_covers_every_batch(tmp_path):
    from transformers import Qwen3Model

    from engine_lib.service.build import build_endpoint

    save_random_model(Qwen3Model, qwen3_config(), tmp_path, seed=52)
    config = EncoderConfig.from_parameters({"model_dir": str(tmp_path), "device": "cpu", "max_batch_tokens": "auto",
                                            "max_batch_sequences": "32", "attention_backend": "masked",
                                            "cuda_graphs": "on", "max_graphs": "7"})
    encoder = build_endpoint(config, graph_capture=rerun_capture)
    try:
        service, engine = encoder.service, encoder.service.engine
        assert engine.graphs.cache.max_graphs == 7
        assert 64 <= service.max_batch_tokens <= 8192 and service.max_batch_tokens & (service.max_batch_tokens - 1) == 0
        assert engine.graphs.buckets.covers(max(service.max_batch_tokens, engine.max_positions), 32)
        gauges = encoder.gauges()
        assert gauges["rose_batch_token_budget"] == service.max_batch_tokens
        # float32 (tests/conftest.py: ROSE_CPU_BF16=off): nothing to compare
        assert gauges[("rose_self_check_cosine", (("device", "cpu"), ("dtype", "float32")))] == engine.self_check_cosine == 1.0
    finally:
        encoder.close(5)
