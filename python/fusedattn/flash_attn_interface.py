"""The flash_attn 2.x Python API on fusedattn's kernels: same functions, arguments, defaults and
return values, so that `from fusedattn import flash_attn_func` replaces
`from flash_attn import flash_attn_func`.

Layouts: q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k, headdim), nheads a
multiple of nheads_k (MQA/GQA); varlen: (total_tokens, nheads, headdim) with int32 cu_seqlens of
batch + 1 offsets. CPU tensors run the CPU backend (float16, bfloat16, float32), CUDA tensors the
CUDA kernels (float16, bfloat16). Any strides are accepted as long as the last dimension is
contiguous; nothing is copied except CUDA views at addresses or strides the kernels' 16-byte loads
cannot follow, which are read through contiguous copies.

Features of flash_attn that fusedattn does not implement (dropout, softcap, ALiBi) raise
NotImplementedError naming the argument instead of being silently ignored.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import _device_faults
from ._ops import ops
from .rotary import check_tables, rotate_at

# flash_attn's "no limit" for either side of window_size.
_UNBOUNDED = -1


def _reject_unsupported(dropout_p: float, softcap: float, alibi_slopes: Optional[torch.Tensor]) -> None:
    if dropout_p != 0.0:
        raise NotImplementedError(f"fusedattn: dropout_p={dropout_p}: attention dropout is not implemented; "
                                  "pass dropout_p=0.0")
    if softcap != 0.0:
        raise NotImplementedError(f"fusedattn: softcap={softcap}: logit soft-capping is not implemented; "
                                  "pass softcap=0.0")
    if alibi_slopes is not None:
        raise NotImplementedError("fusedattn: alibi_slopes: ALiBi biases are not implemented; pass None")


def _window(window_size: Sequence[int], causal: bool) -> tuple[int, int]:
    if len(window_size) != 2:
        raise ValueError(f"fusedattn: window_size must be a pair (left, right), got {window_size!r}")
    # flash_attn reads any negative side as unbounded; the library's -1.
    left, right = (max(int(side), -1) for side in window_size)
    # flash_attn: causal overrides the right side of the window (causal == window_right 0).
    return left, (0 if causal else right)


def _result(out: torch.Tensor, softmax_lse: torch.Tensor, return_attn_probs: bool):
    # The attention probabilities themselves are never materialised (flash_attn only returns them
    # with dropout, for testing); the third element is None.
    return (out, softmax_lse, None) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                    column_mask=None):
    """softmax(q k^T * softmax_scale) v over (batch, seqlen, nheads, headdim) tensors.

    softmax_scale defaults to 1/sqrt(headdim). causal and window_size are aligned to the
    bottom-right corner when seqlen_q != seqlen_k. Returns out (like q), or
    (out, softmax_lse [batch, nheads, seqlen_q] float32, None) when return_attn_probs.

    column_mask (keyword only, an extension: FlashMask's column-sparse masks): an int32 tensor
    (batch, 1 or nheads, seqlen_k, 2 or 4) on q's device; key j of batch b hides itself from query
    rows [m[b, h, j, 0], m[b, h, j, 1]) and, with 4 entries, [m[b, h, j, 2], m[b, h, j, 3]), on top
    of causal / window_size (documents packed into one sequence: each key hides from the rows
    after its document, with causal=True). Forward and backward, on CPU and CUDA tensors (on CUDA
    the portable kernels run it, but for the forward on Hopper at head dims 64 and 128). Hidden
    keys' values must be finite, as in flash_attn: a hidden score's weight is 0, and 0 * inf is
    NaN.
    """
    _reject_unsupported(dropout_p, softcap, alibi_slopes)
    left, right = _window(window_size, causal)
    out, lse = ops.fwd(q, k, v, softmax_scale, causal, left, right, deterministic, column_mask)
    return _result(out, lse, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                              column_mask=None):
    """flash_attn_func on qkv of shape (batch, seqlen, 3, nheads, headdim) (column_mask as there)."""
    q, k, v = qkv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, column_mask=column_mask)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                             column_mask=None):
    """flash_attn_func with kv of shape (batch, seqlen_k, 2, nheads_k, headdim) (column_mask as there)."""
    k, v = kv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, column_mask=column_mask)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None, *,
                           seqused_k=None, check_on_device=False):
    """Attention over packed variable-length sequences: q (total_q, nheads, headdim), k/v
    (total_k, nheads_k, headdim); sequence b holds rows cu_seqlens[b]:cu_seqlens[b + 1].

    seqused_k (keyword only, an extension from FlashAttention-3's API): an int32 tensor of one
    key count per sequence on q's device; sequence b then attends to the first seqused_k[b] of
    its key rows (padded KV caches). It is not read on the host; entries are clamped to
    [0, rows]. Forward only: gradients through such a call raise NotImplementedError.

    block_table (paged K/V, flash_attn's layout): an int32 (batch, max_blocks_per_seq) tensor on
    q's device; k and v are then pools of pages (num_blocks, page_block_size, nheads_k, headdim),
    and key j of sequence b is row j % page_block_size of block block_table[b, j //
    page_block_size]. Sequence b has cu_seqlens_k[b + 1] - cu_seqlens_k[b] keys (the offsets'
    starts index no rows), or seqused_k[b] of them when given. Page sizes: any on the CPU; on CUDA
    a multiple of 128 (flash_attn needs 256), else NotImplementedError naming k. Every call reads
    cu_seqlens and the table on the host (a wait for the stream; a paged call's offsets are not
    remembered as checked) and raises naming block_table unless each entry some sequence's keys
    reach names a block of the pools; entries past them are never read (-1 is fine). Forward
    only, as in flash_attn: gradients through a paged call raise NotImplementedError.

    check_on_device (keyword only, CUDA): nothing is read on the host, so the call never waits for
    the stream; a kernel after the attention checks the offsets (and the table's entries each
    sequence's used keys reach) and, on a fault, fills out and softmax_lse with NaN and records the
    fault, which fusedattn.check_device_errors() raises as the host check would have. Calls
    captured in a CUDA graph always check this way (a host read cannot be captured): each replay
    checks the offsets and table the tensors hold then. The backward of such a call (autograd)
    checks the offsets on the device too, filling the gradients with NaN on a fault.

    Returns out (like q), or (out, softmax_lse [nheads, total_q] float32, None).
    """
    _reject_unsupported(dropout_p, softcap, alibi_slopes)
    left, right = _window(window_size, causal)
    out, lse = ops.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                              softmax_scale, causal, left, right, deterministic, seqused_k, block_table,
                              check_on_device=check_on_device)
    return _result(out, lse, return_attn_probs)


def check_device_errors(device=None) -> None:
    """Raises the first fault that the device check of variable-length offsets (check_on_device,
    or any varlen call captured in a CUDA graph) found on `device` (default: the current CUDA
    device) since the last call, as the host check would have named it (ValueError naming
    cu_seqlens_q/k, max_seqlen_q/k or block_table), and forgets it; then, on a later call, the
    first that flash_attn_with_kvcache's checks on the device found (cache_seqlens,
    cache_batch_idx, rotary_cos: see there). Waits for the device; not to be called while one of
    its streams is being captured. No device given where torch sees no GPU has nothing to check."""
    if device is None and not torch.cuda.is_available():
        return
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda":
        ops.check_device_errors(device)
    _device_faults.raise_recorded(device)


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


def _check_lengths_tensor(cache_seqlens: torch.Tensor, batch: int, device) -> None:
    """cache_seqlens as a tensor: one integer length per sequence, on q's device (its values unread)."""
    if cache_seqlens.dim() != 1 or cache_seqlens.shape[0] != batch or cache_seqlens.is_floating_point() \
            or cache_seqlens.dtype == torch.bool or cache_seqlens.is_complex():
        raise ValueError(f"fusedattn: cache_seqlens: must be an int or an integer tensor of {batch} lengths "
                         f"(one per sequence), got {cache_seqlens.dtype} of shape {tuple(cache_seqlens.shape)}")
    if cache_seqlens.device != device:
        raise ValueError(f"fusedattn: cache_seqlens: must be on q's device ({device}), got {cache_seqlens.device}")


def _read_on_host(t: torch.Tensor, name: str) -> torch.Tensor:
    """t copied to the host for flash_attn_with_kvcache's checks (a wait for the stream), or, in a
    CUDA graph capture, which cannot wait, a RuntimeError naming the argument and what a captured
    call takes instead."""
    if _capturing(t.device):
        raise RuntimeError(f"fusedattn: {name}: flash_attn_with_kvcache reads it on the host here, which a CUDA graph "
                           "capture cannot; a captured call checks on the device with cache_seqlens a CUDA tensor, "
                           "no cache_leftpad, and unpaged caches or pages of a multiple of 128 positions")
    return t.cpu()


def _cache_lengths(cache_seqlens, batch: int, new: int, capacity: int, device) -> list[int]:
    """The cache's per-sequence lengths before the new tokens, checked on the host (a copy that
    waits for the stream): each in [0, capacity - new]."""
    if isinstance(cache_seqlens, int):
        lengths = [cache_seqlens] * batch
    elif isinstance(cache_seqlens, torch.Tensor):
        _check_lengths_tensor(cache_seqlens, batch, device)
        lengths = [int(n) for n in _read_on_host(cache_seqlens, "cache_seqlens").tolist()]
    else:
        raise ValueError(f"fusedattn: cache_seqlens: must be an int or a tensor, got {type(cache_seqlens).__name__}")
    for b, n in enumerate(lengths):
        if n < 0 or n + new > capacity:
            raise ValueError(_device_faults.capacity_message(b, n, new, capacity))
    return lengths


def _rows_of(cache: torch.Tensor, name: str) -> tuple[torch.Tensor, int]:
    """cache (batch, positions, heads, dim) as one (rows, heads, dim) view over its storage, and the
    rows between two sequences' first positions (its batch stride over its position stride)."""
    batch, positions = cache.shape[0], cache.shape[1]
    step = cache.stride(1)
    if step <= 0 or cache.stride(0) % step != 0 or (batch > 1 and cache.stride(0) // step < positions):
        raise ValueError(f"fusedattn: {name}: its batch stride ({cache.stride(0)}) must be a multiple of its "
                         f"position stride ({step}), at least {positions} of them")
    pitch = cache.stride(0) // step if batch > 1 else positions
    rows = (batch - 1) * pitch + positions
    view = cache.as_strided((rows, cache.shape[2], cache.shape[3]), (step, cache.stride(2), cache.stride(3)),
                            cache.storage_offset())
    return view, pitch


# The kvcache call's offsets, by (rows per sequence, rows of the last, batch, device): the same
# tensors every decode step, so the binding checks each once (it remembers checked offsets by
# tensor and version) instead of reading new ones on the host at every call.
_OFFSETS: dict = {}
_MAX_CACHED_OFFSETS = 64
_INT32_MAX = 2**31 - 1


def _strided_offsets(pitch: int, last: int, batch: int, device) -> torch.Tensor:
    """int32 offsets 0, pitch, ..., (batch - 1) * pitch, (batch - 1) * pitch + last on device."""
    key = (pitch, last, batch, device)
    offsets = _OFFSETS.get(key)
    if offsets is None:
        end = (batch - 1) * pitch + last
        if end > _INT32_MAX:
            raise ValueError(f"fusedattn: k_cache: its {end} rows exceed the int32 offsets of variable-length calls")
        if len(_OFFSETS) >= _MAX_CACHED_OFFSETS:
            _OFFSETS.clear()
        # Outside inference mode, so that the tensor has the version counter the binding's check
        # remembers (inference tensors are checked at every call). Made on the device, with no
        # copy from the host, which a CUDA graph capture (the first call may be one) refuses.
        with torch.inference_mode(False):
            offsets = torch.arange(batch + 1, dtype=torch.int64, device=device) * pitch
            offsets[batch:].fill_(end)  # a fill kernel (item assignment would copy the value from the host)
            offsets = offsets.to(torch.int32)
        # Not remembered when made in a capture: its values exist only once the graph replays.
        if not _capturing(device):
            _OFFSETS[key] = offsets
    return offsets


_capturing = _device_faults.capturing


def _check_rotary(rotary_cos, rotary_sin, q: torch.Tensor, new: int) -> None:
    """The rotary tables: both or neither, with new keys to rotate, (seqlen_ro, rotary_dim / 2)
    floating point on q's device, rotary_dim at most q's head dim."""
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("fusedattn: rotary_cos, rotary_sin: pass both rotary tables, or neither")
    if rotary_cos is None:
        return
    if new == 0:
        raise ValueError("fusedattn: rotary_cos: rotary embedding applies to new keys; pass k and v with it")
    check_tables(q, rotary_cos, rotary_sin, "fusedattn: ", "rotary_cos", "rotary_sin", "q")


def _rotary_reach(q, k, masked: bool) -> int:
    """How far past a sequence's length the rotary tables are read: its last new key, or under a
    mask its last query row."""
    return max(k.shape[1] - 1, q.shape[1] - 1 if masked else 0)


def _new_positions(starts: torch.Tensor, new: int) -> torch.Tensor:
    """The new tokens' cache positions (batch, new): starts[b] + j."""
    return starts[:, None] + torch.arange(new, device=starts.device)


def _rotate_new_tokens(q, k, starts: torch.Tensor, positions: torch.Tensor, rotary_cos, rotary_sin,
                       interleaved: bool, masked: bool):
    """q and k rotated (rotary_cos given) by flash_attn's rule: k at its positions
    (_new_positions(starts)), q's rows at the same positions under a mask (masked), else all of q
    at starts[b]; positions must be inside the tables."""
    if rotary_cos is None:
        return q, k
    q_positions = starts[:, None] + torch.arange(q.shape[1], device=q.device) * int(masked)
    return (rotate_at(q, rotary_cos, rotary_sin, q_positions, interleaved),
            rotate_at(k, rotary_cos, rotary_sin, positions, interleaved))


def _place_new_tokens(q, k, lengths: list[int], rotary_cos, rotary_sin, interleaved: bool, masked: bool):
    """The new tokens' cache positions (batch, seqlen_new): lengths[b] + j; and q and k rotated
    (_rotate_new_tokens). Checks the tables reach the last position read."""
    # One length (an int cache_seqlens) by a fill: a copy from the host, which torch.tensor makes,
    # cannot be captured in a CUDA graph.
    uniform = bool(lengths) and all(n == lengths[0] for n in lengths)
    starts = torch.full((len(lengths),), lengths[0], device=q.device) if uniform else \
        torch.tensor(lengths, device=q.device)
    if rotary_cos is not None:
        last = max(lengths) + _rotary_reach(q, k, masked)
        if last >= rotary_cos.shape[0]:
            raise ValueError(_device_faults.rotary_message(rotary_cos.shape[0], last))
    positions = _new_positions(starts, k.shape[1])
    q, k = _rotate_new_tokens(q, k, starts, positions, rotary_cos, rotary_sin, interleaved, masked)
    return q, k, positions


def _append_on_device(q, k, v, k_cache, v_cache, lengths: torch.Tensor, capacity: int, table, cache_row,
                      rotary_cos, rotary_sin, interleaved: bool, masked: bool, faults: _device_faults.Faults):
    """The new tokens written with the lengths (int64, batch) on the device, by one append_kv
    launch that checks each sequence where it writes it (fusedattn/kv_cache.h). Here, in the host
    path's order, the rules that name a fault: the lengths (append_kv's own rule, for the fault's
    value), cache_batch_idx's rows (cache_row: (bool, batch) whether each names a cache row, or
    None) and the rotary tables' reach, which decides the positions k and q rotate at. Returns q
    (rotated) and fits (bool, batch: the sequences written and attended; a block_table entry of no
    page also stops the write, which the library's check of the table then names)."""
    new = k.shape[1]
    fits = (lengths >= 0) & (lengths <= capacity - new)
    faults.add(_device_faults.CAPACITY, ~fits, lengths, capacity, new)
    if cache_row is not None:
        faults.add(_device_faults.CACHE_ROW, fits & ~cache_row, table[:, 0], k_cache.shape[0], k_cache.shape[1])
        fits = fits & cache_row
    if rotary_cos is not None:
        starts = torch.where(fits, lengths, 0)
        last = starts + _rotary_reach(q, k, masked)
        inside = last < rotary_cos.shape[0]
        faults.add(_device_faults.ROTARY, ~inside, last.max().expand_as(last), rotary_cos.shape[0])
        fits = fits & inside
        starts = torch.where(inside, starts, 0)
        q, k = _rotate_new_tokens(q, k, starts, _new_positions(starts, new), rotary_cos, rotary_sin, interleaved,
                                  masked)
    # A sequence that failed a rule here is given no length, which append_kv does not write.
    ops.append_kv(k_cache, v_cache, k, v, torch.where(fits, lengths, -1).to(torch.int32), table)
    return q, fits


def _nan_where_failed(result, fits: Optional[torch.Tensor]):
    """out (batch, seqlen_q, heads, dim), or (out, lse (batch, heads, seqlen_q)), with NaN in the
    rows of the sequences that failed a check on the device (fits false)."""
    if fits is None:
        return result
    nan = float("nan")
    if isinstance(result, tuple):
        out, lse = result
        return torch.where(fits[:, None, None, None], out, nan), torch.where(fits[:, None, None], lse, nan)
    return torch.where(fits[:, None, None, None], result, nan)


def _check_int32(t, name: str, fits, expected: str, device) -> None:
    """An int32 tensor argument on q's device whose shape fits(shape) accepts; else a ValueError
    naming it, the shape expected and what it got."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.device != device or not fits(t.shape):
        got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"fusedattn: {name}: must be an int32 {expected} tensor on q's device ({device}); got {got}")


def _leftpad_starts(cache_leftpad, lengths: list[int], device) -> list[int]:
    """cache_leftpad (int32, one per sequence) read on the host: sequence b's keys start at cache
    position cache_leftpad[b], at most its length (cache_seqlens[b])."""
    batch = len(lengths)
    _check_int32(cache_leftpad, "cache_leftpad", lambda shape: tuple(shape) == (batch,), f"(batch {batch},)", device)
    starts = [int(a) for a in _read_on_host(cache_leftpad, "cache_leftpad").tolist()]
    for b, (a, n) in enumerate(zip(starts, lengths)):
        if not 0 <= a <= n:
            raise ValueError(f"fusedattn: cache_leftpad: sequence {b} starts at {a}, outside its {n} cached positions")
    return starts


def _paged_blocks(block_table, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: int, device,
                  name: str = "block_table") -> torch.Tensor:
    """block_table checked against the paged caches (num_blocks, page_block_size, nheads_k,
    headdim): int32 (batch, max_blocks_per_seq) on q's device, returned as it is (int32: what the
    kernels read). cache_batch_idx (int32, batch) is checked as its one-column table (name says
    which)."""
    expected = f"(batch {batch},)" if name == "cache_batch_idx" else f"(batch {batch}, max_blocks_per_seq >= 1)"
    _check_int32(block_table, name, lambda shape: len(shape) == 2 and shape[0] == batch and shape[1] > 0, expected,
                 device)
    if k_cache.shape[0] == 0 or k_cache.shape[1] == 0 or v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"fusedattn: k_cache, v_cache: paged caches must be (num_blocks >= 1, page_block_size >= 1, "
                         f"nheads_k, headdim), alike but for headdim; got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    return block_table


# The CUDA kernels read paged K/V in pages of a multiple of this many rows (kCudaPageRows in
# include/fusedattn/attention.h); the CPU backend reads pages of any size.
_CUDA_PAGE_ROWS = 128


def _kernels_read_pages(device: torch.device, page_size: int) -> bool:
    """Whether the kernels for `device` read paged caches of page_size positions in place (else
    flash_attn_with_kvcache gathers the pages into a contiguous copy first)."""
    return device.type != "cuda" or page_size % _CUDA_PAGE_ROWS == 0


def _decode_varlen(q, k, v, cu_k: torch.Tensor, max_seqlen_k: int, softmax_scale, causal: bool, left: int,
                   right: int, return_softmax_lse: bool, seqused_k=None, block_table=None, checked_rows_k=-1,
                   check_on_device=False):
    """One variable-length call for flash_attn_with_kvcache: q (batch, seqlen_q, nheads, headdim)
    as batch sequences of seqlen_q rows over k/v's keys (cu_k, seqused_k, block_table,
    check_on_device as in flash_attn_varlen_func; checked_rows_k: the rows cu_k spans, where this
    module has checked cu_k and the table's entries in use, so the library reads neither again);
    out and softmax_lse back in the kvcache shapes."""
    batch, seqlen_q = q.shape[0], q.shape[1]
    cu_q = _strided_offsets(seqlen_q, seqlen_q, batch, q.device)
    out, lse = ops.varlen_fwd(q.reshape(batch * seqlen_q, *q.shape[2:]), k, v, cu_q, cu_k, seqlen_q, max_seqlen_k,
                              softmax_scale, causal, left, right, False, seqused_k, block_table, checked_rows_k,
                              check_on_device)
    out = out.reshape(batch, seqlen_q, *out.shape[1:])
    if not return_softmax_lse:
        return out
    return out, lse.view(lse.shape[0], batch, seqlen_q).permute(1, 0, 2).contiguous()


def _check_pages_in_use(table: torch.Tensor, visible: list[int], page: int, num_blocks: int, name: str) -> None:
    """Each sequence's pages that hold its first visible[b] positions name blocks of the caches (one
    host copy of the table, checked as a whole). The others are never read and may hold anything."""
    host = _read_on_host(table, name)
    pages = torch.tensor([-(-n // page) for n in visible], dtype=torch.int64)
    in_use = torch.arange(host.shape[1])[None, :] < pages[:, None]
    outside = in_use & ((host < 0) | (host >= num_blocks))
    if bool(outside.any()):
        b, i = (int(x) for x in outside.nonzero()[0])  # the first in row-major order
        raise ValueError(_device_faults.page_outside_message(name, b, i, int(host[b, i]), page, num_blocks))


def _paged_kvcache(q, k_cache, v_cache, k, v, table: torch.Tensor, table_name: str, lengths: list[int],
                   in_place: bool, rotary_cos, rotary_sin, rotary_interleaved: bool, softmax_scale, causal,
                   window_size, return_softmax_lse):
    """flash_attn_with_kvcache over paged caches (table: block_table, or cache_batch_idx as one
    page per sequence, int32; lengths checked): the new tokens are written into their pages,
    then one variable-length call reads the pages through the table where the kernels can
    (in_place: _kernels_read_pages), else each sequence's pages are gathered into one contiguous
    copy, which the unpaged call attends over."""
    page, new = k_cache.shape[1], 0 if k is None else k.shape[1]
    visible = [n + new for n in lengths]
    # Only the pages that some sequence's keys reach are checked, read and copied (a table sized
    # for the longest context costs nothing past them).
    table = table[:, :max([-(-n // page) for n in visible] + [1])]
    _check_pages_in_use(table, visible, page, k_cache.shape[0], table_name)
    # Sequence b's keys are its first visible[b] positions, from its pages; the offsets give only
    # the counts. Both they and the table's entries in use are checked here, on the host, so the
    # library is told (checked_rows_k) and reads neither again.
    ends = torch.tensor([0] + visible, dtype=torch.int64).cumsum(0)
    if in_place and ends[-1] > _INT32_MAX:  # checked before the caches are written
        raise ValueError(f"fusedattn: cache_seqlens: the sequences' {int(ends[-1])} keys in all exceed the int32 "
                         "offsets of variable-length calls")
    left, right = _window(window_size, causal)
    if new > 0 and visible:
        q, k, positions = _place_new_tokens(q, k, lengths, rotary_cos, rotary_sin, rotary_interleaved,
                                            left >= 0 or right >= 0)
        blocks = table.gather(1, positions // page).long()
        k_cache[blocks, positions % page] = k
        v_cache[blocks, positions % page] = v
    if in_place:
        cu_k = ends.to(device=q.device, dtype=torch.int32)
        entries = _contiguous_rows(table)
        return _decode_varlen(q, k_cache, v_cache, cu_k, max(visible, default=0), softmax_scale, causal, left, right,
                              return_softmax_lse, block_table=entries, checked_rows_k=int(ends[-1]))
    # Pages past a sequence's keys may name any block: they are read as block 0 and never attended.
    gathered = table.clamp(0, k_cache.shape[0] - 1).long()
    k_seq, v_seq = (cache[gathered].flatten(1, 2) for cache in (k_cache, v_cache))
    used = torch.tensor(visible, dtype=torch.int32, device=q.device)
    return flash_attn_with_kvcache(q, k_seq, v_seq, cache_seqlens=used, softmax_scale=softmax_scale, causal=causal,
                                   window_size=window_size, return_softmax_lse=return_softmax_lse)


def _lengths_on_device(cache_seqlens, checked: bool) -> bool:
    """Whether flash_attn_with_kvcache leaves cache_seqlens unread on the host: a CUDA tensor,
    where nothing needs checking (checked false: decoding without new tokens or cache_batch_idx)
    or the stream is being captured into a CUDA graph. The device's checks are ~50 small tensor
    operations (a graph replays them at no host cost), which cost an eager call more than the host
    read they save: at batch 1, 0.83 against 0.18 ms (H200, docs/perf.md, fiftieth session)."""
    return isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.is_cuda and \
        (not checked or _capturing(cache_seqlens.device))


def _device_lengths(cache_seqlens: torch.Tensor, capacity: int) -> torch.Tensor:
    """A CUDA cache_seqlens as the kernels' seqused_k, unread on the host: int32 as it is (the
    kernels clamp each count to its sequence's rows), wider integers clamped to [0, capacity] first."""
    if cache_seqlens.dtype == torch.int32:
        return cache_seqlens.contiguous()
    return cache_seqlens.clamp(0, capacity).to(torch.int32)


def _contiguous_rows(table: torch.Tensor) -> torch.Tensor:
    """A block table whose rows' entries are contiguous (any row stride), as the kernels read it."""
    return table if table.stride(-1) == 1 else table.contiguous()


def _paged_kvcache_on_device(q, k_cache, v_cache, k, v, table: torch.Tensor, table_name: str,
                             cache_seqlens: torch.Tensor, capacity: int, rotary_cos, rotary_sin,
                             rotary_interleaved: bool, softmax_scale, causal, window_size, return_softmax_lse):
    """flash_attn_with_kvcache over paged caches the kernels read in place (table: block_table, or
    cache_batch_idx as one page per sequence), with the lengths a CUDA tensor: one variable-length
    call, and nothing read on the host. Each sequence's offsets span the table row's capacity; its
    keys are its first cache_seqlens[b] (+ seqlen_new) positions (seqused_k). The device checks the
    table's entries those keys reach (check_on_device). Without new tokens the lengths are clamped
    to [0, capacity]; with them they are checked, as are cache_batch_idx's rows and the rotary
    tables' reach, by _device_faults' rules: a sequence that fails is not written and reads NaN."""
    batch, page, blocks = q.shape[0], k_cache.shape[1], k_cache.shape[0]
    left, right = _window(window_size, causal)
    faults, fits = _device_faults.Faults(), None
    # cache_batch_idx's rows are checked here, not by the library's check of the table, which would
    # name block_table; the call then reads row 0 for a row of no cache.
    cache_row = (table[:, 0] >= 0) & (table[:, 0] < blocks) if table_name == "cache_batch_idx" else None
    if k is None:
        used = _device_lengths(cache_seqlens, capacity)
        if cache_row is not None:
            has_keys = used > 0
            faults.add(_device_faults.CACHE_ROW, has_keys & ~cache_row, table[:, 0], blocks, page)
            fits = cache_row | ~has_keys
    else:
        lengths = cache_seqlens.long()
        q, fits = _append_on_device(q, k, v, k_cache, v_cache, lengths, capacity, table, cache_row, rotary_cos,
                                    rotary_sin, rotary_interleaved, left >= 0 or right >= 0, faults)
        used = torch.where(fits, lengths + k.shape[1], 0).to(torch.int32)
    if cache_row is not None:
        table = torch.where(cache_row[:, None], table, 0)
    faults.record()
    cu_k = _strided_offsets(capacity, capacity, batch, q.device)
    result = _decode_varlen(q, k_cache, v_cache, cu_k, capacity, softmax_scale, causal, left, right,
                            return_softmax_lse, seqused_k=used, block_table=_contiguous_rows(table),
                            check_on_device=True)
    return _nan_where_failed(result, fits)


@torch.no_grad()
def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Attention of q (batch, seqlen_q, nheads, headdim) over a KV cache (batch, seqlen_cache,
    nheads_k, headdim), for decoding; forward only, as in flash_attn.

    cache_seqlens (an int, or one int32 length per sequence) says how many positions of each
    sequence's cache hold keys; None means all of them. With k and v (batch, seqlen_new, nheads_k,
    headdim) the new keys and values are first written into the caches in place after those
    positions, and attention runs over cache_seqlens + seqlen_new keys. causal and window_size are
    aligned to the bottom-right corner (the last query sees the last key). Returns out, or
    (out, softmax_lse [batch, nheads, seqlen_q]) with return_softmax_lse.

    rotary_cos and rotary_sin (seqlen_ro, rotary_dim / 2), with k and v, rotate the first
    rotary_dim dims of the new keys at positions cache_seqlens, cache_seqlens + 1, ... before they
    are written, and of q: at those positions under causal or window masks, else all of q at
    cache_seqlens (flash_attn's rule). Dims (0, 1), (2, 3), ... pair up when rotary_interleaved,
    else (i, i + rotary_dim / 2). Computed in fp32 and rounded once; any even rotary_dim up to the
    head dim (flash_attn needs a multiple of 16).

    Caches filled to one length run as a plain call on views of them, others as one
    variable-length call over the caches' rows with a key count per sequence (seqused_k); nothing
    is copied. cache_seqlens is read on the host and checked first (a length outside [0,
    seqlen_cache - seqlen_new] raises), except a CUDA tensor where nothing needs checking or the
    call is being captured into a CUDA graph; it then waits for nothing. Without new tokens (nor
    cache_batch_idx) each length is clamped to [0, seqlen_cache], as seqused_k's are, not checked.
    A captured call with new tokens or cache_batch_idx makes the host's checks on the device (the
    lengths, cache_batch_idx's rows, the rotary tables' reach): a sequence that fails one is not
    written and its out and softmax_lse rows are NaN, and fusedattn.check_device_errors() raises
    the call's first fault in the host check's words. (Eager, those checks' ~50 small launches
    would cost more than the host read.)

    Paged caches: with block_table (int32, batch x max_blocks_per_seq), k_cache and v_cache are
    (num_blocks, page_block_size, nheads_k, headdim) pools, sequence b's position p in block
    block_table[b, p // page_block_size] at row p % page_block_size; any page size. The new tokens
    are written into their pages; then, on the CPU and for CUDA page sizes that are a multiple of
    128, one variable-length call reads the pages through the table (flash_attn_varlen_func's
    block_table). Other CUDA page sizes (vLLM's 16, say) have each sequence's pages gathered into a
    contiguous copy that the kernels attend over: a pass over the pages in use per call. Every
    page a sequence's keys reach must name a block of the pools; pages past them are never read.
    The lengths and the table are read on the host to check that (a wait for the stream), except
    over pages the CUDA kernels read in place with cache_seqlens a CUDA tensor that is left unread
    as above: the lengths are then treated as there (a length without new tokens clamped to [0,
    the table row's positions]) and the device checks the entries the keys reach; a bad one fills
    the output with NaN and is raised by fusedattn.check_device_errors() (flash_attn_varlen_func's
    check_on_device). A new token whose page names no block is not written.
    cache_batch_idx (int32, batch): sequence b reads and appends to cache row cache_batch_idx[b]
    of caches (batch_cache, seqlen_cache, nheads_k, headdim), through the same path (one page of
    seqlen_cache positions per sequence, so read in place on the CPU and for CUDA seqlen_cache a
    multiple of 128, else copied), with the same reads; not with block_table, as in flash_attn.
    cache_leftpad (int32, batch): sequence b's keys start at cache position
    cache_leftpad[b] (at most cache_seqlens[b]), so it attends over positions cache_leftpad[b] ..
    cache_seqlens[b] + seqlen_new - 1, its masks aligned to that range's end; the new tokens still
    go at cache_seqlens[b], rotated at those absolute positions. It reads the lengths on the host,
    and is not taken with cache_batch_idx or block_table. Not implemented, and rejected naming the
    argument: softcap, ALiBi, and num_splits other than 0 (the kernels choose the split).
    """
    _reject_unsupported(0.0, softcap, alibi_slopes)
    if cache_leftpad is not None and (cache_batch_idx is not None or block_table is not None):
        raise ValueError("fusedattn: cache_leftpad: not supported with cache_batch_idx or block_table; "
                         "pass None")
    if cache_batch_idx is not None and block_table is not None:
        raise ValueError("fusedattn: cache_batch_idx: not supported with block_table (nor in flash_attn); pass one")
    if num_splits != 0:
        raise NotImplementedError(f"fusedattn: num_splits={num_splits}: the kernels choose how to split the KV "
                                  "length themselves; pass 0")
    if (k is None) != (v is None):
        raise ValueError("fusedattn: k, v: pass both new keys and new values, or neither")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)) + ((("k", k), ("v", v)) if k is not None else ()):
        if t.dim() != 4:
            raise ValueError(f"fusedattn: {name}: expected rank 4 (batch, seqlen, heads, headdim), got shape "
                             f"{tuple(t.shape)}")
    batch, seqlen_q = q.shape[0], q.shape[1]
    # cache_batch_idx reads sequence b's cache row idx[b]: a paged cache of one page per sequence.
    table_name = "block_table" if cache_batch_idx is None else "cache_batch_idx"
    if cache_batch_idx is not None:  # as a column; any other rank fails _paged_blocks' check
        block_table = cache_batch_idx[..., None] if isinstance(cache_batch_idx, torch.Tensor) else cache_batch_idx
    table = None if block_table is None else _paged_blocks(block_table, k_cache, v_cache, batch, q.device, table_name)
    if table is None and (k_cache.shape[0] != batch or v_cache.shape[:3] != k_cache.shape[:3]):
        raise ValueError(f"fusedattn: v_cache: shape {tuple(v_cache.shape)} and k_cache {tuple(k_cache.shape)} must "
                         f"match in (batch, seqlen_cache, heads) with batch {batch} (q's)")
    # A sequence's positions: its cache's, or its pages' (block_table's columns times the page).
    capacity = k_cache.shape[1] * (1 if table is None else table.shape[1])
    left, right = _window(window_size, causal)
    if cache_seqlens is None:
        if k is not None:
            raise ValueError("fusedattn: cache_seqlens: needed with k and v, to say where the new tokens go")
        cache_seqlens = capacity  # every position holds a key
    new = 0 if k is None else k.shape[1]
    if k is not None and (k.shape[0] != batch or k.shape[2:] != k_cache.shape[2:] or v.shape != k.shape):
        raise ValueError(f"fusedattn: k, v: shapes {tuple(k.shape)} and {tuple(v.shape)} must be (batch {batch}, "
                         f"seqlen_new, {k_cache.shape[2]}, {k_cache.shape[3]}), alike")
    if k is not None and (k.dtype != k_cache.dtype or v.dtype != v_cache.dtype):
        raise ValueError(f"fusedattn: k, v: dtypes {k.dtype} and {v.dtype} must be the caches' "
                         f"({k_cache.dtype}, {v_cache.dtype})")
    _check_rotary(rotary_cos, rotary_sin, q, new)
    # Lengths the device keeps are not read on the host where _lengths_on_device says so: the
    # device checks them (no wait for the stream, so the call can be captured in a CUDA graph).
    checked = new > 0 or cache_batch_idx is not None
    on_device = cache_leftpad is None and batch > 0 and _lengths_on_device(cache_seqlens, checked)
    if checked and q.is_cuda and not _capturing(q.device):
        _device_faults.prepare(q.device)  # the record a capture of this call writes (made outside it)
    if on_device:
        _check_lengths_tensor(cache_seqlens, batch, q.device)
        if new > capacity:  # no length would do
            raise ValueError(f"fusedattn: k: its {new} new tokens exceed the cache's {capacity} positions")
    if table is not None:
        # ... where the kernels read the pages in place; the device checks the table too.
        in_place = _kernels_read_pages(q.device, k_cache.shape[1])
        if on_device and in_place:
            return _paged_kvcache_on_device(q, k_cache, v_cache, k, v, table, table_name, cache_seqlens, capacity,
                                            rotary_cos, rotary_sin, rotary_interleaved, softmax_scale, causal,
                                            window_size, return_softmax_lse)
        lengths = _cache_lengths(cache_seqlens, batch, new, capacity, q.device)
        return _paged_kvcache(q, k_cache, v_cache, k, v, table, table_name, lengths, in_place, rotary_cos,
                              rotary_sin, rotary_interleaved, softmax_scale, causal, window_size, return_softmax_lse)
    lengths = None if on_device else _cache_lengths(cache_seqlens, batch, new, k_cache.shape[1], q.device)
    pads = [0] * batch if cache_leftpad is None else _leftpad_starts(cache_leftpad, lengths, q.device)
    if batch == 0:
        out = q.new_zeros(q.shape[:3] + v_cache.shape[3:])
        return (out, q.new_zeros(0, q.shape[2], seqlen_q, dtype=torch.float32)) if return_softmax_lse else out
    # Every check before the caches are written: a call that raises leaves them as they were.
    uniform = not on_device and all(n == lengths[0] and a == pads[0] for n, a in zip(lengths, pads))
    if not uniform:
        k_rows, k_pitch = _rows_of(k_cache, "k_cache")
        v_rows, v_pitch = _rows_of(v_cache, "v_cache")
        if v_pitch != k_pitch:
            raise ValueError(f"fusedattn: v_cache: its batch stride spans {v_pitch} positions, k_cache's {k_pitch}")
    fits = None  # on the device: the sequences that pass its checks (_append_on_device)
    if new > 0 and on_device:
        faults = _device_faults.Faults()
        device_lengths = cache_seqlens.long()
        q, fits = _append_on_device(q, k, v, k_cache, v_cache, device_lengths, k_cache.shape[1], None, None,
                                    rotary_cos, rotary_sin, rotary_interleaved, left >= 0 or right >= 0, faults)
        faults.record()
    elif new > 0:
        q, k, positions = _place_new_tokens(q, k, lengths, rotary_cos, rotary_sin, rotary_interleaved,
                                            left >= 0 or right >= 0)
        rows = torch.arange(batch, device=q.device)[:, None]
        k_cache[rows, positions] = k
        v_cache[rows, positions] = v
    if uniform:  # every sequence sees the same positions: a plain call on views of the caches
        first, end = pads[0], lengths[0] + new
        out, lse = ops.fwd(q, k_cache[:, first:end], v_cache[:, first:end], softmax_scale, causal, left, right,
                           False)
        return (out, lse) if return_softmax_lse else out
    # Sequence b's rows of the views start at b * pitch (+ its left padding); the next lengths[b]
    # + new hold its keys.
    rows_k = k_pitch  # the most rows a sequence's range of the views spans
    if cache_leftpad is None:
        cu_k = _strided_offsets(k_pitch, k_cache.shape[1], batch, q.device)
    else:  # this call's padding: the views start at the first sequence's first key, the offsets
        # are made (and checked by the binding) per call
        first = pads[0]
        k_rows, v_rows = k_rows[first:], v_rows[first:]
        end = (batch - 1) * k_pitch + k_cache.shape[1] - first
        offsets = [b * k_pitch + a - first for b, a in enumerate(pads)] + [end]
        cu_k = torch.tensor(offsets, dtype=torch.int32, device=q.device)
        rows_k = max(stop - begin for begin, stop in zip(offsets, offsets[1:]))
    if fits is not None:
        used = torch.where(fits, device_lengths + new, 0).to(torch.int32)
    elif on_device:
        used = _device_lengths(cache_seqlens, k_cache.shape[1])
    else:
        used = torch.tensor([n + new - a for n, a in zip(lengths, pads)], dtype=torch.int32, device=q.device)
    return _nan_where_failed(_decode_varlen(q, k_rows, v_rows, cu_k, rows_k, softmax_scale, causal, left, right,
                                            return_softmax_lse, seqused_k=used), fits)


def attention(q, k, v, causal=False, sm_scale=None):
    """The Triton fused-attention tutorial's entry point, on (batch, nheads, seqlen, headdim) tensors.

    The transposes are views: the kernels read the BHSD memory directly through its strides.
    """
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=sm_scale,
                          causal=causal)
    return out.transpose(1, 2)
