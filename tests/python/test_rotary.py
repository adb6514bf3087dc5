"""fusedattn.rotary, flash_attn.layers.rotary's functions: apply_rotary_emb against a float64
rotation (dense with int and per-sequence offsets, packed with cu_seqlens, both pair layouts, a
partial rotary_dim), in place, its gradients, positions past the tables, the qkv / kv variants,
and malformed arguments named."""
from __future__ import annotations

import pytest
import torch

import fusedattn
from conftest import DEVICES, DTYPES
from fusedattn.rotary import apply_rotary_emb, apply_rotary_emb_kv_, apply_rotary_emb_qkv_
from test_kvcache import rope_reference, rotary_tables

LAYOUTS = pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])


def _cases():
    for device in DEVICES:
        name, marks = (device, ()) if isinstance(device, str) else (device.values[0], device.marks)
        for dtype in DTYPES["cpu"]:  # the rotation is torch code: every float dtype on either device
            yield pytest.param(name, dtype, id=f"{name}-{str(dtype)[6:]}", marks=marks)


def assert_rounded_once(ours: torch.Tensor, reference: torch.Tensor) -> None:
    """Within one rounding step of the dtype of the float64 rotation (plus float32's own steps)."""
    step = torch.finfo(ours.dtype).eps if ours.dtype != torch.float32 else 4 * torch.finfo(torch.float32).eps
    bound = step * reference.abs().clamp(min=1.0)
    err = (ours.double() - reference).abs()
    assert bool((err <= bound).all()), f"error {err.max().item():.3e} past one {ours.dtype} step"


@pytest.mark.parametrize("device,dtype", list(_cases()))
@LAYOUTS
def test_dense_rotation_at_int_and_per_sequence_offsets(device, dtype, interleaved):
    batch, seqlen, heads, dim, rotary_dim = 2, 9, 3, 64, 32
    x = torch.randn(batch, seqlen, heads, dim).to(dtype=dtype, device=device)
    cos, sin = rotary_tables(40, rotary_dim, torch.float32, device)
    for offsets in (5, torch.tensor([0, 31], device=device, dtype=torch.int32)):
        starts = offsets if isinstance(offsets, torch.Tensor) else torch.full((batch,), offsets, device=device)
        positions = starts.long()[:, None] + torch.arange(seqlen, device=device)
        out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
        assert out.dtype == dtype and out.shape == x.shape
        assert_rounded_once(out, rope_reference(x, cos, sin, positions, interleaved))
        assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])


@pytest.mark.parametrize("device", DEVICES)
@LAYOUTS
def test_packed_sequences_turn_from_their_own_starts(device, interleaved):
    heads, dim, rotary_dim = 2, 16, 16
    cu_seqlens = torch.tensor([0, 5, 5, 12], device=device, dtype=torch.int32)
    offsets = torch.tensor([1, 0, 3], device=device)
    x = torch.randn(14, heads, dim, device=device)  # two rows past the last sequence
    cos, sin = rotary_tables(12, rotary_dim, torch.float32, device)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets, cu_seqlens=cu_seqlens,
                           max_seqlen=7)
    for start, end, offset in ((0, 5, 1), (5, 12, 3)):
        positions = offset + torch.arange(end - start, device=device)[None]
        assert_rounded_once(out[start:end], rope_reference(x[None, start:end], cos, sin, positions, interleaved)[0])
    assert torch.equal(out[12:], x[12:])


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_overwrites_x_with_the_same_values(device):
    x = torch.randn(2, 5, 2, 8, device=device)
    cos, sin = rotary_tables(8, 8, torch.float32, device)
    want = apply_rotary_emb(x, cos, sin, seqlen_offsets=2)
    got = apply_rotary_emb(x, cos, sin, inplace=True, seqlen_offsets=2)
    assert got is x and torch.equal(x, want)


def test_gradients():
    x = torch.randn(2, 4, 2, 6, dtype=torch.float64, requires_grad=True)
    cos, sin = rotary_tables(10, 4, torch.float64, "cpu")
    assert torch.autograd.gradcheck(lambda t: apply_rotary_emb(t, cos, sin, seqlen_offsets=3), (x,))
    packed = torch.randn(7, 2, 6, dtype=torch.float64, requires_grad=True)
    cu = torch.tensor([0, 3, 7])
    assert torch.autograd.gradcheck(
        lambda t: apply_rotary_emb(t, cos, sin, interleaved=True, cu_seqlens=cu, max_seqlen=4), (packed,))


@pytest.mark.parametrize("device", DEVICES)
def test_positions_past_the_tables(device):
    """Per-sequence offsets are not read on the host: positions past the tables stay unrotated (as
    flash_attn's kernel leaves them). An int offset is checked."""
    x = torch.randn(1, 5, 1, 8, device=device)
    cos, sin = rotary_tables(40, 8, torch.float32, device)
    out = apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.tensor([38], device=device))
    positions = torch.tensor([[38, 39]], device=device)
    assert_rounded_once(out[:, :2], rope_reference(x[:, :2], cos, sin, positions, False))
    assert torch.equal(out[:, 2:], x[:, 2:])
    with pytest.raises(ValueError, match=r"seqlen_offsets = 36 with sequences of up to 5 positions needs tables of "
                                         r"at least 41 positions; cos has 40"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=36)


@pytest.mark.parametrize("device", DEVICES)
@LAYOUTS
def test_qkv_and_kv_turn_q_and_k_in_place(device, interleaved):
    cos, sin = rotary_tables(16, 16, torch.float32, device)
    cos_k, sin_k = rotary_tables(16, 16, torch.float32, device)
    cos_k, sin_k = cos_k.flip(0), sin_k.flip(0)  # k's own tables
    qkv = torch.randn(2, 6, 3, 4, 16, device=device)
    before = qkv.clone()
    assert apply_rotary_emb_qkv_(qkv, cos, sin, cos_k, sin_k, interleaved=interleaved, seqlen_offsets=1) is qkv
    assert torch.equal(qkv[:, :, 0], apply_rotary_emb(before[:, :, 0], cos, sin, interleaved, seqlen_offsets=1))
    assert torch.equal(qkv[:, :, 1], apply_rotary_emb(before[:, :, 1], cos_k, sin_k, interleaved, seqlen_offsets=1))
    assert torch.equal(qkv[:, :, 2], before[:, :, 2])
    grouped = torch.randn(2, 6, 4 + 2 * 2, 16, device=device)  # 4 query heads, 2 KV heads
    before = grouped.clone()
    apply_rotary_emb_qkv_(grouped, cos, sin, interleaved=interleaved, num_heads_q=4)
    assert torch.equal(grouped[:, :, :6], apply_rotary_emb(before[:, :, :6], cos, sin, interleaved))
    assert torch.equal(grouped[:, :, 6:], before[:, :, 6:])
    kv = torch.randn(2, 6, 2, 2, 16, device=device)
    before = kv.clone()
    assert apply_rotary_emb_kv_(kv, cos, sin, interleaved=interleaved) is kv
    assert torch.equal(kv[:, :, 0], apply_rotary_emb(before[:, :, 0], cos, sin, interleaved))
    assert torch.equal(kv[:, :, 1], before[:, :, 1])


@pytest.mark.parametrize("device", DEVICES)
def test_malformed_arguments_are_named(device):
    x = torch.randn(2, 5, 2, 8, device=device)
    cos, sin = rotary_tables(8, 8, torch.float32, device)
    with pytest.raises(ValueError, match=r"apply_rotary_emb: x must be \(batch, seqlen, heads, dim\)"):
        apply_rotary_emb(x[0], cos, sin)
    with pytest.raises(ValueError, match=r"apply_rotary_emb: sin: must be a floating-point \(seqlen_ro, rotary_dim / 2\)"):
        apply_rotary_emb(x, cos, sin[:4])
    with pytest.raises(ValueError, match=r"apply_rotary_emb: cos: rotary_dim = 2 x 8 must be between 2 and the head dim 8"):
        apply_rotary_emb(x, *rotary_tables(8, 16, torch.float32, device))
    with pytest.raises(ValueError, match=r"apply_rotary_emb: max_seqlen is required with cu_seqlens"):
        apply_rotary_emb(x[0], cos, sin, cu_seqlens=torch.tensor([0, 5], device=device))
    with pytest.raises(ValueError, match=r"seqlen_offsets must be an int or an integer \(2,\) tensor"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.zeros(3, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match=r"apply_rotary_emb_qkv_: qkv must be \(batch, seqlen, 3, heads, dim\)"):
        apply_rotary_emb_qkv_(x, cos, sin)
    with pytest.raises(ValueError, match=r"apply_rotary_emb_kv_: kv must be \(batch, seqlen, 2, heads, dim\)"):
        apply_rotary_emb_kv_(x, cos, sin)


def _tables(dim, seqlen, dtype, device, scale_base=None):
    """RotaryEmbedding's tables built here from their definition: q's and k's (XPos scales them)."""
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim)
    angles = torch.arange(seqlen, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    if scale_base is None:
        return (cos.to(dtype), sin.to(dtype)), (cos.to(dtype), sin.to(dtype))
    base = (torch.arange(0, dim, 2, dtype=torch.float32, device=device) + 0.4 * dim) / (1.4 * dim)
    scale = base[None, :] ** ((torch.arange(seqlen, dtype=torch.float32, device=device) - seqlen // 2) / scale_base)[:, None]
    return ((cos * scale).to(dtype), (sin * scale).to(dtype)), ((cos / scale).to(dtype), (sin / scale).to(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale_base", [None, 512.0], ids=["rope", "xpos"])
@LAYOUTS
def test_rotary_embedding_module(device, scale_base, interleaved):
    """q and k of a packed qkv turned in place by tables of the longest sequence so far (the
    second call, 4 tokens at offset 8, grows them to 12); q and kv given apart; rotary_dim 8 of a
    head dim of 16."""
    dtype = torch.float16
    rotary = fusedattn.rotary.RotaryEmbedding(8, interleaved=interleaved, scale_base=scale_base, device=device)
    qkv = torch.randn(2, 8, 3, 2, 16, device=device).to(dtype)
    before = qkv.clone()
    assert rotary(qkv) is qkv
    (cos, sin), (cos_k, sin_k) = _tables(8, 8, dtype, device, scale_base)
    assert torch.equal(qkv[:, :, 0], apply_rotary_emb(before[:, :, 0], cos, sin, interleaved))
    assert torch.equal(qkv[:, :, 1], apply_rotary_emb(before[:, :, 1], cos_k, sin_k, interleaved))
    assert torch.equal(qkv[:, :, 2], before[:, :, 2])
    q, kv = torch.randn(2, 4, 2, 16, device=device).to(dtype), torch.randn(2, 4, 2, 2, 16, device=device).to(dtype)
    q_before, kv_before = q.clone(), kv.clone()
    q_out, kv_out = rotary(q, kv, seqlen_offset=8)
    assert q_out is q and kv_out is kv and rotary._seq_len_cached == 12
    (cos, sin), (cos_k, sin_k) = _tables(8, 12, dtype, device, scale_base)
    assert torch.equal(q, apply_rotary_emb(q_before, cos, sin, interleaved, seqlen_offsets=8))
    assert torch.equal(kv[:, :, 0], apply_rotary_emb(kv_before[:, :, 0], cos_k, sin_k, interleaved, seqlen_offsets=8))
    assert torch.equal(kv[:, :, 1], kv_before[:, :, 1])


def test_rotary_embedding_arguments():
    with pytest.raises(ValueError, match=r"RotaryEmbedding: dim must be an even number of at least 2, got 7"):
        fusedattn.rotary.RotaryEmbedding(7)
    with pytest.raises(ValueError, match=r"RotaryEmbedding: a tensor seqlen_offset needs max_seqlen"):
        fusedattn.rotary.RotaryEmbedding(8)(torch.randn(1, 4, 3, 1, 8), seqlen_offset=torch.tensor([2]))
    qkv = torch.randn(1, 4, 3, 1, 8)
    fusedattn.rotary.RotaryEmbedding(8)(qkv, seqlen_offset=torch.tensor([2]), max_seqlen=6)
