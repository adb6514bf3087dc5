"""flash_attn_with_kvcache: decoding over a KV cache, with and without new tokens appended in
place, against the float64 reference over each sequence's visible keys; and its rejections."""
from __future__ import annotations

import math

import pytest
import torch

import fusedattn
from conftest import DEVICES, DTYPES, assert_2x_rule, attention_math, default_scale, randn
from fusedattn import flash_attn_interface

# The page sizes whose multiples the CUDA kernels read in place (kCudaPageRows); the CPU backend
# reads any page size.
CUDA_PAGE_ROWS = 128
# flash_attn_with_kvcache's two ways over paged caches: the kernels read the pages through the
# table, or the pages in use are gathered into a contiguous copy first.
PAGED_PATHS = ["kernels", "gather"]


def caches(batch, capacity, heads_kv, d, dtype, device, layout="bshd"):
    """k and v caches of fresh values; "bhsd" stores them head-major (a transposed view)."""
    if layout == "bhsd":
        return tuple(randn(batch, heads_kv, capacity, d, dtype=dtype, device=device).transpose(1, 2)
                     for _ in range(2))
    return tuple(randn(batch, capacity, heads_kv, d, dtype=dtype, device=device) for _ in range(2))


def check_against_reference(q, k_cache, v_cache, visible, out, lse, causal, window):
    """out/lse of sequence b against the reference over its first visible[b] cache positions."""
    left, right = window[0], (0 if causal else window[1])
    for b, n in enumerate(visible):
        args = (q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], None, default_scale(q.shape[-1]), left, right)
        reference, plain = attention_math(*args), attention_math(*args, dtype=q.dtype)
        assert_2x_rule(f"out[seq {b}]", out[b:b + 1], reference[0], plain[0])
        assert_2x_rule(f"lse[seq {b}]", lse[b:b + 1], reference[1], plain[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("lengths", [[5, 0, 70], [9, 9, 9]], ids=["ragged", "uniform"])
def test_new_tokens_are_appended_in_place_and_attended(device, causal, layout, lengths):
    """Ragged lengths run as a variable-length call over the caches, uniform ones as a plain call."""
    dtype = DTYPES[device][-1]
    batch, capacity, hq, hkv, d, new = 3, 80, 4, 2, 64, 3
    k_cache, v_cache = caches(batch, capacity, hkv, d, dtype, device, layout)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    q = randn(batch, new, hq, d, dtype=dtype, device=device)
    k, v = (randn(batch, new, hkv, d, dtype=dtype, device=device) for _ in range(2))
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    out, lse = fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens,
                                                 causal=causal, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (batch, hq, new)
    for b, n in enumerate(lengths):  # the new rows written after each sequence's keys, nothing else
        expected_k, expected_v = before_k[b].clone(), before_v[b].clone()
        expected_k[n:n + new], expected_v[n:n + new] = k[b], v[b]
        assert torch.equal(k_cache[b], expected_k) and torch.equal(v_cache[b], expected_v), f"cache of seq {b}"
    check_against_reference(q, k_cache, v_cache, [n + new for n in lengths], out, lse, causal, (-1, -1))


@pytest.mark.parametrize("device", DEVICES)
def test_lengths_without_new_tokens(device):
    """One decode query per sequence over caches filled to different lengths, GQA, a window; an int
    cache_seqlens for all sequences."""
    dtype = DTYPES[device][0]
    batch, capacity, hq, hkv, d = 4, 130, 8, 2, 64
    k_cache, v_cache = caches(batch, capacity, hkv, d, dtype, device)
    q = randn(batch, 1, hq, d, dtype=dtype, device=device)
    lengths = [1, 130, 64, 17]
    for window in ((-1, -1), (20, 0)):
        out, lse = fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor(
            lengths, dtype=torch.int32, device=device), window_size=window, return_softmax_lse=True)
        check_against_reference(q, k_cache, v_cache, lengths, out, lse, False, window)
    out, lse = fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=64, causal=True,
                                                 return_softmax_lse=True)
    check_against_reference(q, k_cache, v_cache, [64] * batch, out, lse, True, (-1, -1))


@pytest.mark.parametrize("device", DEVICES)
def test_whole_cache_and_empty_sequences(device):
    dtype = DTYPES[device][0]
    batch, capacity, h, d = 2, 33, 2, 64
    k_cache, v_cache = caches(batch, capacity, h, d, dtype, device)
    q = randn(batch, 4, h, d, dtype=dtype, device=device)
    out = fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, causal=True)
    torch.testing.assert_close(out, fusedattn.flash_attn_func(q, k_cache, v_cache, causal=True), rtol=0, atol=0)
    out, lse = fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=0, return_softmax_lse=True)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)


def test_rejections_name_the_argument():
    q = randn(2, 1, 2, 64, dtype=torch.float32, device="cpu")
    k_cache, v_cache = caches(2, 16, 2, 64, torch.float32, "cpu")
    k = randn(2, 1, 2, 64, dtype=torch.float32, device="cpu")
    lengths = torch.tensor([3, 4], dtype=torch.int32)
    unimplemented = [dict(softcap=1.0),
                     dict(alibi_slopes=torch.ones(2)), dict(num_splits=1), dict(num_splits=4)]
    for kwargs in unimplemented:
        with pytest.raises(NotImplementedError, match=next(iter(kwargs))):
            fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, **kwargs)
    with pytest.raises(ValueError, match="cache_seqlens: sequence 1 holds 16"):
        fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, k, cache_seqlens=torch.tensor([3, 16]))
    with pytest.raises(ValueError, match="cache_seqlens: needed"):
        fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, k)
    with pytest.raises(ValueError, match="k, v: pass both"):
        fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, cache_seqlens=lengths)
    for wrong in (torch.tensor([1, 2, 3]), torch.tensor([True, False]), torch.tensor([1.0, 2.0])):
        with pytest.raises(ValueError, match="cache_seqlens: must be an int or an integer tensor of 2"):
            fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=wrong)
    crossed = k_cache.as_strided((2, 16, 2, 64), (64, 128, 64, 1))  # batch stride below a position's
    before = k_cache.clone()
    with pytest.raises(ValueError, match="k_cache: its batch stride"):
        fusedattn.flash_attn_with_kvcache(q, crossed, v_cache, k, k, cache_seqlens=lengths)
    assert torch.equal(k_cache, before), "a rejected call wrote the cache"


def rope_reference(x, cos, sin, positions, interleaved):
    """x (batch, seqlen, heads, dim) in float64, its first 2 * cos.shape[1] dims rotated at
    positions (batch, seqlen): pairs (0, 1), (2, 3), ... or (i, i + half)."""
    x, half = x.double(), cos.shape[1]
    c, s = (t.double()[positions].unsqueeze(2) for t in (cos, sin))
    first, second = (slice(0, 2 * half, 2), slice(1, 2 * half, 2)) if interleaved else \
        (slice(0, half), slice(half, 2 * half))
    out = x.clone()
    out[..., first] = x[..., first] * c - x[..., second] * s
    out[..., second] = x[..., first] * s + x[..., second] * c
    return out


def rotary_tables(seqlen_ro, rotary_dim, dtype, device):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.arange(seqlen_ro, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype=dtype, device=device), angles.sin().to(dtype=dtype, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
@pytest.mark.parametrize("mask", ["none", "causal", "window"])
def test_rotary_embedding_rotates_new_keys_and_queries(device, interleaved, mask):
    """flash_attn's rule: the new keys rotate at cache_seqlens + j before they are written; q at
    cache_seqlens + i under a causal or window mask, else all of q at cache_seqlens. Only the
    first rotary_dim dims turn. Against a float64 rotation, then the float64 attention."""
    dtype = DTYPES[device][0]
    batch, capacity, hq, hkv, d, new, rotary_dim = 3, 64, 4, 2, 64, 3, 32
    causal, window = mask == "causal", ((8, 0) if mask == "window" else (-1, -1))
    k_cache, v_cache = caches(batch, capacity, hkv, d, dtype, device)
    q = randn(batch, new, hq, d, dtype=dtype, device=device)
    k, v = (randn(batch, new, hkv, d, dtype=dtype, device=device) for _ in range(2))
    lengths = [5, 0, 40]
    cos, sin = rotary_tables(50, rotary_dim, dtype, device)
    out, lse = fusedattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=device), causal=causal, window_size=window,
        rotary_interleaved=interleaved, return_softmax_lse=True)
    starts = torch.tensor(lengths, device=device)[:, None]
    steps = torch.arange(new, device=device)[None, :]
    k_rot = rope_reference(k, cos, sin, starts + steps, interleaved)
    q_rot = rope_reference(q, cos, sin, starts + (steps if mask != "none" else 0 * steps), interleaved)
    eps = torch.finfo(dtype).eps
    for b, n in enumerate(lengths):
        torch.testing.assert_close(k_cache[b, n:n + new].double(), k_rot[b], rtol=4 * eps, atol=4 * eps)
    check_against_reference(q_rot.to(dtype), k_cache, v_cache, [n + new for n in lengths], out, lse, causal, window)


def test_rotary_rejections_name_the_argument():
    q, k = (randn(2, 1, 2, 64, dtype=torch.float32, device="cpu") for _ in range(2))
    k_cache, v_cache = caches(2, 16, 2, 64, torch.float32, "cpu")
    lengths = torch.tensor([3, 4], dtype=torch.int32)
    cos, sin = rotary_tables(16, 32, torch.float32, "cpu")
    before = k_cache.clone()
    cases = [(dict(rotary_cos=cos), "rotary_cos, rotary_sin: pass both"),
             (dict(rotary_cos=cos, rotary_sin=sin, k=None, v=None), "rotary_cos: rotary embedding applies to new keys"),
             (dict(rotary_cos=cos, rotary_sin=sin[:, :8]), "rotary_sin: must be a floating-point"),
             (dict(rotary_cos=cos.long(), rotary_sin=sin), "rotary_cos: must be a floating-point"),
             (dict(rotary_cos=cos[:4], rotary_sin=sin[:4]), "rotary_cos: its 4 positions end before position 4"),
             (dict(rotary_cos=torch.ones(16, 40), rotary_sin=torch.ones(16, 40)), "rotary_dim = 2 x 40")]
    for extra, message in cases:
        kwargs = dict(k=k, v=k, cache_seqlens=lengths)
        kwargs.update(extra)
        with pytest.raises(ValueError, match=message):
            fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)
    assert torch.equal(k_cache, before), "a rejected call wrote the cache"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("portable", [False, True], ids=["default", "portable"])
@pytest.mark.parametrize("d", [64, 128])
def test_positions_past_the_lengths_are_never_read(device, portable, d, monkeypatch):
    """Caches are often allocated with torch.empty: what lies past each sequence's keys (NaN here)
    must not reach the output, ragged (one variable-length call with seqused_k) or uniform.
    portable: the CUDA backend's sm80 kernels (FUSEDATTN_DISABLE_SM90=1) on any GPU. On Hopper the
    default runs both head dims on the Hopper kernel, which zeroes those positions of a sequence's
    last key block in shared memory."""
    if portable:
        if device == "cpu":
            pytest.skip("the portable kernels are CUDA kernels")
        monkeypatch.setenv("FUSEDATTN_DISABLE_SM90", "1")
    dtype = DTYPES[device][0]
    batch, capacity, hq, hkv = 3, 300, 8, 2
    for lengths in ([1, 200, 77], [77, 77, 77]):
        # Fresh caches each time: the first lengths' NaN would lie inside the second's keys.
        k_cache, v_cache = caches(batch, capacity, hkv, d, dtype, device)
        q = randn(batch, 1, hq, d, dtype=dtype, device=device)
        for b, n in enumerate(lengths):
            k_cache[b, n:] = float("nan")
            v_cache[b, n:] = float("nan")
        for causal in (False, True):
            out, lse = fusedattn.flash_attn_with_kvcache(
                q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=device),
                causal=causal, return_softmax_lse=True)
            check_against_reference(q, k_cache, v_cache, lengths, out, lse, causal, (-1, -1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA tensor cache_seqlens needs a GPU")
@pytest.mark.parametrize("length_dtype", [torch.int32, torch.int64])
def test_cuda_lengths_without_new_tokens_are_not_read_on_the_host(length_dtype):
    """Decoding with the lengths on the GPU and nothing appended waits for nothing: torch's sync
    debug mode turns any host read into an error. Lengths outside [0, seqlen_cache] are clamped
    (a sequence of no keys gives 0 and -inf), int64 ones past int32 too."""
    dtype = DTYPES["cuda"][0]
    batch, capacity, hq, hkv, d = 5, 200, 8, 2, 128
    k_cache, v_cache = caches(batch, capacity, hkv, d, dtype, "cuda")
    q = randn(batch, 1, hq, d, dtype=dtype, device="cuda")
    given = [37, -3, capacity + 9, 0, 2**40 if length_dtype == torch.int64 else 2**31 - 1]
    clamped = [min(max(n, 0), capacity) for n in given]
    for b, n in enumerate(clamped):
        k_cache[b, n:] = float("nan")
        v_cache[b, n:] = float("nan")
    cache_seqlens = torch.tensor(given, dtype=length_dtype, device="cuda")
    for causal in (False, True):
        fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, causal=causal)  # warm-up
        torch.cuda.set_sync_debug_mode("error")
        try:
            with pytest.raises(RuntimeError, match="synchroniz"):
                cache_seqlens.tolist()  # the mode catches the host read the call must not make
            out, lse = fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                                         causal=causal, return_softmax_lse=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        empty = [b for b, n in enumerate(clamped) if n == 0]
        assert torch.all(out[empty] == 0) and torch.all(lse[empty] == -math.inf)
        seen = [b for b, n in enumerate(clamped) if n > 0]
        check_against_reference(q[seen], k_cache[seen], v_cache[seen], [clamped[b] for b in seen],
                                out[seen], lse[seen], causal, (-1, -1))


@pytest.mark.parametrize("device", DEVICES)
def test_seqused_k_is_forward_only(device):
    """The variable-length operator's seqused_k (what the ragged kvcache call passes) has no
    backward, as in flash_attn: asking for gradients through it raises, naming it."""
    from fusedattn._ops import ops
    dtype = DTYPES[device][0]
    q, k, v = (randn(5, 2, 64, dtype=dtype, device=device).requires_grad_() for _ in range(3))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    used = torch.tensor([1, 3], dtype=torch.int32, device=device)
    out, _ = ops.varlen_fwd(q, k, v, cu, cu, 3, 3, None, False, -1, -1, False, used)
    with pytest.raises(NotImplementedError, match="seqused_k"):
        out.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_func_takes_seqused_k(device, causal):
    """flash_attn_varlen_func's seqused_k (keyword only, FlashAttention-3's extension): sequence b
    attends to the first seqused_k[b] of its key rows, clamped to [0, rows]; the rows past them
    hold NaN, which must not reach the output."""
    dtype = DTYPES[device][0]
    hq, hkv, d = 4, 2, 64
    lens_q, lens_k, used = [3, 1, 5, 2], [40, 70, 9, 20], [17, 70, 100, -4]
    cu_q, cu_k = ([0] + torch.tensor(n).cumsum(0).tolist() for n in (lens_q, lens_k))
    q = randn(cu_q[-1], hq, d, dtype=dtype, device=device)
    k, v = (randn(cu_k[-1], hkv, d, dtype=dtype, device=device) for _ in range(2))
    visible = [min(max(u, 0), n) for u, n in zip(used, lens_k)]
    for b, n in enumerate(visible):
        k[cu_k[b] + n:cu_k[b + 1]] = float("nan")
        v[cu_k[b] + n:cu_k[b + 1]] = float("nan")
    offsets_q, offsets_k, seqused_k = (torch.tensor(t, dtype=torch.int32, device=device) for t in (cu_q, cu_k, used))
    out, lse, _ = fusedattn.flash_attn_varlen_func(q, k, v, offsets_q, offsets_k, max(lens_q), max(lens_k),
                                                   causal=causal, return_attn_probs=True, seqused_k=seqused_k)
    right = 0 if causal else -1
    for b, n in enumerate(visible):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b] + n)
        args = (q[rows][None], k[keys][None], v[keys][None], None, default_scale(d), -1, right)
        reference, plain = attention_math(*args), attention_math(*args, dtype=q.dtype)
        assert_2x_rule(f"out[seq {b}]", out[rows][None], reference[0], plain[0])
        assert_2x_rule(f"lse[seq {b}]", lse[:, rows][None], reference[1], plain[1])


def paged(k_cache, v_cache, page, spare=3):
    """The caches (batch, capacity, heads, dim) cut into pages of `page` positions and stored in
    shuffled blocks of a pool with `spare` blocks no sequence uses (all of fresh values where no
    page lands); and the int32 block table that reads them back."""
    batch, capacity = k_cache.shape[:2]
    per_seq = -(-capacity // page)
    num_blocks = batch * per_seq + spare
    table = torch.randperm(num_blocks)[:batch * per_seq].view(batch, per_seq)
    pools = []
    for cache in (k_cache, v_cache):
        pool = randn(num_blocks, page, *cache.shape[2:], dtype=cache.dtype, device=cache.device)
        for b in range(batch):
            for i in range(per_seq):
                rows = cache[b, i * page:(i + 1) * page]
                pool[table[b, i], :rows.shape[0]] = rows
        pools.append(pool)
    return pools[0], pools[1], table.to(torch.int32).to(k_cache.device)


def take_path(monkeypatch, path, device, page):
    """Makes flash_attn_with_kvcache take `path` (PAGED_PATHS) over pages of `page` positions, or
    skips where the kernels cannot read them (CUDA, page not a multiple of CUDA_PAGE_ROWS).
    Returns the list of the pages sizes it was asked about, to show the choice was made."""
    if path == "kernels" and device == "cuda" and page % CUDA_PAGE_ROWS:
        pytest.skip(f"the CUDA kernels read pages of a multiple of {CUDA_PAGE_ROWS} positions, not {page}")
    asked = []

    def choose(device, page_size):
        asked.append(page_size)
        return path == "kernels"

    monkeypatch.setattr(flash_attn_interface, "_kernels_read_pages", choose)
    return asked


def unpaged(pool, table, capacity):
    """The logical caches (batch, capacity, heads, dim) that a block table reads from a pool."""
    return pool[table.long()].flatten(1, 2)[:, :capacity]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page", [16, 7, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("path", PAGED_PATHS)
def test_paged_caches_take_new_tokens_and_are_attended(device, page, causal, path, monkeypatch):
    """block_table: the new tokens land in their pages (and nowhere else), and attention over
    each sequence's pages matches the reference over its logical cache; GQA, ragged lengths, a
    sequence that fills its last page exactly and one that starts empty."""
    asked = take_path(monkeypatch, path, device, page)
    dtype = DTYPES[device][-1]
    batch, capacity, hq, hkv, d, new = 4, max(64, 2 * page + page // 2), 4, 2, 64, 3
    k_cache, v_cache = caches(batch, capacity, hkv, d, dtype, device)
    k_pool, v_pool, table = paged(k_cache, v_cache, page)
    before_k, before_v = k_pool.clone(), v_pool.clone()
    lengths = [5, 0, 2 * page - new, capacity - new]
    q = randn(batch, new, hq, d, dtype=dtype, device=device)
    k, v = (randn(batch, new, hkv, d, dtype=dtype, device=device) for _ in range(2))
    out, lse = fusedattn.flash_attn_with_kvcache(q, k_pool, v_pool, k, v, cache_seqlens=torch.tensor(
        lengths, dtype=torch.int32, device=device), block_table=table, causal=causal, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (batch, hq, new)
    expected_k, expected_v = before_k.clone(), before_v.clone()
    for b, n in enumerate(lengths):
        for j in range(new):
            block, row = table[b, (n + j) // page].item(), (n + j) % page
            expected_k[block, row], expected_v[block, row] = k[b, j], v[b, j]
    assert torch.equal(k_pool, expected_k) and torch.equal(v_pool, expected_v), "pages written"
    check_against_reference(q, unpaged(k_pool, table, capacity), unpaged(v_pool, table, capacity),
                            [n + new for n in lengths], out, lse, causal, (-1, -1))
    assert asked == [page]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page", [32, 128])
@pytest.mark.parametrize("path", PAGED_PATHS)
def test_paged_decode_reads_only_the_pages_in_use(device, page, path, monkeypatch):
    """One decode query per sequence without new tokens: table entries past each sequence's keys
    may name no block at all (-1, or past the pool) and are never read; a window; an int length."""
    take_path(monkeypatch, path, device, page)
    dtype = DTYPES[device][0]
    batch, capacity, hq, hkv, d = 3, 3 * page, 8, 2, 128
    k_cache, v_cache = caches(batch, capacity, hkv, d, dtype, device)
    k_pool, v_pool, table = paged(k_cache, v_cache, page)
    lengths = [1, page + 8, capacity]
    for b, n in enumerate(lengths):
        table[b, -(-n // page):] = -1 if b % 2 else 10**6
    table = torch.cat((table, torch.full_like(table, -7)), dim=1)  # a table sized past every sequence
    q = randn(batch, 1, hq, d, dtype=dtype, device=device)
    for window in ((-1, -1), (20, 0)):
        out, lse = fusedattn.flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=torch.tensor(
            lengths, dtype=torch.int32, device=device), block_table=table, window_size=window,
            return_softmax_lse=True)
        check_against_reference(q, k_cache, v_cache, lengths, out, lse, False, window)
    out, lse = fusedattn.flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=1, block_table=table,
                                                 return_softmax_lse=True)
    check_against_reference(q, k_cache, v_cache, [1] * batch, out, lse, False, (-1, -1))


def test_paged_rejections_name_the_argument():
    """A bad table, pool or length raises naming it, before any page is written."""
    q = randn(2, 1, 2, 64, dtype=torch.float32, device="cpu")
    k_cache, v_cache = caches(2, 32, 2, 64, torch.float32, "cpu")
    k_pool, v_pool, table = paged(k_cache, v_cache, 8)
    k = randn(2, 1, 2, 64, dtype=torch.float32, device="cpu")
    lengths = torch.tensor([3, 9], dtype=torch.int32)
    before = k_pool.clone()
    for wrong in (table.long(), table[0], table[:1], table[:, :0], table.float()):
        with pytest.raises(ValueError, match="block_table: must be an int32"):
            fusedattn.flash_attn_with_kvcache(q, k_pool, v_pool, k, k, cache_seqlens=lengths, block_table=wrong)
    bad = table.clone()
    bad[1, 1] = k_pool.shape[0]  # sequence 1's second page: positions 8..15, which its 9 + 1 keys reach
    with pytest.raises(ValueError, match=rf"block_table: sequence 1's page 1 \(positions 8..15\) names block "
                                         rf"{k_pool.shape[0]}, outside the caches' {k_pool.shape[0]}"):
        fusedattn.flash_attn_with_kvcache(q, k_pool, v_pool, k, k, cache_seqlens=lengths, block_table=bad)
    bad[0, 0] = -2  # two faults: the first in the table's row-major order is named
    with pytest.raises(ValueError, match=r"block_table: sequence 0's page 0 \(positions 0..7\) names block -2"):
        fusedattn.flash_attn_with_kvcache(q, k_pool, v_pool, k, k, cache_seqlens=lengths, block_table=bad)
    with pytest.raises(ValueError, match="cache_seqlens: sequence 1 holds 32"):
        fusedattn.flash_attn_with_kvcache(q, k_pool, v_pool, k, k, cache_seqlens=torch.tensor([3, 32]),
                                          block_table=table)
    with pytest.raises(ValueError, match="paged caches must be"):
        fusedattn.flash_attn_with_kvcache(q, k_pool, v_pool[:, :4], cache_seqlens=lengths, block_table=table)
    assert torch.equal(k_pool, before), "a rejected call wrote a page"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("capacity", [40, 128])
@pytest.mark.parametrize("path", PAGED_PATHS)
def test_cache_batch_idx_picks_each_sequences_cache_row(device, capacity, path, monkeypatch):
    """cache_batch_idx: sequence b appends to and attends over cache row idx[b] of a cache with
    more rows than sequences; the other rows are left as they were."""
    take_path(monkeypatch, path, device, capacity)  # each cache row is one page
    dtype = DTYPES[device][-1]
    rows, batch, hq, hkv, d, new = 5, 3, 4, 2, 64, 2
    k_cache, v_cache = caches(rows, capacity, hkv, d, dtype, device)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    idx = torch.tensor([4, 0, 2], dtype=torch.int32, device=device)
    lengths = [7, 0, capacity - new]
    q = randn(batch, new, hq, d, dtype=dtype, device=device)
    k, v = (randn(batch, new, hkv, d, dtype=dtype, device=device) for _ in range(2))
    out, lse = fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=torch.tensor(
        lengths, dtype=torch.int32, device=device), cache_batch_idx=idx, causal=True, return_softmax_lse=True)
    expected_k, expected_v = before_k.clone(), before_v.clone()
    for b, n in enumerate(lengths):
        expected_k[idx[b], n:n + new], expected_v[idx[b], n:n + new] = k[b], v[b]
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v), "cache rows written"
    check_against_reference(q, k_cache[idx.long()], v_cache[idx.long()], [n + new for n in lengths], out, lse,
                            True, (-1, -1))


def test_cache_batch_idx_rejections_name_the_argument():
    q = randn(2, 1, 2, 64, dtype=torch.float32, device="cpu")
    k_cache, v_cache = caches(3, 16, 2, 64, torch.float32, "cpu")
    lengths = torch.tensor([3, 4], dtype=torch.int32)
    for wrong in (torch.tensor([0, 1]), torch.tensor([[0], [1]], dtype=torch.int32), torch.tensor(1, dtype=torch.int32),
                  torch.tensor([0, 1, 2], dtype=torch.int32)):
        with pytest.raises(ValueError, match="cache_batch_idx: must be an int32 \\(batch 2,\\)"):
            fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, cache_batch_idx=wrong)
    with pytest.raises(ValueError, match="cache_batch_idx: sequence 1's page 0"):
        fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                          cache_batch_idx=torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_batch_idx: not supported with block_table"):
        fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                          cache_batch_idx=torch.tensor([0, 1], dtype=torch.int32),
                                          block_table=torch.zeros(2, 1, dtype=torch.int32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pads", [[2, 0, 9], [4, 4, 4]], ids=["ragged", "uniform"])
def test_cache_leftpad_starts_each_sequences_keys(device, causal, pads):
    """cache_leftpad: sequence b attends over positions pads[b] .. lengths[b] + new - 1 (masks
    aligned to that range's end); the new tokens still land at lengths[b]. Ragged pads run the
    variable-length call, equal pads and lengths the plain one."""
    dtype = DTYPES[device][-1]
    batch, capacity, hq, hkv, d, new = 3, 48, 4, 2, 64, 2
    k_cache, v_cache = caches(batch, capacity, hkv, d, dtype, device)
    before_k = k_cache.clone()
    lengths = [9, 4, 30] if pads[0] != pads[1] else [20, 20, 20]
    q = randn(batch, new, hq, d, dtype=dtype, device=device)
    k, v = (randn(batch, new, hkv, d, dtype=dtype, device=device) for _ in range(2))
    out, lse = fusedattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=device),
        cache_leftpad=torch.tensor(pads, dtype=torch.int32, device=device), causal=causal, return_softmax_lse=True)
    for b, n in enumerate(lengths):
        expected = before_k[b].clone()
        expected[n:n + new] = k[b]
        assert torch.equal(k_cache[b], expected), f"cache of seq {b}"
        end = n + new
        keys, values = k_cache[b:b + 1, pads[b]:end], v_cache[b:b + 1, pads[b]:end]
        check_against_reference(q[b:b + 1], keys, values, [end - pads[b]], out[b:b + 1], lse[b:b + 1], causal,
                                (-1, -1))


def test_cache_leftpad_rotates_at_absolute_positions():
    """With rotary tables the new keys are rotated at cache_seqlens + j whatever the padding: the
    cache holds the same keys with and without it."""
    q = randn(2, 1, 2, 64, dtype=torch.float32, device="cpu")
    k = randn(2, 1, 2, 64, dtype=torch.float32, device="cpu")
    cos, sin = rotary_tables(32, 32, torch.float32, "cpu")
    lengths = torch.tensor([5, 11], dtype=torch.int32)
    written = []
    for pads in (None, torch.tensor([3, 0], dtype=torch.int32)):
        k_cache, v_cache = caches(2, 16, 2, 64, torch.float32, "cpu")
        fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, k, rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=lengths, cache_leftpad=pads)
        written.append(torch.stack([k_cache[b, n] for b, n in enumerate(lengths.tolist())]))
    assert torch.equal(written[0], written[1])


def test_cache_leftpad_rejections_name_the_argument():
    q = randn(2, 1, 2, 64, dtype=torch.float32, device="cpu")
    k_cache, v_cache = caches(2, 16, 2, 64, torch.float32, "cpu")
    lengths = torch.tensor([3, 4], dtype=torch.int32)
    for wrong in (torch.tensor([0, 1]), torch.tensor([0], dtype=torch.int32), torch.tensor(0, dtype=torch.int32)):
        with pytest.raises(ValueError, match="cache_leftpad: must be an int32 \\(batch 2,\\)"):
            fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, cache_leftpad=wrong)
    for past in ([4, 0], [-1, 0]):
        with pytest.raises(ValueError, match="cache_leftpad: sequence 0 starts at"):
            fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                              cache_leftpad=torch.tensor(past, dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_leftpad: not supported with"):
        fusedattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, cache_leftpad=lengths,
                                          cache_batch_idx=torch.tensor([0, 1], dtype=torch.int32))
