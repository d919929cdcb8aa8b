"""Attention backends agree on ragged batches; the selection rule; graph plans with padding."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import engine_lib.attention as attention
from engine_lib.attention import AttentionShape, auto_backend_name, select_backend
from engine_lib.attention.masked import MaskedSdpaBackend
from engine_lib.attention.sdpa import SdpaBackend
from engine_lib.contract import PackedBatch
from engine_lib.runner.inputs import host_inputs


def ragged_qkv(lengths, num_heads=4, num_kv_heads=2, head_dim=16, device="cpu", dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    num_tokens = sum(lengths)
    q, k, v = (torch.randn(num_tokens, h, head_dim, generator=generator).to(device, dtype)
               for h in (num_heads, num_kv_heads, num_kv_heads))
    cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return q, k, v, cu_seqlens


def reference_attention(q, k, v, cu_seqlens, causal):
    """Plain per-sequence attention in fp32, one sequence at a time."""
    out = []
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        qs, ks, vs = (t[start:end].float().transpose(0, 1) for t in (q, k, v))
        out.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=True).transpose(0, 1))
    return torch.cat(out)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend_cls", [SdpaBackend, MaskedSdpaBackend])
def test_cpu_backends_match_per_sequence_reference(backend_cls, causal):
    lengths = [1, 5, 5, 17, 3, 64]
    q, k, v, cu_seqlens = ragged_qkv(lengths)
    backend = backend_cls(causal=causal)
    out = backend.forward(q, k, v, backend.plan(cu_seqlens, max(lengths), torch.device("cpu")))
    torch.testing.assert_close(out, reference_attention(q, k, v, cu_seqlens, causal), atol=1e-5, rtol=1e-4)


def key_lens_reference(q, k, v, cu_seqlens, key_lens):
    """Per sequence: every token attends to the sequence's first key_lens[i] tokens."""
    out = []
    for start, end, n in zip(cu_seqlens[:-1], cu_seqlens[1:], key_lens):
        qs = q[start:end].transpose(0, 1)
        ks, vs = (t[start:start + n].transpose(0, 1) for t in (k, v))
        out.append(F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True).transpose(0, 1))
    return torch.cat(out)


@pytest.mark.parametrize("backend_cls", [SdpaBackend, MaskedSdpaBackend])
def test_key_lens_keep_each_sequence_to_its_first_keys(backend_cls):
    """ColBERT's query expansion: tokens past key_lens[i] are no key of anyone (they still attend)."""
    lengths, key_lens = [16, 5, 16, 16, 7], np.array([9, 5, 16, 9, 3])
    q, k, v, cu_seqlens = ragged_qkv(lengths)
    backend = backend_cls(causal=False)
    out = backend.forward(q, k, v, backend.plan(cu_seqlens, max(lengths), torch.device("cpu"), key_lens=key_lens))
    torch.testing.assert_close(out, key_lens_reference(q, k, v, cu_seqlens, key_lens), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(out, reference_attention(q, k, v, cu_seqlens, False), atol=1e-3)


def test_causal_flag_changes_the_result():
    q, k, v, cu_seqlens = ragged_qkv([6, 9])
    plan = SdpaBackend(True).plan(cu_seqlens, 9, torch.device("cpu"))
    assert not torch.allclose(SdpaBackend(True).forward(q, k, v, plan), SdpaBackend(False).forward(q, k, v, plan))


@pytest.mark.parametrize("causal", [False, True])
def test_masked_graph_plan_with_dummy_sequences(causal):
    """A padded plan (zero-length dummies, tokens past cu_seqlens[-1]) gives the same real rows."""
    lengths = [3, 11, 2]
    q, k, v, cu_seqlens = ragged_qkv(lengths)
    batch = PackedBatch.from_sequences([np.zeros(n, dtype=np.int64) for n in lengths])
    padded = host_inputs(batch, pad_to=(8, 64))
    backend = MaskedSdpaBackend(causal)
    plan = backend.graph_plan(8, 64, torch.device("cpu"), 64)
    backend.update_graph_plan(plan, padded.cu_seqlens)
    pad = lambda t: torch.cat([t, torch.full((64 - t.shape[0], *t.shape[1:]), 1e4)])  # large garbage in the padding
    out = backend.forward(pad(q), pad(k), pad(v), plan)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:16], reference_attention(q, k, v, cu_seqlens, causal), atol=1e-5, rtol=1e-4)


def test_selection_rule(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    shape = AttentionShape(num_heads=16, num_kv_heads=8, head_dim=128, causal=True)
    assert auto_backend_name(cpu, torch.float32, shape) == "sdpa"
    assert auto_backend_name(cuda, torch.float32, shape) == "sdpa"  # flash kernels need fp16/bf16
    odd = AttentionShape(num_heads=4, num_kv_heads=4, head_dim=20, causal=False)
    assert auto_backend_name(cuda, torch.bfloat16, odd) == "sdpa"
    monkeypatch.setattr(attention, "varlen_available", lambda device: True)
    monkeypatch.setattr(attention, "flashinfer_available", lambda: True)
    assert auto_backend_name(cuda, torch.bfloat16, shape) == "varlen"
    monkeypatch.setattr(attention, "varlen_available", lambda device: False)
    assert auto_backend_name(cuda, torch.bfloat16, shape) == "flashinfer"
    assert auto_backend_name(cuda, torch.bfloat16, AttentionShape(4, 4, 32, False)) == "sdpa"  # FlashInfer: 64/128/256
    monkeypatch.setattr(attention, "flashinfer_available", lambda: False)
    assert auto_backend_name(cuda, torch.bfloat16, shape) == "sdpa"


def test_forcing_a_backend():
    cpu = torch.device("cpu")
    shape = AttentionShape(4, 2, 16, True)
    assert select_backend("auto", cpu, torch.float32, shape).name == "sdpa"
    assert select_backend("masked", cpu, torch.float32, shape).name == "masked"
    for name in ("varlen", "flashinfer"):
        with pytest.raises(ValueError, match=f"attention_backend={name} needs CUDA"):
            select_backend(name, cpu, torch.float32, shape)
    with pytest.raises(ValueError, match="unknown attention_backend 'flash'"):
        select_backend("flash", cpu, torch.float32, shape)


def _gpu_agreement(name, dtype=torch.bfloat16):
    device = torch.device("cuda")
    lengths = [1, 7, 130, 64, 3, 513]
    for causal in (False, True):
        q, k, v, cu_seqlens = ragged_qkv(lengths, 16, 8, 128, device, dtype)
        # strided views of one [tokens, (16 + 8 + 8) * 128] tensor, as the fused qkv projection gives them
        fused = torch.cat([t.flatten(1) for t in (q, k, v)], dim=1)
        q, k, v = (t.unflatten(1, (-1, 128)) for t in fused.split([16 * 128, 8 * 128, 8 * 128], dim=1))
        backend = select_backend(name, device, dtype, AttentionShape(16, 8, 128, causal))
        out = backend.forward(q, k, v, backend.plan(cu_seqlens, max(lengths), device)).float()
        torch.testing.assert_close(out, reference_attention(q, k, v, cu_seqlens, causal), atol=2e-2, rtol=2e-2)
        if not backend.supports_graphs:
            continue
        # and through a padded graph plan: 2 dummy sequences, 64 padding tokens
        plan = backend.graph_plan(len(lengths) + 2, sum(lengths) + 64, device, 1024)  # max_seqlen bucket
        backend.update_graph_plan(plan, np.concatenate([cu_seqlens, [cu_seqlens[-1]] * 2]).astype(np.int32))
        pad = lambda t: torch.cat([t, torch.zeros(64, *t.shape[1:], device=device, dtype=dtype)])
        padded = backend.forward(pad(q), pad(k), pad(v), plan)[:sum(lengths)].float()
        torch.testing.assert_close(padded, out, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_gpu_sdpa_matches_reference():
    _gpu_agreement("sdpa")


@pytest.mark.gpu
def test_gpu_varlen_matches_reference():
    if not attention.varlen_available(torch.device("cuda")):
        pytest.skip("this torch has no FlashAttention varlen_attn for this GPU")
    _gpu_agreement("varlen")


@pytest.mark.gpu
def test_gpu_flashinfer_matches_reference():
    if not attention.flashinfer_available():
        pytest.skip("flashinfer-python is not installed")
    _gpu_agreement("flashinfer")


@pytest.mark.gpu
def test_gpu_varlen_key_lens_match_reference():
    device = torch.device("cuda")
    if not attention.varlen_available(device):
        pytest.skip("this torch has no FlashAttention varlen_attn for this GPU")
    lengths, key_lens = [16, 5, 16, 7], np.array([9, 5, 16, 3])
    q, k, v, cu_seqlens = ragged_qkv(lengths, head_dim=64, device="cuda", dtype=torch.bfloat16)
    backend = select_backend("varlen", device, torch.bfloat16, AttentionShape(4, 2, 64, False), key_lens=True)
    out = backend.forward(q, k, v, backend.plan(cu_seqlens, max(lengths), device, key_lens=key_lens)).float()
    want = key_lens_reference(*(t.float() for t in (q, k, v)), cu_seqlens, key_lens)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
