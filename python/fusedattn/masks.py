"""Builders of column masks (flash_attn_func's column_mask, FlashMask's representation) for the
patterns that training with packed sequences uses, so callers need not write the bounds by hand.

Each returns an int32 tensor (batch, 1, seqlen, 2 or 4): key j of batch b hides itself from query
rows [m[b, 0, j, 0], m[b, 0, j, 1]) and, with 4 entries, [m[b, 0, j, 2], m[b, 0, j, 3]). One mask
head, shared by every query head. Self-attention only (seqlen_q == seqlen_k).

    m = fusedattn.masks.document_mask([[300, 200, 524]])       # one sequence of three documents
    out = fusedattn.flash_attn_func(q, k, v, causal=True, column_mask=m)
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["document_mask", "prefix_lm_mask"]


def _lengths_per_sequence(lengths) -> list[list[int]]:
    """[[n, ...] per sequence] from a list of lists, or from one flat list (a single sequence)."""
    lengths = [list(x) if isinstance(x, (list, tuple)) else x for x in lengths]
    if not lengths:
        raise ValueError("fusedattn: lengths: need at least one sequence")
    rows = lengths if isinstance(lengths[0], list) else [lengths]
    for row in rows:
        if not row or any(int(n) < 1 for n in row):
            raise ValueError(f"fusedattn: lengths: every document needs at least one token, got {row}")
    totals = {sum(int(n) for n in row) for row in rows}
    if len(totals) != 1:
        raise ValueError(f"fusedattn: lengths: every sequence must add up to the same seqlen, got {sorted(totals)}")
    return [[int(n) for n in row] for row in rows]


def document_mask(lengths: Sequence, causal: bool = True, device=None) -> torch.Tensor:
    """Documents packed back to back into each sequence: a query row sees only its own document's
    keys. lengths: the documents' lengths, one list per sequence (or one flat list for a batch of
    one); every sequence adds up to the same seqlen.

    causal=True (call flash_attn_func with causal=True): each key hides from the rows after its
    document, (batch, 1, seqlen, 2); the causal mask hides the rows before it. causal=False
    (bidirectional documents; call with causal=False): it hides from the rows before and after its
    document, (batch, 1, seqlen, 4).
    """
    rows = _lengths_per_sequence(lengths)
    total = sum(rows[0])
    masks = []
    for row in rows:
        n = torch.tensor(row, dtype=torch.int64)
        ends = torch.repeat_interleave(n.cumsum(0), n)
        starts = ends - torch.repeat_interleave(n, n)
        seq_end = torch.full_like(ends, total)
        bounds = [ends, seq_end] if causal else [torch.zeros_like(ends), starts, ends, seq_end]
        masks.append(torch.stack(bounds, dim=-1))
    return torch.stack(masks)[:, None].to(dtype=torch.int32, device=device).contiguous()


def prefix_lm_mask(prefix_lengths: Sequence[int], seqlen: int, device=None) -> torch.Tensor:
    """Prefix-LM attention (call flash_attn_func with causal=False): the first prefix_lengths[b]
    tokens of sequence b see each other in both directions, and every later token attends causally.
    Key j at or past its prefix hides from the rows before it; a prefix key hides from none.
    (batch, 1, seqlen, 2).
    """
    if seqlen < 1:
        raise ValueError(f"fusedattn: seqlen: must be at least 1, got {seqlen}")
    prefixes = [int(p) for p in prefix_lengths]
    if not prefixes or any(p < 0 or p > seqlen for p in prefixes):
        raise ValueError(f"fusedattn: prefix_lengths: each must be in [0, {seqlen}], got {prefixes}")
    keys = torch.arange(seqlen, dtype=torch.int64)
    masks = []
    for p in prefixes:
        hidden_until = torch.where(keys >= p, keys, torch.zeros_like(keys))
        masks.append(torch.stack([torch.zeros_like(keys), hidden_until], dim=-1))
    return torch.stack(masks)[:, None].to(dtype=torch.int32, device=device).contiguous()
