"""The C++ operators (torch.ops.fusedattn.*): loading, fake kernels, autograd.

The operators are defined with TORCH_LIBRARY in python/csrc/ops.cpp. This module gives each one a
fake kernel (output shapes and strides without computing, for torch.compile and FakeTensor) and
wires the forward operators to the backward ones with torch.library.register_autograd, so that
the flash_attn-style functions are plain calls that torch.compile(fullgraph=True) traces as single
graph nodes.
"""
from __future__ import annotations

import pathlib

import torch

_LIBRARY_FILE = "libfusedattn_torch.so"


def _load_library() -> None:
    path = pathlib.Path(__file__).with_name(_LIBRARY_FILE)
    if not path.exists():
        raise ImportError(
            f"fusedattn: {path} is missing; build the package with "
            "`pip install --no-build-isolation .` from the repository root"
        )
    torch.ops.load_library(str(path))


_load_library()
ops = torch.ops.fusedattn


# ---- fake kernels: must allocate exactly like python/csrc/ops.cpp -------------------------------

def _dense_lse(q: torch.Tensor) -> torch.Tensor:
    batch, seqlen_q, heads = q.shape[0], q.shape[1], q.shape[2]
    return q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)


def _varlen_lse(q: torch.Tensor) -> torch.Tensor:
    total_q, heads = q.shape[0], q.shape[1]
    return q.new_empty((heads, total_q), dtype=torch.float32)


@torch.library.register_fake("fusedattn::fwd")
def _fwd_fake(q, k, v, softmax_scale, causal, window_left, window_right, deterministic=False, column_mask=None):
    return torch.empty_like(q), _dense_lse(q)


@torch.library.register_fake("fusedattn::varlen_fwd")
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     window_left, window_right, deterministic=False, seqused_k=None, block_table=None,
                     checked_rows_k=-1, check_on_device=False):
    return torch.empty_like(q), _varlen_lse(q)


@torch.library.register_fake("fusedattn::append_kv")
def _append_kv_fake(k_cache, v_cache, k, v, cache_seqlens, block_table=None):
    return cache_seqlens.new_empty((k.shape[0],), dtype=torch.int32)


@torch.library.register_fake("fusedattn::merge_attention")
def _merge_attention_fake(out, lse, part_out, part_lse):
    return None


@torch.library.register_fake("fusedattn::bwd")
def _bwd_fake(dout, q, k, v, out, softmax_lse, softmax_scale, causal, window_left, window_right,
              deterministic=False, column_mask=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.register_fake("fusedattn::varlen_bwd")
def _varlen_bwd_fake(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale, causal, window_left, window_right, deterministic=False, check_on_device=False):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# ---- autograd ----------------------------------------------------------------------------------

def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # The incoming gradient's layout is chosen by whatever consumed `out`; the kernels only need
    # its last dimension dense, so copy only when it is not.
    return t if t.stride(-1) == 1 else t.contiguous()


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, window_left, window_right, deterministic, column_mask = inputs
    out, softmax_lse = output
    ctx.save_for_backward(q, k, v, out, softmax_lse, column_mask)
    ctx.mask_args = (softmax_scale, causal, window_left, window_right, deterministic)
    # The log-sum-exp is returned for inspection (return_attn_probs), as in flash_attn: no gradient
    # flows through it.
    ctx.mark_non_differentiable(softmax_lse)


def _fwd_backward(ctx, dout, _dlse):
    q, k, v, out, softmax_lse, column_mask = ctx.saved_tensors
    dq, dk, dv = ops.bwd(_last_dim_contiguous(dout), q, k, v, out, softmax_lse, *ctx.mask_args, column_mask)
    return dq, dk, dv, None, None, None, None, None, None


def _varlen_fwd_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
     window_right, deterministic, seqused_k, block_table, _checked_rows_k, check_on_device) = inputs
    out, softmax_lse = output
    # The argument the backward cannot take, if any (flash_attn's backward takes neither).
    ctx.forward_only = "block_table" if block_table is not None else "seqused_k" if seqused_k is not None else None
    ctx.save_for_backward(q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k)
    ctx.seqlen_args = (max_seqlen_q, max_seqlen_k)
    ctx.mask_args = (softmax_scale, causal, window_left, window_right, deterministic)
    # A forward that read nothing on the host has its backward read nothing either.
    ctx.check_on_device = check_on_device
    ctx.mark_non_differentiable(softmax_lse)


def _varlen_fwd_backward(ctx, dout, _dlse):
    if ctx.forward_only == "block_table":
        raise NotImplementedError("fusedattn: block_table: the backward pass does not support paged K/V "
                                  "(as in flash_attn)")
    if ctx.forward_only == "seqused_k":
        raise NotImplementedError("fusedattn: seqused_k: the backward pass does not support it (as in flash_attn)")
    q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = ops.varlen_bwd(_last_dim_contiguous(dout), q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
                                *ctx.seqlen_args, *ctx.mask_args, check_on_device=ctx.check_on_device)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("fusedattn::fwd", _fwd_backward, setup_context=_fwd_setup_context)
torch.library.register_autograd("fusedattn::varlen_fwd", _varlen_fwd_backward,
                                setup_context=_varlen_fwd_setup_context)
