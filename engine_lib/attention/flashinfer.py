"""FlashInfer ragged prefill (`BatchPrefillWithRaggedKVCacheWrapper`), CUDA only; UNVERIFIED on a GPU.

`plan()` is FlashInfer's host-side scheduling; `run()` is the kernel. A wrapper
copies its plan to the device through its own pinned buffer, so a wrapper is
re-planned only after the previous plan's copy has completed (an event per
wrapper); a small ring of wrappers keeps that wait off the common path with
two batches in flight. A graph owns a wrapper in CUDA-graph mode whose
indptr buffers are captured and rewritten by `plan()` before each replay.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

WORKSPACE_BYTES = 128 << 20
RING = 3


@dataclass
class _Slot:
    wrapper: object
    planned: torch.cuda.Event | None = None

    def replan(self, backend: "FlashInferBackend", cu_seqlens: np.ndarray) -> None:
        if self.planned is not None:
            self.planned.synchronize()
        indptr = torch.from_numpy(np.ascontiguousarray(cu_seqlens, dtype=np.int32))
        backend.plan_wrapper(self.wrapper, indptr)
        self.planned = torch.cuda.Event()
        self.planned.record()


class FlashInferBackend:
    name = "flashinfer"
    supports_graphs = True
    graph_keys_max_seqlen = False  # plan() sizes the launch from the real lengths

    def __init__(self, shape, dtype: torch.dtype, device: torch.device):
        import flashinfer

        self._flashinfer = flashinfer
        self.shape, self.dtype, self.device = shape, dtype, device
        # Shared by every wrapper: kernels using it run in stream order on one stream.
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._ring = [_Slot(flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self._workspace, "NHD"))
                      for _ in range(RING)]
        self._next = 0

    def plan_wrapper(self, wrapper, indptr: torch.Tensor) -> None:
        wrapper.plan(indptr, indptr, self.shape.num_heads, self.shape.num_kv_heads, self.shape.head_dim,
                     causal=self.shape.causal, q_data_type=self.dtype)

    def plan(self, cu_seqlens: np.ndarray, max_seqlen: int, device: torch.device,
             key_lens: np.ndarray | None = None) -> _Slot:
        if key_lens is not None:
            raise ValueError("the flashinfer backend does not take key_lens (ColBERT's query expansion); "
                             "use attention_backend sdpa, masked or varlen")
        slot = self._ring[self._next]
        self._next = (self._next + 1) % RING
        slot.replan(self, cu_seqlens)
        return slot

    def graph_plan(self, num_seqs: int, num_tokens: int, device: torch.device, max_seqlen: int) -> _Slot:
        wrapper = self._flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            self._workspace, "NHD", use_cuda_graph=True,
            qo_indptr_buf=torch.zeros(num_seqs + 1, dtype=torch.int32, device=device),
            kv_indptr_buf=torch.zeros(num_seqs + 1, dtype=torch.int32, device=device))
        slot = _Slot(wrapper)
        # The first plan fixes the wrapper's row capacity: plan it for the whole bucket.
        slot.replan(self, np.array([0] + [num_tokens] * num_seqs, dtype=np.int32))
        return slot

    def update_graph_plan(self, plan: _Slot, cu_seqlens: np.ndarray) -> None:
        plan.replan(self, cu_seqlens)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Slot) -> torch.Tensor:
        # Fused projections give strided q/k/v views; the ragged kernel is given dense ones.
        return plan.wrapper.run(q.contiguous(), k.contiguous(), v.contiguous())
