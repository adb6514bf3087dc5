"""Rotary position embedding with the calls of flash_attn.layers.rotary's functions:

    from fusedattn.rotary import apply_rotary_emb     # was: from flash_attn.layers.rotary import ...

    q = apply_rotary_emb(q, cos, sin, seqlen_offsets=cache_len)   # q (batch, seqlen, heads, dim)

cos and sin are (seqlen_ro, rotary_dim / 2) tables; the first rotary_dim dims of each head turn,
pairs (0, 1), (2, 3), ... when `interleaved` (GPT-J), else (i, i + rotary_dim / 2) (GPT-NeoX).
Computed in float32 (float64 for float64 x) and rounded once to x's dtype, as plain torch
operations (autograd, CPU and CUDA alike). flash_attn_with_kvcache's rotary_cos / rotary_sin take the same rotation.

A position past the tables (or before them) is left unrotated, as flash_attn's kernel leaves it;
with an int seqlen_offsets that is an error instead, since it is known on the host.
RotaryEmbedding (the module) is not provided.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

__all__ = ["apply_rotary_emb", "apply_rotary_emb_kv_", "apply_rotary_emb_qkv_"]


def rotate_at(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
              interleaved: bool) -> torch.Tensor:
    """x (batch, seqlen, heads, dim) with its first rotary_dim = 2 * cos.shape[1] dims rotated at
    positions (batch, seqlen); positions outside [0, seqlen_ro) stay unrotated. In float32 (float64
    for float64 x), rounded once to x's dtype."""
    half = cos.shape[1]
    work = torch.promote_types(x.dtype, torch.float32)
    inside = (positions >= 0) & (positions < cos.shape[0])
    rows = positions.clamp(0, cos.shape[0] - 1)
    c = torch.where(inside[..., None], cos[rows].to(work), 1.0).unsqueeze(2)  # (batch, seqlen, 1, half)
    s = torch.where(inside[..., None], sin[rows].to(work), 0.0).unsqueeze(2)
    head = x[..., :2 * half].to(work)
    if interleaved:
        x1, x2 = head[..., 0::2], head[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = head[..., :half], head[..., half:]
        rotated = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half:]), dim=-1)


def check_tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, prefix: str, cos_name: str = "cos",
                 sin_name: str = "sin", x_name: str = "x") -> None:
    """cos and sin: floating point (seqlen_ro, rotary_dim / 2) alike on x's device, rotary_dim from 2
    to x's head dim. Errors start with `prefix` and name the tables as cos_name / sin_name."""
    for name, t in ((cos_name, cos), (sin_name, sin)):
        if t.dim() != 2 or t.shape != cos.shape or not t.is_floating_point() or t.device != x.device:
            raise ValueError(f"{prefix}{name}: must be a floating-point (seqlen_ro, rotary_dim / 2) tensor on "
                             f"{x_name}'s device ({x.device}), alike in shape; got {t.dtype} {tuple(t.shape)} on "
                             f"{t.device}")
    if not 2 <= 2 * cos.shape[1] <= x.shape[-1]:
        raise ValueError(f"{prefix}{cos_name}: rotary_dim = 2 x {cos.shape[1]} must be between 2 and the head dim "
                         f"{x.shape[-1]}")


def _offsets(seqlen_offsets: Union[int, torch.Tensor], batch: int, longest: int, seqlen_ro: int, device,
             function: str) -> torch.Tensor:
    """seqlen_offsets as a (batch,) tensor; an int is checked against the tables here."""
    if isinstance(seqlen_offsets, torch.Tensor):
        if seqlen_offsets.shape != (batch,) or seqlen_offsets.is_floating_point() or seqlen_offsets.device != device:
            raise ValueError(f"fusedattn.rotary.{function}: seqlen_offsets must be an int or an integer ({batch},) "
                             f"tensor on x's device, got {seqlen_offsets.dtype} {tuple(seqlen_offsets.shape)}")
        return seqlen_offsets.long()
    if seqlen_offsets < 0 or seqlen_offsets + longest > seqlen_ro:
        raise ValueError(f"fusedattn.rotary.{function}: seqlen_offsets = {seqlen_offsets} with sequences of up to "
                         f"{longest} positions needs tables of at least {seqlen_offsets + longest} positions; cos has "
                         f"{seqlen_ro}")
    return torch.full((batch,), seqlen_offsets, dtype=torch.long, device=device)


def apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
                     inplace: bool = False, seqlen_offsets: Union[int, torch.Tensor] = 0,
                     cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None) -> torch.Tensor:
    """x (batch, seqlen, heads, dim), or (total, heads, dim) with cu_seqlens (batch + 1 offsets) and
    max_seqlen, rotated at positions seqlen_offsets[b] + i (an int or a (batch,) tensor). Returns
    the rotated tensor; with inplace=True, x itself, overwritten."""
    function = "apply_rotary_emb"
    check_tables(x, cos, sin, f"fusedattn.rotary.{function}: ")
    if cos.shape[0] < 1:
        raise ValueError(f"fusedattn.rotary.{function}: cos: the tables hold no position")
    if cu_seqlens is None:
        if x.dim() != 4:
            raise ValueError(f"fusedattn.rotary.{function}: x must be (batch, seqlen, heads, dim), got {tuple(x.shape)}")
        batch, seqlen = x.shape[:2]
        starts = _offsets(seqlen_offsets, batch, seqlen, cos.shape[0], x.device, function)
        positions = starts[:, None] + torch.arange(seqlen, device=x.device)
        rotated = rotate_at(x, cos, sin, positions, interleaved)
    else:
        if x.dim() != 3 or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1 or cu_seqlens.is_floating_point():
            raise ValueError(f"fusedattn.rotary.{function}: with cu_seqlens, x must be (total, heads, dim) and "
                             f"cu_seqlens an integer (batch + 1,) tensor; got x {tuple(x.shape)}, cu_seqlens "
                             f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
        if max_seqlen is None:
            raise ValueError(f"fusedattn.rotary.{function}: max_seqlen is required with cu_seqlens")
        batch, total = cu_seqlens.shape[0] - 1, x.shape[0]
        starts = _offsets(seqlen_offsets, batch, max_seqlen, cos.shape[0], x.device, function)
        # Each row's sequence, then its position within it; rows past the last offset stay unrotated.
        rows = torch.arange(total, device=x.device)
        bounds = cu_seqlens.long()
        sequence = torch.searchsorted(bounds[1:], rows, right=True).clamp(max=max(batch - 1, 0))
        if batch == 0:
            positions = torch.full((total,), -1, dtype=torch.long, device=x.device)
        else:
            positions = rows - bounds[sequence] + starts[sequence]
            positions = torch.where(rows < bounds[-1], positions, -1)
        rotated = rotate_at(x[None], cos, sin, positions[None], interleaved)[0]
    return x.copy_(rotated) if inplace else rotated


def apply_rotary_emb_qkv_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cos_k: Optional[torch.Tensor] = None,
                          sin_k: Optional[torch.Tensor] = None, interleaved: bool = False,
                          seqlen_offsets: Union[int, torch.Tensor] = 0, num_heads_q: Optional[int] = None) -> torch.Tensor:
    """q and k of qkv rotated in place: qkv (batch, seqlen, 3, heads, dim), or (batch, seqlen,
    heads_q + 2 heads_k, dim) with num_heads_q (grouped heads). k turns by cos_k / sin_k where given,
    else by cos / sin. Returns qkv."""
    if qkv.dim() == 5 and qkv.shape[2] == 3 and num_heads_q is None:
        q, k = qkv[:, :, 0], qkv[:, :, 1]
    elif qkv.dim() == 4 and num_heads_q is not None and (qkv.shape[2] - num_heads_q) % 2 == 0 < num_heads_q:
        heads_k = (qkv.shape[2] - num_heads_q) // 2
        q, k = qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q:num_heads_q + heads_k]
    else:
        raise ValueError(f"fusedattn.rotary.apply_rotary_emb_qkv_: qkv must be (batch, seqlen, 3, heads, dim), or "
                         f"(batch, seqlen, heads_q + 2 heads_k, dim) with num_heads_q; got {tuple(qkv.shape)} and "
                         f"num_heads_q={num_heads_q}")
    apply_rotary_emb(q, cos, sin, interleaved, True, seqlen_offsets)
    apply_rotary_emb(k, cos if cos_k is None else cos_k, sin if sin_k is None else sin_k, interleaved, True,
                     seqlen_offsets)
    return qkv


def apply_rotary_emb_kv_(kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
                         seqlen_offsets: Union[int, torch.Tensor] = 0) -> torch.Tensor:
    """k of kv (batch, seqlen, 2, heads, dim) rotated in place; returns kv."""
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"fusedattn.rotary.apply_rotary_emb_kv_: kv must be (batch, seqlen, 2, heads, dim), got "
                         f"{tuple(kv.shape)}")
    apply_rotary_emb(kv[:, :, 0], cos, sin, interleaved, True, seqlen_offsets)
    return kv
