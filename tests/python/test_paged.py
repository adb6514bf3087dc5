"""flash_attn_varlen_func with block_table (paged K/V, flash_attn's varlen layout): packed keys and
values moved into shuffled pages of a pool must give the float64 reference's answer, and on the
CPU the packed call's answer bit for bit (only where the rows are read from changes). Every pool
row that holds no key is NaN and every table entry no key reaches is -1, so a read of either would
show. Then the rejections, by name."""
from __future__ import annotations

import pytest
import torch

import fusedattn
from conftest import DTYPES, HAS_CUDA, assert_2x_rule, attention_math, default_scale, randn

# Table entries no sequence's keys reach: never read, so never checked.
UNREACHED = -1
# The CUDA kernels read pages of a multiple of 128 rows (kCudaPageRows); the CPU backend any size.
CUDA_PAGE = 128
_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
DEVICE_PAGES = [("cpu", 1), ("cpu", 16), ("cpu", 128),
                pytest.param("cuda", 128, marks=_cuda), pytest.param("cuda", 256, marks=_cuda)]
MASKS = {"none": (False, (-1, -1)), "causal": (True, (-1, -1)), "window": (False, (20, 3))}


def offsets(lengths, device) -> torch.Tensor:
    return torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)


def paged(k, v, lengths, page, spare=3, extra_columns=1):
    """Packed k and v (total_k, heads, dim) holding sequences of `lengths` keys, moved into pools
    (num_pages, page, heads, dim) of NaN: sequence b's keys fill its ceil(lengths[b] / page) pages,
    taken in shuffled order from the pages needed plus `spare` more; and the int32 table, with
    `extra_columns` columns past the longest sequence's pages, UNREACHED wherever no key lands."""
    pages_of = [-(-n // page) for n in lengths]
    num_pages = sum(pages_of) + spare
    order = torch.randperm(num_pages).tolist()
    table = torch.full((len(lengths), max(pages_of, default=0) + extra_columns), UNREACHED, dtype=torch.int32)
    pools = [torch.full((num_pages, page, *t.shape[1:]), float("nan"), dtype=t.dtype, device=t.device) for t in (k, v)]
    start = 0
    for b, n in enumerate(lengths):
        for i in range(pages_of[b]):
            table[b, i] = order.pop()
            rows = slice(start + i * page, start + min((i + 1) * page, n))
            for pool, packed in zip(pools, (k, v)):
                pool[table[b, i], :rows.stop - rows.start] = packed[rows]
        start += n
    return pools[0], pools[1], table.to(k.device)


def case(device, dtype, page, lens_q, lens_k, hq=4, hkv=2, d=64):
    """q, packed k and v, their offsets, and the same keys in pages."""
    q = randn(sum(lens_q), hq, d, dtype=dtype, device=device)
    k, v = (randn(sum(lens_k), hkv, d, dtype=dtype, device=device) for _ in range(2))
    k_pool, v_pool, table = paged(k, v, lens_k, page)
    return q, k, v, offsets(lens_q, device), offsets(lens_k, device), k_pool, v_pool, table


def check_against_reference(q, k, v, lens_q, lens_k, visible, out, lse, causal, window):
    """Sequence b's out and lse against the reference over its first visible[b] keys."""
    left, right = window[0], (0 if causal else window[1])
    cu_q, cu_k = (offsets(lens, "cpu").tolist() for lens in (lens_q, lens_k))
    for b, n in enumerate(visible):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b] + n)
        args = (q[rows][None], k[keys][None], v[keys][None], None, default_scale(q.shape[-1]), left, right)
        reference, plain = attention_math(*args), attention_math(*args, dtype=q.dtype)
        assert_2x_rule(f"out[seq {b}]", out[rows][None], reference[0], plain[0])
        assert_2x_rule(f"lse[seq {b}]", lse[:, rows][None], reference[1], plain[1])


@pytest.mark.parametrize("device, page", DEVICE_PAGES)
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("used", [False, True], ids=["offsets", "seqused_k"])
def test_paged_varlen_matches_reference_and_packed_call(device, page, mask, used):
    """Ragged sequences: one without keys, one shorter than a page, one ending inside its last
    page, one filling its pages exactly; GQA; with seqused_k, each sequence attends to a prefix of
    its keys (the rows past it NaN too). On the CPU the paged call equals the packed one bit for
    bit; on CUDA the packed call may run another kernel (the Hopper kernels decline paged calls),
    so both are held to the reference only."""
    causal, window = MASKS[mask]
    lens_q = [3, 1, 5, 2]
    lens_k = [0, max(1, page // 3), 2 * page + page // 2 + 1, page]
    for dtype in DTYPES[device]:
        q, k, v, cu_q, cu_k, k_pool, v_pool, table = case(device, dtype, page, lens_q, lens_k)
        seqused_k, visible = None, lens_k
        if used:
            visible = [0, lens_k[1], lens_k[2] - page // 2 - 1, 1]
            seqused_k = torch.tensor(visible, dtype=torch.int32, device=device)
            start = 0
            for n, m in zip(lens_k, visible):  # the unused keys, packed and (paged again) in pages
                k[start + m:start + n], v[start + m:start + n] = float("nan"), float("nan")
                start += n
            k_pool, v_pool, table = paged(k, v, lens_k, page)
        args = (cu_q, cu_k, max(lens_q), max(lens_k))
        kwargs = dict(causal=causal, window_size=window, return_attn_probs=True, seqused_k=seqused_k)
        out, lse, _ = fusedattn.flash_attn_varlen_func(q, k_pool, v_pool, *args, block_table=table, **kwargs)
        check_against_reference(q, k, v, lens_q, lens_k, visible, out, lse, causal, window)
        if device == "cpu":
            packed_out, packed_lse, _ = fusedattn.flash_attn_varlen_func(q, k, v, *args, **kwargs)
            assert torch.equal(out, packed_out) and torch.equal(lse, packed_lse), f"{dtype}: paged != packed"


@pytest.mark.parametrize("device, page", [("cpu", 16), pytest.param("cuda", CUDA_PAGE, marks=_cuda)])
def test_table_of_any_row_stride(device, page):
    """A table whose rows are a strided view (every second row of a wider one) reads the same."""
    dtype = DTYPES[device][0]
    lens_q, lens_k = [2, 4], [page + 3, 2 * page]
    q, k, v, cu_q, cu_k, k_pool, v_pool, table = case(device, dtype, page, lens_q, lens_k)
    wide = torch.full((2 * table.shape[0], table.shape[1] + 2), UNREACHED, dtype=torch.int32, device=device)
    wide[::2, :table.shape[1]] = table
    args = (q, k_pool, v_pool, cu_q, cu_k, max(lens_q), max(lens_k))
    strided = fusedattn.flash_attn_varlen_func(*args, causal=True, block_table=wide[::2, :table.shape[1]])
    assert torch.equal(strided, fusedattn.flash_attn_varlen_func(*args, causal=True, block_table=table))


@pytest.mark.parametrize("device, page", [("cpu", 16), pytest.param("cuda", CUDA_PAGE, marks=_cuda)])
def test_backward_through_a_paged_call_names_block_table(device, page):
    dtype = DTYPES[device][0]
    q, _, _, cu_q, cu_k, k_pool, v_pool, table = case(device, dtype, page, [2, 3], [5, page + 1])
    q, k_pool, v_pool = (t.requires_grad_() for t in (q, k_pool, v_pool))
    out = fusedattn.flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, 3, page + 1, block_table=table)
    with pytest.raises(NotImplementedError, match="block_table: the backward pass does not support paged"):
        out.sum().backward()


@pytest.mark.parametrize("device, page", [("cpu", 16), pytest.param("cuda", CUDA_PAGE, marks=_cuda)])
def test_bad_tables_are_rejected_by_name(device, page):
    """A table entry some sequence's keys reach must name a page of the pools; the table must be
    int32; the pools rank 4. Entries no key reaches are never checked (the -1s of every table here)."""
    dtype = DTYPES[device][0]
    q, k, v, cu_q, cu_k, k_pool, v_pool, table = case(device, dtype, page, [2, 3], [5, page + 1])
    args = (q, k_pool, v_pool, cu_q, cu_k, 3, page + 1)
    num_pages = k_pool.shape[0]
    for entry, value in (((1, 1), num_pages), ((1, 0), -5)):
        bad = table.clone()
        bad[entry] = value
        message = rf"block_table: entry \[{entry[0]}, {entry[1]}\] is {value}; sequence 1's keys reach it, so " \
                  rf"it must name a page in \[0, {num_pages}\)"
        with pytest.raises(ValueError, match=message):
            fusedattn.flash_attn_varlen_func(*args, block_table=bad)
    with pytest.raises(ValueError, match="block_table: dtype"):
        fusedattn.flash_attn_varlen_func(*args, block_table=table.long())
    with pytest.raises(ValueError, match="block_table: must be an int32 \\[2, max_pages_per_seq\\]"):
        fusedattn.flash_attn_varlen_func(*args, block_table=table[:1])
    with pytest.raises(ValueError, match=r"k: expected rank 4 \[num_pages, page_size, heads, head_dim\]"):
        fusedattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, page + 1, block_table=table)


@pytest.mark.skipif(not HAS_CUDA, reason="the page-size rule is the CUDA backend's")
def test_cuda_pages_of_16_rows_are_rejected_naming_k():
    """flash_attn_varlen_func takes what the kernels read: pages of a multiple of 128 rows on
    CUDA (flash_attn_with_kvcache copies other page sizes instead)."""
    q, _, _, cu_q, cu_k, k_pool, v_pool, table = case("cuda", DTYPES["cuda"][0], 16, [2, 3], [5, 17])
    with pytest.raises(NotImplementedError, match="k: pages of 16 rows; the CUDA backend reads paged K/V in pages "
                                                  "of a multiple of 128 rows"):
        fusedattn.flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, 3, 17, block_table=table)


@pytest.mark.parametrize("device, page", [("cpu", 16), pytest.param("cuda", CUDA_PAGE, marks=_cuda)])
def test_caller_checked_rows_k(device, page):
    """The operator's checked_rows_k (flash_attn_with_kvcache passes it once it has checked its
    offsets and the table's entries in use): the same answer as the library's own check; unpaged
    calls reject it by name; and on the CPU, which reads host offsets anyway, a value other than
    where cu_seqlens_k ends is rejected by name."""
    dtype = DTYPES[device][0]
    lens_k = [5, page + 1]
    q, k, v, cu_q, cu_k, k_pool, v_pool, table = case(device, dtype, page, [2, 3], lens_k)
    op = torch.ops.fusedattn.varlen_fwd
    args = (q, k_pool, v_pool, cu_q, cu_k, 3, page + 1, None, False, -1, -1, False, None, table)
    out, lse = op(*args)
    out_checked, lse_checked = op(*args, sum(lens_k))
    assert torch.equal(out_checked, out) and torch.equal(lse_checked, lse)
    with pytest.raises(ValueError, match="checked_rows_k: is for paged calls"):
        op(q, k, v, cu_q, cu_k, 3, page + 1, None, False, -1, -1, False, None, None, sum(lens_k))
    if device == "cpu":
        with pytest.raises(ValueError, match="checked_rows_k: is 4 but cu_seqlens_k ends at"):
            op(*args, 4)
