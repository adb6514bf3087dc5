"""fusedattn.bert_padding, flash_attn.bert_padding's calls: unpad_input and pad_input against boolean
indexing of the padded batch (any mask pattern, an empty row, a full row, unused positions), their
gradients, a padded causal batch through flash_attn_varlen_func against the float64 reference per
sequence, the concatenated-sequences variant, and malformed arguments named."""
from __future__ import annotations

import pytest
import torch

import fusedattn
from conftest import DEVICES, assert_2x_rule, attention_math, default_scale, randn
from fusedattn.bert_padding import (index_first_axis, index_put_first_axis, pad_input, unpad_input,
                                    unpad_input_for_concatenated_sequences)


def _mask(batch: int, seqlen: int, device) -> torch.Tensor:
    """A random token mask with a full first row and an empty second one."""
    mask = torch.rand(batch, seqlen) < 0.6
    mask[0] = True
    mask[1] = False
    return mask.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.int32])
def test_unpad_then_pad_is_boolean_indexing(device, mask_dtype):
    batch, seqlen = 4, 9
    hidden = torch.randn(batch, seqlen, 3, 5, device=device)
    mask = _mask(batch, seqlen, device)
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, mask.to(mask_dtype))
    lengths = mask.sum(dim=1)
    assert torch.equal(packed, hidden[mask])
    assert indices.dtype == torch.int64 and torch.equal(indices, mask.flatten().nonzero().flatten())
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0] + lengths.cumsum(0).tolist()
    assert isinstance(max_seqlen, int) and max_seqlen == seqlen
    assert seqused.dtype == torch.int32 and seqused.tolist() == lengths.tolist()
    padded = pad_input(packed, indices, batch, seqlen)
    assert torch.equal(padded, torch.where(mask[..., None, None], hidden, torch.zeros_like(hidden)))
    assert torch.equal(index_first_axis(hidden.flatten(0, 1), indices), packed)
    assert torch.equal(index_put_first_axis(packed, indices.int(), batch * seqlen), padded.flatten(0, 1))


@pytest.mark.parametrize("device", DEVICES)
def test_unused_positions_are_packed_but_not_counted_as_tokens(device):
    batch, seqlen = 3, 8
    hidden = torch.randn(batch, seqlen, 6, device=device)
    tokens = torch.zeros(batch, seqlen, dtype=torch.bool, device=device)
    unused = torch.zeros_like(tokens)
    tokens[0, :5], unused[0, 5:7] = True, True  # 5 tokens, then 2 positions kept for later ones
    tokens[2, :3] = True
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, tokens, unused)
    kept = tokens | unused
    assert torch.equal(packed, hidden[kept])
    assert cu_seqlens.tolist() == [0, 7, 7, 10] and max_seqlen == 7
    assert seqused.tolist() == [5, 0, 3]


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_reach_the_tokens_only(device):
    batch, seqlen = 3, 7
    hidden = torch.randn(batch, seqlen, 4, device=device, dtype=torch.float64, requires_grad=True)
    mask = _mask(batch, seqlen, device)
    packed, indices, *_ = unpad_input(hidden, mask)
    weight = torch.randn_like(packed)
    (grad,) = torch.autograd.grad((packed * weight).sum(), hidden)
    want = torch.zeros_like(hidden)
    want[mask] = weight
    assert torch.equal(grad, want)
    values = torch.randn_like(packed, requires_grad=True)
    padded = pad_input(values, indices, batch, seqlen)
    upstream = torch.randn_like(padded)
    (grad,) = torch.autograd.grad(padded, values, upstream)
    assert torch.equal(grad, upstream[mask])


def _half_precision_cases():
    for device in DEVICES:
        name, marks = (device, ()) if isinstance(device, str) else (device.values[0], device.marks)
        for dtype in (torch.float16, torch.bfloat16):
            yield pytest.param(name, dtype, id=f"{name}-{str(dtype)[6:]}", marks=marks)


@pytest.mark.parametrize("device,dtype", list(_half_precision_cases()))
def test_a_padded_causal_batch_through_varlen_attention(device, dtype):
    """The flash_attn recipe: unpad q, k and v by the padding mask, attend as a variable-length
    batch, pad the output. Each sequence's tokens (any positions of its row) must get the attention
    over its own tokens, the padding rows zeros, and the gradients must reach the padded inputs."""
    name = device
    batch, seqlen, heads, kv_heads, dim = 3, 37, 4, 2, 64
    q = randn(batch, seqlen, heads, dim, dtype=dtype, device=name).requires_grad_()
    k = randn(batch, seqlen, kv_heads, dim, dtype=dtype, device=name).requires_grad_()
    v = randn(batch, seqlen, kv_heads, dim, dtype=dtype, device=name).requires_grad_()
    mask = _mask(batch, seqlen, name)
    mask[2] = torch.arange(seqlen, device=name) < 20  # left-aligned, as tokenizers pad
    q_packed, indices, cu_seqlens, max_seqlen, _ = unpad_input(q, mask)
    k_packed, v_packed = unpad_input(k, mask)[0], unpad_input(v, mask)[0]
    packed = fusedattn.flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_seqlens, cu_seqlens, max_seqlen,
                                              max_seqlen, causal=True)
    out = pad_input(packed, indices, batch, seqlen)
    dout = randn(*out.shape, dtype=dtype, device=name)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    for b in range(batch):
        rows = mask[b]
        assert not out[b][~rows].any() and not dq[b][~rows].any() and not dk[b][~rows].any()
        if not rows.any():
            continue
        args = (q.detach()[b][rows][None], k.detach()[b][rows][None], v.detach()[b][rows][None], dout[b][rows][None],
                default_scale(dim), -1, 0)
        reference, plain = attention_math(*args), attention_math(*args, dtype=dtype)
        ours = (out.detach()[b][rows], None, dq[b][rows], dk[b][rows], dv[b][rows])
        for tensor, o, r, p in zip(("out", "lse", "dq", "dk", "dv"), ours, reference, plain):
            if o is not None:
                assert_2x_rule(f"{tensor}[seq {b}]", o, r[0], p[0])


@pytest.mark.parametrize("device", DEVICES)
def test_concatenated_sequences_each_become_a_sequence(device):
    hidden = torch.randn(3, 6, 2, device=device)
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [3, 2, 1, 0, 0, 0], [0] * 6], device=device)
    packed, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(hidden, lengths)
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 2, 5, 8, 10, 11]
    assert max_seqlen == 3
    assert torch.equal(packed, hidden.flatten(0, 1)[indices])


@pytest.mark.parametrize("device", DEVICES)
def test_malformed_arguments_are_named(device):
    hidden = torch.randn(2, 5, 3, device=device)
    with pytest.raises(ValueError, match=r"unpad_input: attention_mask must be \(batch, seqlen\) = \(2, 5\)"):
        unpad_input(hidden, torch.ones(2, 4, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match=r"unpad_input: unused_mask must be \(batch, seqlen\)"):
        unpad_input(hidden, torch.ones(2, 5, dtype=torch.bool, device=device), torch.ones(5, device=device))
    with pytest.raises(ValueError, match=r"index_first_axis: indices must be a 1-D int64 or int32 tensor"):
        index_first_axis(hidden, torch.zeros(2, 2, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match=r"index_first_axis: indices must be"):
        index_first_axis(hidden, torch.zeros(2, device=device))
    with pytest.raises(ValueError, match=r"index_put_first_axis: values has \(3,\) rows for 2 indices"):
        index_put_first_axis(torch.ones(3, 4, device=device), torch.tensor([0, 1], device=device), 5)
    with pytest.raises(ValueError, match=r"pad_input|index_put_first_axis"):
        pad_input(torch.ones(3, 4, device=device), torch.tensor([0, 1], device=device), 1, 5)
    for bad in ([[2, 4, 0, 0, 0]] * 2, [[-1, 2, 0, 0, 0]] * 2):
        with pytest.raises(ValueError, match=r"non-negative integer lengths adding up to at most 5"):
            unpad_input_for_concatenated_sequences(hidden, torch.tensor(bad, device=device))
