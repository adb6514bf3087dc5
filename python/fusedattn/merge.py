"""Merging attention over disjoint key sets by their log-sum-exp (fusedattn/merge.h).

Attention of the same queries over keys A, (out, lse), and over keys B, (part_out, part_lse), as
fusedattn's forward returns them (out (batch, seqlen, heads, dim) with lse (batch, heads, seqlen),
or packed (total, heads, dim) with lse (heads, total)), merge into the attention over A and B:

    lse' = log(exp(lse) + exp(part_lse))
    out' = exp(lse - lse') * out + exp(part_lse - lse') * part_out

in one kernel pass, computed in fp32. This is the step ring attention, split-KV decoding and
cascade (shared-prefix) inference take after attending to each key set on its own. A side whose
lse is -inf saw no key and adds nothing, whatever its output holds; a NaN lse gives a NaN row.
No gradient flows through the merge.
"""
from __future__ import annotations

import torch

from ._ops import ops


def merge_attention_(out: torch.Tensor, lse: torch.Tensor, part_out: torch.Tensor,
                     part_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Folds (part_out, part_lse) into (out, lse) in place and returns them. out and part_out may
    be float32, float16 or bfloat16 (each its own; a float32 out keeps a running sum of many parts
    exact to fp32), lse and part_lse float32; any strides with out's last dimension contiguous,
    so slices of longer tensors (some rows of a sequence) merge where they lie."""
    ops.merge_attention(out, lse, part_out, part_lse)
    return out, lse


def merge_attention(out: torch.Tensor, lse: torch.Tensor, part_out: torch.Tensor,
                    part_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """merge_attention_ into new tensors (out's dtype, float32 lse); the inputs are unchanged."""
    return merge_attention_(out.clone(), lse.clone(), part_out, part_lse)
