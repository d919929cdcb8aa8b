"""LazyTensor: the resolved CPU path, the interface the service relies on, two batches in flight; CUDA path on GPU."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from engine_lib.contract import RaggedTokens
from engine_lib.contract import PackedBatch
from engine_lib.device.lazy_tensor import ResolvedTensor
from engine_lib.model_folder import resolve_model_dir
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.service.batching import BatchingService


def test_resolved_tensor_returns_its_value_without_copying():
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert ResolvedTensor(value).ready() and ResolvedTensor(value).wait() is value


def test_cpu_engine_step_returns_a_resolved_result():
    engine = ModelRunner(resolve_model_dir("default"), device="cpu")
    lazy = engine.step(PackedBatch.from_sequences([np.array([101, 7592, 102]), np.array([101, 102])]))
    assert isinstance(lazy, ResolvedTensor)  # CPU steps are synchronous: nothing in flight
    result = lazy.wait()
    assert result.shape == (2, engine.hidden_size) and result.dtype == np.float32


class PendingTensor:
    """A LazyTensor whose result arrives when the test says so."""

    def __init__(self, rows: np.ndarray):
        self.rows, self.done = rows, threading.Event()

    def ready(self) -> bool:
        return self.done.is_set()

    def wait(self) -> np.ndarray:
        assert self.done.wait(10), "never resolved"
        return self.rows


class ManualEngine:
    hidden_size = output_dim = 4
    max_positions, vocab_size, type_vocab_size, task = 512, 1000, 1, "embed"

    def __init__(self):
        self.launched: list[PendingTensor] = []
        self.lock = threading.Lock()

    def step(self, batch: PackedBatch) -> PendingTensor:
        rows = np.repeat(batch.input_ids[batch.cu_seqlens[:-1]].astype(np.float32)[:, None], 4, axis=1)
        with self.lock:
            self.launched.append(PendingTensor(rows))
            return self.launched[-1]


def wait_until(predicate, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_service_keeps_two_batches_in_flight():
    engine = ManualEngine()
    service = BatchingService(engine, max_batch_tokens=8, max_batch_sequences=1, max_inflight_batches=2)
    results: dict[int, np.ndarray] = {}
    try:
        for i in range(3):
            service.submit(RaggedTokens.from_rows([[i + 1]]), lambda rows, error, i=i: results.__setitem__(i, rows))
        assert wait_until(lambda: len(engine.launched) == 2)  # batch 2 launched while batch 1 runs
        time.sleep(0.2)
        assert len(engine.launched) == 2 and not results  # never a third in flight
        engine.launched[0].done.set()
        assert wait_until(lambda: len(engine.launched) == 3 and 0 in results)
        for lazy in engine.launched[1:]:
            lazy.done.set()
        assert wait_until(lambda: len(results) == 3)
        assert [results[i][0, 0] for i in range(3)] == [1.0, 2.0, 3.0]
    finally:
        for lazy in engine.launched:
            lazy.done.set()
        service.close()


@pytest.mark.gpu
def test_cuda_lazy_tensor_copies_after_the_forward_and_releases_the_gil():
    from engine_lib.device.lazy_tensor import CudaLazyTensor

    device_tensor = torch.randn(64, 1024, device="cuda")
    expected = device_tensor.cpu().numpy()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU work the copy must wait for
    lazy = CudaLazyTensor(device_tensor * 2, torch.cuda.Stream())
    assert not lazy.ready()  # the copy waits behind the GPU work
    finished = {}

    def tick():
        for _ in range(20):
            time.sleep(0.001)
        finished["ticker"] = time.monotonic()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    result = lazy.wait()
    finished["wait"] = time.monotonic()
    ticker.join()
    assert finished["ticker"] < finished["wait"]  # the ticker ran while wait() blocked
    assert lazy.ready() and lazy._device_tensor is None
    np.testing.assert_allclose(result, expected * 2, rtol=1e-6)
