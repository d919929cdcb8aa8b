"""LazyTensor implementations (protocol: engine_lib/contract.py): a result that may still be in flight on the accelerator.

`wait()` returns the host array. On CPU the result is already resolved. On
CUDA the device-to-host copy is issued on a side stream that waits on the
compute stream, into a pinned host buffer, followed by an event; the device
tensor stays referenced until that event has completed, so the caching
allocator cannot hand its memory to a later batch while the copy reads it.

`host_tensor` is the other direction: inputs bound for a CUDA device are
staged in pinned memory so their copies are truly asynchronous (a copy from
pageable memory may wait for the stream); the pinned caching allocator keeps
each staging block until its copy has completed.
"""
from __future__ import annotations

import numpy as np


def host_tensor(array: np.ndarray, device):
    """A CPU tensor of `array` ready for `.to(device, non_blocking=True)` / `copy_`."""
    import torch

    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.pin_memory() if device.type == "cuda" else tensor


class ResolvedTensor:
    def __init__(self, value: np.ndarray):
        self._value = value

    def ready(self) -> bool:
        return True

    def wait(self) -> np.ndarray:
        return self._value


class CudaLazyTensor:
    def __init__(self, device_tensor, copy_stream=None):
        import torch

        compute_stream = torch.cuda.current_stream(device_tensor.device)
        self._copy_stream = copy_stream or compute_stream
        self._device_tensor = device_tensor
        self._host = torch.empty(device_tensor.shape, dtype=device_tensor.dtype,
                                 device="cpu", pin_memory=True)
        self._event = torch.cuda.Event()
        with torch.cuda.stream(self._copy_stream):
            self._copy_stream.wait_stream(compute_stream)
            device_tensor.record_stream(self._copy_stream)
            self._host.copy_(device_tensor, non_blocking=True)
            self._event.record(self._copy_stream)

    def ready(self) -> bool:
        return self._event.query()

    def wait(self) -> np.ndarray:
        self._event.synchronize()  # releases the GIL while blocking
        self._device_tensor = None
        return self._host.numpy()
