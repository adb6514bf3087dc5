#!/usr/bin/env python3
"""Variable-length (packed) forward batches, ours against the peers in one process.

Each case packs sequences of a length distribution into about 16k tokens (model dim 2048, so
2048 / head_dim heads), as a training step with packed sequences would. Columns (TFLOP/s of the
visible query-key pairs, triton's do_bench median):
  ours          fusedattn.flash_attn_varlen_func (on Hopper: the sm90 kernel)
  ours_sm80     the same with FUSEDATTN_DISABLE_SM90=1 (the portable kernel; read per call)
  fa2_varlen    torch.ops.aten._flash_attention_forward with cu_seqlens: the FA2 varlen kernel that
                SDPA's FLASH_ATTENTION backend runs for nested tensors, called without SDPA's
                nested-tensor wrapping
  cudnn_varlen  torch.ops.aten._cudnn_attention_forward with cu_seqlens, where torch supports it
  cudnn_padded  CUDNN_ATTENTION on the batch padded to its longest sequence (what a caller without
                varlen runs), timed over the padded batch but credited with the real pairs only
A peer that torch refuses for a case prints '-'. Every provider's output is checked against ours
(max abs difference over the real rows) before it is timed.

  tools/bench_varlen.py [--dtype float16] [--head-dims 64,128,256] [--out FILE]

--decode B,B,... instead times serving steps: B sequences of --queries new tokens each (1: decode,
a few: speculative drafts) against KV caches of uniform random lengths in --cache-lens LO-HI, GQA
32 query heads on 8 KV heads at each of --decode-head-dims (default 128; causal, bottom-right
aligned). Columns: milliseconds of ours (GQA packing as planned), ours_unpacked
(FUSEDATTN_SM90_PACK_GQA=0), fa2_varlen, and the same step on padded caches [B, --cache-lens HI,
8, d] as a server keeps them: ours_kvcache (fusedattn.flash_attn_with_kvcache with a CUDA tensor
of cache_seqlens and no new tokens, which it passes on without a host read since session 45),
ours_seqused (the variable-length operator that call runs, called directly; the Hopper kernel
zeroes the NaN the caches hold past each sequence's keys in its last block),
ours_seqused_portable (the same on the portable kernels, FUSEDATTN_DISABLE_SM90=1) and
fa2_kvcache (the FA2 varlen kernel over the caches with seqused_k, as flash_attn's kvcache call
runs it); then the same keys in shuffled pages of PAGE_ROWS rows read through a block table:
ours_paged (flash_attn_varlen_func with block_table; the library reads the offsets and the table's
entries in use on the host at each call), ours_paged_device (the same with check_on_device: a
kernel after the attention checks them instead), ours_paged_portable (the same on the portable
forward, FUSEDATTN_SM90_PAGED=0), ours_paged_kvcache (flash_attn_with_kvcache with block_table,
which reads nothing on the host for these CUDA lengths and checks the table on the device) and
fa2_paged (the FA2 varlen kernel
with block_table, where this torch passes one: torch 2.11's _flash_attention_forward takes none);
last, ours_kvcache_append (flash_attn_with_kvcache on the padded caches with the step's tokens as
new keys and values, appended at cache_seqlens - queries: the same keys written again; an eager
call reads and checks the lengths on the host first), ours_kvcache_append_device (the same with
the checks and writes made on the device, as a captured call makes them: forced eager) and
ours_kvcache_append_graph (the call captured in a CUDA graph once, each step one replay).
"""
import argparse
import contextlib
import json
import os
import random

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import fusedattn
from fusedattn import flash_attn_interface

TOKENS, MODEL_DIM = 16384, 2048
# name -> (low, high) of uniform lengths, or a fixed length
DISTRIBUTIONS = {"equal2k": (2048, 2048), "mixed128-4k": (128, 4096), "short32-512": (32, 512)}


def lengths(dist, seed=0):
    lo, hi = DISTRIBUTIONS[dist]
    rng = random.Random(seed)
    out, total = [], 0
    while total < TOKENS:
        n = min(rng.randint(lo, hi), TOKENS - total)
        out.append(n)
        total += n
    return out


def pairs(lens, causal):
    return sum(n * (n + 1) // 2 if causal else n * n for n in lens)


@contextlib.contextmanager
def env(name, value):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def padded(x, lens, offsets):
    """(B, H, max_len, D) zero-padded copy of the packed rows."""
    longest = max(lens)
    out = x.new_zeros(len(lens), longest, x.shape[1], x.shape[2])
    for b, n in enumerate(lens):
        out[b, :n] = x[offsets[b]:offsets[b] + n]
    return out.transpose(1, 2)


def run_case(dist, d, causal, dtype):
    lens = lengths(dist)
    heads = MODEL_DIM // d
    offsets = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    total, longest = sum(lens), max(lens)
    q, k, v = (torch.randn(total, heads, d, dtype=dtype, device="cuda") for _ in range(3))

    def ours():
        return fusedattn.flash_attn_varlen_func(q, k, v, offsets, offsets, longest, longest, causal=causal)

    def ours_sm80():
        with env("FUSEDATTN_DISABLE_SM90", "1"):
            return ours()

    scale = 1.0 / math.sqrt(d)

    def fa2_varlen():
        return torch.ops.aten._flash_attention_forward(q, k, v, offsets, offsets, longest, longest, 0.0, causal, False,
                                                       scale=scale)[0]

    def cudnn_varlen():
        return torch.ops.aten._cudnn_attention_forward(q, k, v, None, offsets, offsets, longest, longest, False, 0.0,
                                                       causal, False, scale=scale)[0]

    def cudnn_padded():
        qp, kp, vp = (padded(x, lens, offsets.tolist()) for x in (q, k, v))
        # Padded keys must not be seen: a boolean mask of the real keys (and causal) per sequence.
        keep = None  # equal lengths: no padding at all
        if len(set(lens)) > 1:
            keep = torch.zeros(len(lens), 1, longest, longest, dtype=torch.bool, device="cuda")
            for b, n in enumerate(lens):
                keep[b, 0, :n, :n] = torch.ones(n, n, dtype=torch.bool, device="cuda").tril() if causal else True

        def fn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=keep, is_causal=causal and keep is None)
            return o
        return fn, lambda o: torch.cat([o.transpose(1, 2)[b, :n] for b, n in enumerate(lens)])

    reference = ours()
    providers = {"ours": (ours, None), "ours_sm80": (ours_sm80, None),
                 "fa2_varlen": (fa2_varlen, None), "cudnn_varlen": (cudnn_varlen, None)}
    try:
        providers["cudnn_padded"] = cudnn_padded()
    except Exception as e:  # noqa: BLE001
        providers["cudnn_padded"] = (None, str(e))
    flops = 4 * heads * d * pairs(lens, causal)
    row = {"dist": dist, "head_dim": d, "causal": causal, "dtype": str(dtype).split(".")[-1], "seqs": len(lens),
           "max_len": longest}
    for name, (fn, unpack) in providers.items():
        try:
            if fn is None:
                raise RuntimeError(unpack)
            out = fn()
            got = unpack(out) if callable(unpack) else out
            err = (got.float() - reference.float()).abs().max().item()
            ms = do_bench(fn, warmup=25, rep=100)
            row[name] = round(flops / ms / 1e9, 1)
            row[name + "_maxdiff"] = round(err, 4)
        except Exception as e:  # noqa: BLE001
            row[name] = None
            row[name + "_error"] = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
    return row


def report(row, names, against, out):
    """Prints each provider's error, or its difference to `against` where large; appends row to out."""
    for n in names:
        if row.get(n + "_error"):
            print(f"    {n}: {row[n + '_error']}")
        elif row.get(n + "_maxdiff", 0) > 0.05:
            print(f"    {n}: max abs difference to {against} {row[n + '_maxdiff']}")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


DECODE_NAMES = ["ours", "ours_unpacked", "fa2_varlen", "ours_kvcache", "ours_seqused", "ours_seqused_portable",
                "fa2_kvcache", "ours_paged", "ours_paged_device", "ours_paged_portable", "ours_paged_kvcache",
                "fa2_paged", "ours_kvcache_append", "ours_kvcache_append_device", "ours_kvcache_append_graph"]
# Pages of the paged columns: FA2's paged kernel needs a multiple of 256 rows (ours: of 128, kCudaPageRows).
PAGE_ROWS = 256


def paged_copy(k, v, lens_k, page, rng):
    """The packed keys and values of sequences of lens_k keys in pages of `page` rows, taken in a
    shuffled order from a pool with one spare page, NaN in every row that holds no key; and the
    int32 block table (batch, most pages), unreached entries -1."""
    pages = [-(-n // page) for n in lens_k]
    order = list(range(sum(pages) + 1))
    rng.shuffle(order)
    pool = [torch.full((len(order), page) + tuple(t.shape[1:]), float("nan"), dtype=t.dtype, device=t.device)
            for t in (k, v)]
    table = torch.full((len(lens_k), max(pages + [1])), -1, dtype=torch.int32)
    start, taken = 0, 0
    for b, n in enumerate(lens_k):
        for j in range(pages[b]):
            block, rows = order[taken], min(page, n - j * page)
            taken += 1
            table[b, j] = block
            for dst, src in zip(pool, (k, v)):
                dst[block, :rows] = src[start + j * page:start + j * page + rows]
        start += n
    return pool[0], pool[1], table.to(k.device)


def run_decode(batch, queries, cache_lo, cache_hi, dtype, heads_q=32, heads_kv=8, d=128):
    rng = random.Random(batch)
    lens_k = [rng.randint(cache_lo, cache_hi) for _ in range(batch)]
    lens_q = [queries] * batch
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens_q), heads_q, d, dtype=dtype, device="cuda")
    k, v = (torch.randn(sum(lens_k), heads_kv, d, dtype=dtype, device="cuda") for _ in range(2))
    max_q, max_k = queries, max(lens_k)

    def ours():
        return fusedattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)

    def ours_unpacked():
        with env("FUSEDATTN_SM90_PACK_GQA", "0"):
            return ours()

    def fa2_varlen():
        return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False,
                                                       scale=1.0 / math.sqrt(d))[0]

    # The same keys in padded caches of cache_hi positions per sequence (the rest poisoned).
    k_cache, v_cache = (torch.full((batch, cache_hi, heads_kv, d), float("nan"), dtype=dtype, device="cuda")
                        for _ in range(2))
    for b in range(batch):
        k_cache[b, :lens_k[b]] = k[cu_k[b]:cu_k[b + 1]]
        v_cache[b, :lens_k[b]] = v[cu_k[b]:cu_k[b + 1]]
    cache_seqlens = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    q_dense = q.view(batch, queries, heads_q, d)
    cu_cache = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * cache_hi

    def ours_kvcache():
        return fusedattn.flash_attn_with_kvcache(q_dense, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                                 causal=True).reshape(q.shape)

    def ours_seqused():  # the varlen operator flash_attn_with_kvcache calls, without its host read
        return fusedattn._ops.ops.varlen_fwd(q, k_cache.view(-1, heads_kv, d), v_cache.view(-1, heads_kv, d), cu_q,
                                             cu_cache, max_q, cache_hi, None, True, -1, 0, False, cache_seqlens)[0]

    def ours_seqused_portable():  # the same on the portable kernels
        with env("FUSEDATTN_DISABLE_SM90", "1"):
            return ours_seqused()

    def fa2_kvcache():
        return torch.ops.aten._flash_attention_forward(
            q, k_cache.view(-1, heads_kv, d), v_cache.view(-1, heads_kv, d), cu_q, cu_cache, max_q, cache_hi,
            0.0, True, False, scale=1.0 / math.sqrt(d), seqused_k=cache_seqlens)[0]

    # The same keys again, in shuffled pages read through a block table: ours through
    # flash_attn_varlen_func (on the Hopper kernel, and on the portable one) and through
    # flash_attn_with_kvcache (which reads the lengths on the host for its page checks), and FA2's
    # paged varlen kernel where this torch exposes it.
    k_pages, v_pages, table = paged_copy(k, v, lens_k, PAGE_ROWS, rng)

    def ours_paged():
        return fusedattn.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max_q, max_k, causal=True,
                                                block_table=table)

    def ours_paged_device():  # the same, its offsets and table checked by a kernel after it
        return fusedattn.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max_q, max_k, causal=True,
                                                block_table=table, check_on_device=True)

    def ours_paged_portable():
        with env("FUSEDATTN_SM90_PAGED", "0"):
            return ours_paged()

    def ours_paged_kvcache():
        return fusedattn.flash_attn_with_kvcache(q_dense, k_pages, v_pages, cache_seqlens=cache_seqlens,
                                                 block_table=table, causal=True).reshape(q.shape)

    def fa2_paged():
        return torch.ops.aten._flash_attention_forward(q, k_pages, v_pages, cu_q, cu_k, max_q, max_k, 0.0, True, False,
                                                       scale=1.0 / math.sqrt(d), block_table=table)[0]

    # The step's tokens appended: each sequence's last `queries` keys written again where they are.
    before = cache_seqlens - queries
    rows = torch.arange(batch, device="cuda")[:, None]
    positions = before.long()[:, None] + torch.arange(queries, device="cuda")
    k_new, v_new = k_cache[rows, positions], v_cache[rows, positions]

    def ours_kvcache_append():
        return fusedattn.flash_attn_with_kvcache(q_dense, k_cache, v_cache, k_new, v_new, cache_seqlens=before,
                                                 causal=True).reshape(q.shape)

    def ours_kvcache_append_device():
        rule = flash_attn_interface._lengths_on_device
        flash_attn_interface._lengths_on_device = lambda t, checked: True
        try:
            return ours_kvcache_append()
        finally:
            flash_attn_interface._lengths_on_device = rule

    ours_kvcache_append()  # the eager call a capture follows (it makes the device's fault record)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = ours_kvcache_append()

    def ours_kvcache_append_graph():
        graph.replay()
        return graph_out

    reference = ours_unpacked()
    row = {"decode_batch": batch, "queries": queries, "cache_lens": [cache_lo, cache_hi], "head_dim": d,
           "heads": [heads_q, heads_kv], "dtype": str(dtype).split(".")[-1]}
    for name, fn in zip(DECODE_NAMES, (ours, ours_unpacked, fa2_varlen, ours_kvcache, ours_seqused, ours_seqused_portable,
                                       fa2_kvcache, ours_paged, ours_paged_device, ours_paged_portable,
                                       ours_paged_kvcache, fa2_paged, ours_kvcache_append, ours_kvcache_append_device,
                                       ours_kvcache_append_graph)):
        try:
            err = (fn().float() - reference.float()).abs().max().item()
            row[name + "_ms"] = round(do_bench(fn, warmup=25, rep=100), 4)
            row[name + "_maxdiff"] = round(err, 4)
        except Exception as e:  # noqa: BLE001
            row[name + "_ms"] = None
            row[name + "_error"] = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
    return row


def main_decode(args, dtype):
    lo, hi = (int(x) for x in args.cache_lens.split("-"))
    names = DECODE_NAMES
    print(f"{torch.cuda.get_device_name()}  {args.dtype}  milliseconds, GQA 32/8, caches {lo}-{hi}")
    print(f"{'d':>4} {'batch':>6} {'queries':>7} " + " ".join(f"{n:>14}" for n in names)
          + "  unpacked/ours fa2/ours fa2_kvcache/ours_kvcache fa2_paged/ours_paged")
    for d, batch in ((d, b) for d in (int(x) for x in args.decode_head_dims.split(","))
                     for b in (int(x) for x in args.decode.split(","))):
        row = run_decode(batch, args.queries, lo, hi, dtype, d=d)
        cells = " ".join(f"{row[n + '_ms'] if row[n + '_ms'] is not None else '-':>14}" for n in names)
        speed = lambda n: f"{row[n + '_ms'] / row['ours_ms']:.2f}" if row["ours_ms"] and row.get(n + "_ms") else "-"  # noqa: E731
        kv_speed = f"{row['fa2_kvcache_ms'] / row['ours_kvcache_ms']:.2f}" \
            if row.get("ours_kvcache_ms") and row.get("fa2_kvcache_ms") else "-"
        paged_speed = f"{row['fa2_paged_ms'] / row['ours_paged_ms']:.2f}" \
            if row.get("ours_paged_ms") and row.get("fa2_paged_ms") else "-"
        print(f"{d:>4} {batch:>6} {args.queries:>7} {cells}  {speed('ours_unpacked'):>13} {speed('fa2_varlen'):>7} "
              f"{kv_speed:>20} {paged_speed:>18}", flush=True)
        report(row, names, "ours_unpacked", args.out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--dists", default=",".join(DISTRIBUTIONS))
    ap.add_argument("--out", default=None)
    ap.add_argument("--decode", default=None, help="B,B,...: serving steps of B sequences (see above)")
    ap.add_argument("--queries", type=int, default=1)
    ap.add_argument("--cache-lens", default="1024-32768")
    ap.add_argument("--decode-head-dims", default="128")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.decode:
        return main_decode(args, dtype)
    names = ["ours", "ours_sm80", "fa2_varlen", "cudnn_varlen", "cudnn_padded"]
    print(f"{torch.cuda.get_device_name()}  {args.dtype}  TFLOP/s of the real pairs")
    print(f"{'dist':>12} {'d':>4} {'mask':>6} {'seqs':>4} " + " ".join(f"{n:>12}" for n in names)
          + "  ours/fa2 ours/cudnn")
    for dist in args.dists.split(","):
        for d in (int(x) for x in args.head_dims.split(",")):
            for causal in (False, True):
                row = run_case(dist, d, causal, dtype)
                cells = " ".join(f"{row[n] if row[n] is not None else '-':>12}" for n in names)
                ratio = lambda peer: f"{row['ours'] / row[peer]:.2f}" if row["ours"] and row.get(peer) else "-"  # noqa: E731
                best_cudnn = max((row[n] for n in ("cudnn_varlen", "cudnn_padded") if row.get(n)), default=None)
                row["best_cudnn"] = best_cudnn
                print(f"{dist:>12} {d:>4} {'causal' if causal else 'full':>6} {row['seqs']:>4} {cells}  "
                      f"{ratio('fa2_varlen'):>8} {ratio('best_cudnn'):>10}", flush=True)
                report(row, names, "ours", args.out)


if __name__ == "__main__":
    main()
