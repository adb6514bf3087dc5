"""fusedattn.merge_attention(_): attention over two disjoint key sets, each from fusedattn's forward,
merged by their log-sum-exp, against the float64 attention over all the keys by the 2x rule (dense
and packed); in place on rows of a longer running result and on views narrowed in the head dim; a
side without keys adding nothing; malformed arguments named; the operator under opcheck and
torch.compile."""
from __future__ import annotations

import math

import pytest
import torch

import fusedattn
from conftest import DEVICES, DTYPES, assert_2x_rule, attention_math, default_scale


def _device_dtype_cases():
    for device in DEVICES:
        name, marks = (device, ()) if isinstance(device, str) else (device.values[0], device.marks)
        for dtype in DTYPES[name]:
            yield pytest.param(name, dtype, id=f"{name}-{str(dtype)[6:]}", marks=marks)


CASES = list(_device_dtype_cases())


@pytest.mark.parametrize("device,dtype", CASES)
def test_merged_key_halves_match_the_attention_over_all_keys(device, dtype):
    batch, seqlen_q, seqlen_k, heads, kv_heads, dim, split = 2, 37, 50, 4, 2, 64, 21
    q = torch.randn(batch, seqlen_q, heads, dim, device=device, dtype=dtype)
    k = torch.randn(batch, seqlen_k, kv_heads, dim, device=device, dtype=dtype)
    v = torch.randn(batch, seqlen_k, kv_heads, dim, device=device, dtype=dtype)
    out_a, lse_a, _ = fusedattn.flash_attn_func(q, k[:, :split], v[:, :split], return_attn_probs=True)
    out_b, lse_b, _ = fusedattn.flash_attn_func(q, k[:, split:], v[:, split:], return_attn_probs=True)
    before = out_a.clone(), lse_a.clone()
    out, lse = fusedattn.merge_attention(out_a, lse_a, out_b, lse_b)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert torch.equal(out_a, before[0]) and torch.equal(lse_a, before[1]), "the out-of-place merge wrote its inputs"
    args = (q, k, v, None, default_scale(dim))
    reference, plain = attention_math(*args, dtype=torch.float64), attention_math(*args, dtype=dtype)
    assert_2x_rule("out", out, reference[0], plain[0])
    assert_2x_rule("lse", lse, reference[1], plain[1])


@pytest.mark.parametrize("device", DEVICES)
def test_packed_sequences_merge_in_the_varlen_layout(device):
    dtype, heads, dim = torch.bfloat16, 3, 32
    lengths_q, lengths_k = [5, 17, 9], [12, 30, 8]
    cu_q = torch.tensor([0] + lengths_q, device=device).cumsum(0).to(torch.int32)
    q = torch.randn(sum(lengths_q), heads, dim, device=device, dtype=dtype)
    k = torch.randn(sum(lengths_k), heads, dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    # Keys A: each sequence's first third; keys B: the rest.
    firsts = [n // 3 for n in lengths_k]
    starts = [0] + list(torch.tensor(lengths_k).cumsum(0)[:-1].tolist())
    index_a = torch.cat([torch.arange(s, s + f) for s, f in zip(starts, firsts)]).to(device)
    index_b = torch.cat([torch.arange(s + f, s + n) for s, f, n in zip(starts, firsts, lengths_k)]).to(device)
    parts = []
    for index, lengths in ((index_a, firsts), (index_b, [n - f for n, f in zip(lengths_k, firsts)])):
        cu_k = torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)
        parts.append(fusedattn.flash_attn_varlen_func(q, k[index], v[index], cu_q, cu_k, max(lengths_q),
                                                      max(lengths), return_attn_probs=True)[:2])
    out, lse = fusedattn.merge_attention_(parts[0][0].float(), parts[0][1], *parts[1])
    assert lse.shape == (heads, sum(lengths_q))
    for b in range(len(lengths_q)):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys = slice(starts[b], starts[b] + lengths_k[b])
        args = (q[None, rows], k[None, keys], v[None, keys], None, default_scale(dim))
        reference, plain = attention_math(*args, dtype=torch.float64), attention_math(*args, dtype=dtype)
        assert_2x_rule(f"out[{b}]", out[None, rows].to(dtype), reference[0], plain[0])
        assert_2x_rule(f"lse[{b}]", lse[None, :, rows], reference[1], plain[1])


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_on_rows_of_a_longer_running_result(device):
    batch, seqlen, heads, dim, rows = 2, 40, 3, 24, slice(7, 29)
    out = torch.randn(batch, seqlen, heads, dim, device=device)
    lse = torch.randn(batch, heads, seqlen, device=device) * 3
    part_out = torch.randn(batch, rows.stop - rows.start, heads, dim, device=device, dtype=torch.float16)
    part_lse = torch.randn(batch, heads, rows.stop - rows.start, device=device) * 3
    want_lse = torch.logaddexp(lse[..., rows].double(), part_lse.double())
    weight = torch.exp(lse[..., rows].double() - want_lse).transpose(1, 2)[..., None]
    part_weight = torch.exp(part_lse.double() - want_lse).transpose(1, 2)[..., None]
    want_out = weight * out[:, rows].double() + part_weight * part_out.double()
    before_out, before_lse = out.clone(), lse.clone()
    fusedattn.merge_attention_(out[:, rows], lse[..., rows], part_out, part_lse)
    torch.testing.assert_close(out[:, rows].double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse[..., rows].double(), want_lse, atol=1e-5, rtol=1e-6)
    outside = torch.ones(seqlen, dtype=torch.bool)
    outside[rows] = False
    assert torch.equal(out[:, outside], before_out[:, outside]) and torch.equal(lse[..., outside],
                                                                                before_lse[..., outside])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("columns", [slice(0, 8), slice(4, 12), slice(1, 9)], ids=["first8", "last8", "offset1"])
def test_views_narrowed_in_the_head_dim(device, columns):
    # Rows 12 elements apart holding 8: the CUDA kernel's 16-byte vectors do not fit them, its
    # 8-byte ones do, and at an odd offset only single elements do.
    out = torch.randn(2, 9, 3, 12, device=device, dtype=torch.float16)
    part_out = torch.randn(2, 9, 3, 12, device=device, dtype=torch.bfloat16)
    lse, part_lse = torch.randn(2, 3, 9, device=device), torch.randn(2, 3, 9, device=device)
    want_lse = torch.logaddexp(lse.double(), part_lse.double())
    want_out = (torch.exp(lse.double() - want_lse).transpose(1, 2)[..., None] * out[..., columns].double() +
                torch.exp(part_lse.double() - want_lse).transpose(1, 2)[..., None] * part_out[..., columns].double())
    before = out.clone()
    fusedattn.merge_attention_(out[..., columns], lse, part_out[..., columns], part_lse)
    torch.testing.assert_close(out[..., columns].double(), want_out.half().double(), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-6)
    others = torch.ones(12, dtype=torch.bool)
    others[columns] = False
    assert torch.equal(out[..., others], before[..., others])


@pytest.mark.parametrize("device", DEVICES)
def test_a_side_without_keys_adds_nothing(device):
    out = torch.randn(1, 6, 2, 16, device=device)
    lse = torch.randn(1, 2, 6, device=device)
    part_out = torch.randn(1, 6, 2, 16, device=device, dtype=torch.bfloat16)
    part_lse = torch.randn(1, 2, 6, device=device)
    part_lse[..., 1], part_out[:, 1] = -math.inf, math.nan  # row 1: the part saw no key
    lse[..., 3], out[:, 3] = -math.inf, math.nan  # row 3: the running result saw none
    lse[..., 4] = part_lse[..., 4] = -math.inf  # row 4: neither did
    out[:, 4], part_out[:, 4] = math.nan, math.nan
    want_3 = part_out[:, 3].float()
    merged, merged_lse = fusedattn.merge_attention(out, lse, part_out, part_lse)
    assert torch.equal(merged[:, 1], out[:, 1]) and torch.equal(merged_lse[..., 1], lse[..., 1])
    assert torch.equal(merged[:, 3], want_3) and torch.equal(merged_lse[..., 3], part_lse[..., 3])
    assert torch.equal(merged[:, 4], torch.zeros_like(merged[:, 4])) and bool(merged_lse[..., 4].eq(-math.inf).all())
    assert torch.isfinite(merged).all()


@pytest.mark.parametrize("device", DEVICES)
def test_malformed_arguments_are_named(device):
    out = torch.randn(2, 5, 3, 8, device=device)
    lse = torch.randn(2, 3, 5, device=device)
    with pytest.raises(ValueError, match=r"part_out: shape \[2, 5, 3, 4\] must equal out's"):
        fusedattn.merge_attention_(out, lse, out[..., :4], lse)
    with pytest.raises(ValueError, match=r"lse: dtype fp16 must be fp32"):
        fusedattn.merge_attention_(out, lse.half(), out, lse)
    with pytest.raises(ValueError, match=r"part_lse: shape \[2, 3, 4\] must be \[2, 3, 5\]"):
        fusedattn.merge_attention_(out, lse, out, lse[..., :4])
    with pytest.raises(ValueError, match=r"out: stride 0"):
        fusedattn.merge_attention_(out[:, :1].expand(2, 5, 3, 8), lse, out, lse)
    # The other side over out's rows one row on (the merge would read rows it has written).
    with pytest.raises(ValueError, match=r"out: shares memory with part_out"):
        fusedattn.merge_attention_(out[:, :4], lse[..., :4], out[:, 1:], lse[..., 1:])


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_compile(device):
    out, part_out = torch.randn(2, 9, 3, 16, device=device), torch.randn(2, 9, 3, 16, device=device).half()
    lse, part_lse = torch.randn(2, 3, 9, device=device), torch.randn(2, 3, 9, device=device)
    torch.library.opcheck(torch.ops.fusedattn.merge_attention, (out, lse, part_out, part_lse))
    want = fusedattn.merge_attention(out, lse, part_out, part_lse)
    got = torch.compile(fusedattn.merge_attention, fullgraph=True)(out, lse, part_out, part_lse)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
