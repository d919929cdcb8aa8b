"""PackedBatch -> the runner's device inputs: the one place their layout and graph padding are defined.

A step's inputs are one token buffer `token_data [4, num_tokens]` int64 (rows
INPUT_IDS, POSITIONS, SEQ_IDS, TOKEN_TYPES: one host-to-device copy for all of
them) and `cu_seqlens [num_seqs + 1]` int32. Eager runs, graph replays (into
the static buffers) and the load-time self-check all build them here. Bound
for CUDA, both are staged in pinned memory and copied with non_blocking=True
(device/lazy_tensor.host_tensor), so building them never waits for the GPU.

Padding to a graph bucket (num_seqs, num_tokens): extra sequences are
zero-length (cu_seqlens repeats the real token count); extra tokens lie past
cu_seqlens[-1] with id 0, position 0, token type 0 and seq_id == the bucket's
sequence count (pooling's scratch row). Rows of real sequences never read them.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

from engine_lib.contract import PackedBatch
from engine_lib.device.lazy_tensor import host_tensor

INPUT_IDS, POSITIONS, SEQ_IDS, TOKEN_TYPES = range(4)


class HostInputs(NamedTuple):
    token_data: np.ndarray  # [4, num_tokens] int64: input_ids, positions, seq_ids, token_types
    cu_seqlens: np.ndarray  # [num_seqs + 1] int32


class StepInputs(NamedTuple):
    token_data: Any  # torch.Tensor [4, num_tokens] int64 on the device (rows as HostInputs)
    cu_seqlens: Any  # torch.Tensor [num_seqs + 1] int32 on the device
    host: HostInputs  # what was copied (attention plans read the host cu_seqlens)


def host_inputs(batch: PackedBatch, pad_to: Optional[tuple[int, int]] = None) -> HostInputs:
    """The batch's token rows and cu_seqlens on the host, padded to `pad_to` = (num_seqs, num_tokens) if given."""
    num_seqs, num_tokens = pad_to or (batch.num_seqs, batch.num_tokens)
    if batch.num_seqs > num_seqs or batch.num_tokens > num_tokens:
        raise ValueError(f"batch ({batch.num_seqs} seqs, {batch.num_tokens} tokens) exceeds bucket {pad_to}")
    real = batch.num_tokens
    token_data = np.zeros((4, num_tokens), dtype=np.int64)
    token_data[INPUT_IDS, :real] = batch.input_ids
    token_data[POSITIONS, :real] = batch.positions
    token_data[SEQ_IDS, :real] = batch.seq_ids
    token_data[SEQ_IDS, real:] = num_seqs
    if batch.token_types is not None:
        token_data[TOKEN_TYPES, :real] = batch.token_types
    cu_seqlens = batch.cu_seqlens
    if num_seqs > batch.num_seqs:
        cu_seqlens = np.full(num_seqs + 1, real, dtype=np.int32)
        cu_seqlens[:batch.num_seqs + 1] = batch.cu_seqlens
    return HostInputs(token_data, cu_seqlens)


def step_inputs(batch: PackedBatch, device, pad_to: Optional[tuple[int, int]] = None,
                out: Optional[tuple[Any, Any]] = None) -> StepInputs:
    """The batch's inputs on `device` (padded to `pad_to` if given): new tensors, or copied into
    `out` = (token_data, cu_seqlens), static buffers of exactly the padded shapes (graph replay)."""
    host = host_inputs(batch, pad_to)
    staged = host_tensor(host.token_data, device), host_tensor(host.cu_seqlens, device)
    if out is None:
        token_data, cu_seqlens = (t.to(device, non_blocking=True) for t in staged)
        return StepInputs(token_data, cu_seqlens, host)
    for buffer, tensor in zip(out, staged):
        buffer.copy_(tensor, non_blocking=True)
    return StepInputs(*out, host)
