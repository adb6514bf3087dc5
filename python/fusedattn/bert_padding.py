"""Padding helpers with the calls of flash_attn.bert_padding (flash_attn 2.7+): a padded batch
(batch, seqlen, ...) and its 2-D token mask in, the packed (total_tokens, ...) tokens, their flat
indices and the int32 cu_seqlens that flash_attn_varlen_func takes out; and back.

    from fusedattn.bert_padding import pad_input, unpad_input   # was: from flash_attn.bert_padding

    q_packed, indices, cu_seqlens, max_seqlen, _ = unpad_input(q, attention_mask)
    out = flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)
    out = pad_input(out, indices, batch, seqlen)                  # padding rows are zeros

Plain torch operations (index_select, index_copy), so autograd, CPU and CUDA tensors and any
float dtype work as for any torch code. A mask entry counts as a token where it is nonzero (bool
or 0/1 integers, as flash_attn takes). unpad_input reads the longest length on the host, as
flash_attn's does (one wait for the stream). The indices pad_input and index_put_first_axis take
must be in range, as for torch indexing (a CUDA index out of range is a device-side assert):
those unpad_input returns are.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

__all__ = ["index_first_axis", "index_put_first_axis", "pad_input", "unpad_input",
           "unpad_input_for_concatenated_sequences"]


def _check_indices(indices: torch.Tensor, function: str) -> None:
    if indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"fusedattn.bert_padding.{function}: indices must be a 1-D int64 or int32 tensor, got "
                         f"{indices.dtype} of shape {tuple(indices.shape)}")


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The rows `indices` of `input` (first_axis, ...): (len(indices), ...)."""
    _check_indices(indices, "index_first_axis")
    if input.dim() < 1:
        raise ValueError("fusedattn.bert_padding.index_first_axis: input must have a first axis to index")
    return input.index_select(0, indices)


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int) -> torch.Tensor:
    """A (first_axis_dim, ...) tensor of zeros with `values` (len(indices), ...) at rows `indices`."""
    _check_indices(indices, "index_put_first_axis")
    if values.dim() < 1 or values.shape[0] != indices.shape[0]:
        raise ValueError(f"fusedattn.bert_padding.index_put_first_axis: values has {tuple(values.shape)[:1]} rows "
                         f"for {indices.shape[0]} indices; it needs one row per index")
    return values.new_zeros((first_axis_dim, *values.shape[1:])).index_copy(0, indices.long(), values)


def _token_mask(mask: torch.Tensor, hidden_states: torch.Tensor, name: str, function: str) -> torch.Tensor:
    """mask as bool (batch, seqlen), after checking it matches hidden_states' first two axes."""
    if mask.dim() != 2 or hidden_states.dim() < 2 or tuple(mask.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(f"fusedattn.bert_padding.{function}: {name} must be (batch, seqlen) = "
                         f"{tuple(hidden_states.shape[:2])}, hidden_states' first two axes; got {tuple(mask.shape)}")
    if mask.device != hidden_states.device:
        raise ValueError(f"fusedattn.bert_padding.{function}: {name} is on {mask.device}, hidden_states on "
                         f"{hidden_states.device}")
    return mask != 0


def _packed(hidden_states: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor):
    """The tokens of `tokens` (bool (batch, seqlen)) packed, their flat indices, the cu_seqlens of
    `lengths` (one entry per sequence) and the longest of them."""
    indices = tokens.flatten().nonzero().flatten()
    cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    max_seqlen = int(lengths.max()) if lengths.numel() else 0
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat.index_select(0, indices), indices, cu_seqlens, max_seqlen


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor,
                unused_mask: Optional[torch.Tensor] = None):
    """hidden_states (batch, seqlen, ...) and attention_mask (batch, seqlen) -> (packed (total, ...),
    indices (total,) int64 into the flattened (batch * seqlen) positions, cu_seqlens (batch + 1,)
    int32, max_seqlen int, seqused (batch,) int32).

    unused_mask (optional, (batch, seqlen)) marks positions kept although no token is there: they
    are packed and counted in cu_seqlens like tokens, but not in seqused, the tokens attention_mask
    gives each sequence (flash_attn_varlen_func's seqused_k)."""
    tokens = _token_mask(attention_mask, hidden_states, "attention_mask", "unpad_input")
    kept = tokens
    if unused_mask is not None:
        kept = tokens | _token_mask(unused_mask, hidden_states, "unused_mask", "unpad_input")
    packed, indices, cu_seqlens, max_seqlen = _packed(hidden_states, kept, kept.sum(dim=1, dtype=torch.int32))
    return packed, indices, cu_seqlens, max_seqlen, tokens.sum(dim=1, dtype=torch.int32)


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """unpad_input undone: hidden_states (total, ...) at the flat positions `indices` of a
    (batch, seqlen, ...) tensor whose other positions are zeros."""
    return index_put_first_axis(hidden_states, indices, batch * seqlen).view(batch, seqlen, *hidden_states.shape[1:])


def unpad_input_for_concatenated_sequences(hidden_states: torch.Tensor, attention_mask_in_length: torch.Tensor):
    """For rows that each concatenate several sequences: attention_mask_in_length (batch, seqlen)
    holds, per row, the lengths of its sequences in order, then zeros (e.g. [2, 3, 0, 0, 0, 0]: the
    row's first 2 positions are one sequence, the next 3 another, the last one padding). Every
    sequence becomes a sequence of its own in cu_seqlens. Returns (packed (total, ...), indices,
    cu_seqlens int32, max_seqlen)."""
    lengths = attention_mask_in_length
    if lengths.dim() != 2 or hidden_states.dim() < 2 or tuple(lengths.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError("fusedattn.bert_padding.unpad_input_for_concatenated_sequences: attention_mask_in_length "
                         f"must be (batch, seqlen) = {tuple(hidden_states.shape[:2])}, got {tuple(lengths.shape)}")
    used = lengths.sum(dim=1)
    # One wait for the stream for both value checks.
    if lengths.is_floating_point() or lengths.is_complex() or bool((lengths < 0).any() | (used > lengths.shape[1]).any()):
        raise ValueError("fusedattn.bert_padding.unpad_input_for_concatenated_sequences: attention_mask_in_length "
                         f"must hold non-negative integer lengths adding up to at most {lengths.shape[1]} a row")
    positions = torch.arange(lengths.shape[1], device=lengths.device)
    tokens = positions[None, :] < used[:, None]
    sequences = lengths.flatten()
    return _packed(hidden_states, tokens, sequences[sequences != 0].to(torch.int32))
