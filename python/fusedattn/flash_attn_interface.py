"""The flash_attn 2.x Python API on fusedattn's kernels: same functions, arguments, defaults and
return values, so that `from fusedattn import flash_attn_func` replaces
`from flash_attn import flash_attn_func`.

Layouts: q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k, headdim), nheads a
multiple of nheads_k (MQA/GQA); varlen: (total_tokens, nheads, headdim) with int32 cu_seqlens of
batch + 1 offsets. CPU tensors run the CPU backend (float16, bfloat16, float32), CUDA tensors the
CUDA kernels (float16, bfloat16). Any strides are accepted as long as the last dimension is
contiguous; nothing is copied.

Features of flash_attn that fusedattn does not implement (dropout, softcap, ALiBi, paged KV) raise
NotImplementedError naming the argument instead of being silently ignored.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ._ops import ops

# flash_attn's "no limit" for either side of window_size.
_UNBOUNDED = -1


def _reject_unsupported(dropout_p: float, softcap: float, alibi_slopes: Optional[torch.Tensor],
                        block_table: Optional[torch.Tensor] = None) -> None:
    if dropout_p != 0.0:
        raise NotImplementedError(f"fusedattn: dropout_p={dropout_p}: attention dropout is not implemented; "
                                  "pass dropout_p=0.0")
    if softcap != 0.0:
        raise NotImplementedError(f"fusedattn: softcap={softcap}: logit soft-capping is not implemented; "
                                  "pass softcap=0.0")
    if alibi_slopes is not None:
        raise NotImplementedError("fusedattn: alibi_slopes: ALiBi biases are not implemented; pass None")
    if block_table is not None:
        raise NotImplementedError("fusedattn: block_table: paged KV caches are not implemented; pass None")


def _window(window_size: Sequence[int], causal: bool) -> tuple[int, int]:
    if len(window_size) != 2:
        raise ValueError(f"fusedattn: window_size must be a pair (left, right), got {window_size!r}")
    left, right = int(window_size[0]), int(window_size[1])
    # flash_attn: causal overrides the right side of the window (causal == window_right 0).
    return left, (0 if causal else right)


def _result(out: torch.Tensor, softmax_lse: torch.Tensor, return_attn_probs: bool):
    # The attention probabilities themselves are never materialised (flash_attn only returns them
    # with dropout, for testing); the third element is None.
    return (out, softmax_lse, None) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """softmax(q k^T * softmax_scale) v over (batch, seqlen, nheads, headdim) tensors.

    softmax_scale defaults to 1/sqrt(headdim). causal and window_size are aligned to the
    bottom-right corner when seqlen_q != seqlen_k. Returns out (like q), or
    (out, softmax_lse [batch, nheads, seqlen_q] float32, None) when return_attn_probs.
    """
    _reject_unsupported(dropout_p, softcap, alibi_slopes)
    left, right = _window(window_size, causal)
    out, lse = ops.fwd(q, k, v, softmax_scale, causal, left, right, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func on qkv of shape (batch, seqlen, 3, nheads, headdim)."""
    q, k, v = qkv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func with kv of shape (batch, seqlen_k, 2, nheads_k, headdim)."""
    k, v = kv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
    """Attention over packed variable-length sequences: q (total_q, nheads, headdim), k/v
    (total_k, nheads_k, headdim); sequence b holds rows cu_seqlens[b]:cu_seqlens[b + 1].

    Returns out (like q), or (out, softmax_lse [nheads, total_q] float32, None).
    """
    _reject_unsupported(dropout_p, softcap, alibi_slopes, block_table)
    left, right = _window(window_size, causal)
    out, lse = ops.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                              softmax_scale, causal, left, right, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func on qkv of shape (total, 3, nheads, headdim)."""
    q, k, v = qkv.unbind(dim=1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_varlen_func with kv of shape (total_k, 2, nheads_k, headdim)."""
    k, v = kv.unbind(dim=1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def attention(q, k, v, causal=False, sm_scale=None):
    """The Triton fused-attention tutorial's entry point, on (batch, nheads, seqlen, headdim) tensors.

    The transposes are views: the kernels read the BHSD memory directly through its strides.
    """
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=sm_scale,
                          causal=causal)
    return out.transpose(1, 2)
