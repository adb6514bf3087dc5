"""fusedattn.masks: the column masks it builds, read back as dense masks, against the patterns they
name (written here from their definitions), and end to end: packed causal documents against the
same documents as a variable-length batch. Then the rejections, by name."""
from __future__ import annotations

import pytest
import torch

import fusedattn
from conftest import randn
from test_column_mask import allowed_by

BATCH_OF_DOCUMENTS = [[5, 1, 17, 9], [20, 12]]  # two sequences of 32 tokens


def document_ids(lengths: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def test_causal_documents_see_their_own_earlier_tokens():
    m = fusedattn.masks.document_mask(BATCH_OF_DOCUMENTS)
    assert m.dtype == torch.int32 and m.shape == (2, 1, 32, 2)
    causal = torch.ones(32, 32, dtype=torch.bool).tril()
    for b, lengths in enumerate(BATCH_OF_DOCUMENTS):
        doc = document_ids(lengths)
        want = (doc[:, None] == doc[None, :]) & causal
        assert torch.equal(allowed_by(m, 32)[b, 0] & causal, want)


def test_bidirectional_documents_see_their_whole_document():
    m = fusedattn.masks.document_mask(BATCH_OF_DOCUMENTS, causal=False)
    assert m.shape == (2, 1, 32, 4)
    for b, lengths in enumerate(BATCH_OF_DOCUMENTS):
        doc = document_ids(lengths)
        assert torch.equal(allowed_by(m, 32)[b, 0], doc[:, None] == doc[None, :])


def test_prefix_lm_sees_the_prefix_both_ways_and_the_rest_causally():
    prefixes, seqlen = [0, 7, 32], 32
    m = fusedattn.masks.prefix_lm_mask(prefixes, seqlen)
    assert m.shape == (3, 1, seqlen, 2)
    i, j = torch.arange(seqlen)[:, None], torch.arange(seqlen)[None, :]
    for b, p in enumerate(prefixes):
        assert torch.equal(allowed_by(m, seqlen)[b, 0], (j < p) | (j <= i))


@pytest.mark.parametrize("dtype", [torch.float32], ids=["float32"])
def test_documents_match_their_varlen_batch(dtype):
    lengths = [5, 1, 17, 9]
    total, heads, d = sum(lengths), 4, 32
    q, k, v = (randn(1, total, heads, d, dtype=dtype, device="cpu") for _ in range(3))
    masked = fusedattn.flash_attn_func(q, k, v, causal=True, column_mask=fusedattn.masks.document_mask([lengths]))
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    varlen = fusedattn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, max(lengths), max(lengths), causal=True)
    torch.testing.assert_close(masked[0], varlen, atol=2e-5, rtol=1e-4)


def test_packed_entry_points_take_the_mask():
    lengths = [7, 11, 14]
    total, heads, d = sum(lengths), 2, 16
    qkv = randn(1, total, 3, heads, d, dtype=torch.float32, device="cpu")
    mask = fusedattn.masks.document_mask([lengths])
    q, k, v = qkv.unbind(dim=2)
    want = fusedattn.flash_attn_func(q, k, v, causal=True, column_mask=mask)
    assert torch.equal(fusedattn.flash_attn_qkvpacked_func(qkv, causal=True, column_mask=mask), want)
    assert torch.equal(fusedattn.flash_attn_kvpacked_func(q, qkv[:, :, 1:], causal=True, column_mask=mask), want)
    # And the mask does something here: without it the later documents see the earlier ones.
    assert not torch.allclose(fusedattn.flash_attn_func(q, k, v, causal=True), want)


def test_rejections_name_the_argument():
    with pytest.raises(ValueError, match="lengths"):
        fusedattn.masks.document_mask([[3, 4], [5, 5]])  # 7 and 10 tokens
    with pytest.raises(ValueError, match="lengths"):
        fusedattn.masks.document_mask([3, 0, 2])
    with pytest.raises(ValueError, match="prefix_lengths"):
        fusedattn.masks.prefix_lm_mask([40], 32)
    with pytest.raises(ValueError, match="seqlen"):
        fusedattn.masks.prefix_lm_mask([0], 0)
