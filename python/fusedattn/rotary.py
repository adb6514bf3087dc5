"""Rotary position embedding with the calls of flash_attn.layers.rotary's functions:

    from fusedattn.rotary import apply_rotary_emb     # was: from flash_attn.layers.rotary import ...

    q = apply_rotary_emb(q, cos, sin, seqlen_offsets=cache_len)   # q (batch, seqlen, heads, dim)

cos and sin are (seqlen_ro, rotary_dim / 2) tables; the first rotary_dim dims of each head turn,
pairs (0, 1), (2, 3), ... when `interleaved` (GPT-J), else (i, i + rotary_dim / 2) (GPT-NeoX).
Computed in float32 (float64 for float64 x) and rounded once to x's dtype, as plain torch
operations (autograd, CPU and CUDA alike). flash_attn_with_kvcache's rotary_cos / rotary_sin take the same rotation.

A position past the tables (or before them) is left unrotated, as flash_attn's kernel leaves it;
with an int seqlen_offsets that is an error instead, since it is known on the host.
RotaryEmbedding is the module that builds the tables (and XPos's scaled ones) and turns q and k
of a packed qkv (or q and kv) in place.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

__all__ = ["RotaryEmbedding", "apply_rotary_emb", "apply_rotary_emb_kv_", "apply_rotary_emb_qkv_"]


def rotate_at(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
              interleaved: bool, outside: bool = False) -> torch.Tensor:
    """x (batch, seqlen, heads, dim) with its first rotary_dim = 2 * cos.shape[1] dims rotated at
    positions (batch, seqlen), which must lie in [0, seqlen_ro) unless `outside` says some may not:
    those then stay unrotated (a few more operations, which the kvcache path's checked positions
    need not pay a decode step). In float32 (float64 for float64 x), rounded once to x's dtype."""
    half = cos.shape[1]
    work = torch.promote_types(x.dtype, torch.float32)
    if outside:
        inside = ((positions >= 0) & (positions < cos.shape[0]))[..., None]
        rows = positions.clamp(0, cos.shape[0] - 1)
        c, s = torch.where(inside, cos[rows].to(work), 1.0), torch.where(inside, sin[rows].to(work), 0.0)
    else:
        c, s = cos[positions].to(work), sin[positions].to(work)
    c, s = c.unsqueeze(2), s.unsqueeze(2)  # (batch, seqlen, 1, half)
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
        # An int offset was checked against the tables above; a tensor's entries are not read here.
        rotated = rotate_at(x, cos, sin, positions, interleaved, outside=isinstance(seqlen_offsets, torch.Tensor))
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
        rotated = rotate_at(x[None], cos, sin, positions[None], interleaved, outside=True)[0]
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


class RotaryEmbedding(torch.nn.Module):
    """flash_attn.layers.rotary.RotaryEmbedding: rotary tables for head dims of `dim` rotated dims,
    frequencies base^(-2i / dim), built for the longest sequence seen so far (in the inputs' dtype,
    from float32 positions unless pos_idx_in_fp32=False) and kept until a longer one, another
    device or dtype comes. With scale_base (XPos), q's tables are scaled by
    ((2i + 0.4 dim) / (1.4 dim)) ^ ((position - seqlen / 2) / scale_base) and k's divided by it."""

    def __init__(self, dim: int, base: float = 10000.0, interleaved: bool = False,
                 scale_base: Optional[float] = None, pos_idx_in_fp32: bool = True, device=None):
        super().__init__()
        if dim < 2 or dim % 2:
            raise ValueError(f"fusedattn.rotary.RotaryEmbedding: dim must be an even number of at least 2, got {dim}")
        self.dim, self.base, self.interleaved = dim, float(base), interleaved
        self.scale_base, self.pos_idx_in_fp32 = scale_base, pos_idx_in_fp32
        self.register_buffer("inv_freq", self._inverse_frequencies(device), persistent=False)
        pairs = torch.arange(0, dim, 2, device=device, dtype=torch.float32)
        scale = (pairs + 0.4 * dim) / (1.4 * dim) if scale_base is not None else None
        self.register_buffer("scale", scale, persistent=False)
        self._seq_len_cached = 0
        self._cos_cached = self._sin_cached = self._cos_k_cached = self._sin_k_cached = None

    def _inverse_frequencies(self, device) -> torch.Tensor:
        return 1.0 / (self.base ** (torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim))

    def _update_cos_sin_cache(self, seqlen: int, device=None, dtype=None) -> None:
        stale = (self._cos_cached is None or seqlen > self._seq_len_cached or self._cos_cached.device != device
                 or self._cos_cached.dtype != dtype or (self.training and self._cos_cached.is_inference()))
        if not stale:
            return
        self._seq_len_cached = seqlen
        if self.pos_idx_in_fp32:
            positions = torch.arange(seqlen, device=device, dtype=torch.float32)
            # A module moved to half precision has half-precision frequencies: rebuild them in float32.
            inv_freq = self.inv_freq if self.inv_freq.dtype == torch.float32 else self._inverse_frequencies(device)
        else:
            positions = torch.arange(seqlen, device=device, dtype=self.inv_freq.dtype)
            inv_freq = self.inv_freq
        angles = torch.outer(positions, inv_freq.to(device))
        cos, sin = torch.cos(angles), torch.sin(angles)
        if self.scale is None:
            self._cos_cached, self._sin_cached = cos.to(dtype), sin.to(dtype)
            self._cos_k_cached = self._sin_k_cached = None
            return
        power = (torch.arange(seqlen, dtype=self.scale.dtype, device=self.scale.device) - seqlen // 2) / self.scale_base
        scale = (self.scale ** power[:, None]).to(device)
        self._cos_cached, self._sin_cached = (cos * scale).to(dtype), (sin * scale).to(dtype)
        self._cos_k_cached, self._sin_k_cached = (cos / scale).to(dtype), (sin / scale).to(dtype)

    def forward(self, qkv: torch.Tensor, kv: Optional[torch.Tensor] = None,
                seqlen_offset: Union[int, torch.Tensor] = 0, max_seqlen: Optional[int] = None,
                num_heads_q: Optional[int] = None):
        """qkv (batch, seqlen, 3, heads, dim) or grouped (batch, seqlen, heads_q + 2 heads_k, dim)
        with num_heads_q: q and k turned in place, returns qkv. With kv (batch, seqlen, 2, heads,
        dim): qkv is q (batch, seqlen, heads, dim); returns (q, kv), both turned in place. Positions
        start at seqlen_offset (an int, or a (batch,) tensor, for which give max_seqlen: the
        tables are then built that long)."""
        seqlen = qkv.shape[1]
        if max_seqlen is not None:
            self._update_cos_sin_cache(max_seqlen, device=qkv.device, dtype=qkv.dtype)
        elif isinstance(seqlen_offset, int):
            self._update_cos_sin_cache(seqlen + seqlen_offset, device=qkv.device, dtype=qkv.dtype)
        elif self._cos_cached is None:
            raise ValueError("fusedattn.rotary.RotaryEmbedding: a tensor seqlen_offset needs max_seqlen (how long "
                             "the tables must be)")
        cos_k = self._cos_cached if self._cos_k_cached is None else self._cos_k_cached
        sin_k = self._sin_cached if self._sin_k_cached is None else self._sin_k_cached
        if kv is None:
            return apply_rotary_emb_qkv_(qkv, self._cos_cached, self._sin_cached, cos_k, sin_k, self.interleaved,
                                         seqlen_offset, num_heads_q)
        q = apply_rotary_emb(qkv, self._cos_cached, self._sin_cached, self.interleaved, True, seqlen_offset)
        return q, apply_rotary_emb_kv_(kv, cos_k, sin_k, self.interleaved, seqlen_offset)
