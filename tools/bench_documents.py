#!/usr/bin/env python3
"""Packed causal documents: a column mask against the same documents as a varlen batch.

Each case packs documents of one of bench_varlen.py's length distributions into one sequence of
about 16k tokens (model dim 2048, so 2048 / head_dim heads) under a causal document mask: row i
sees the keys of its own document up to itself. Columns (TFLOP/s of the visible pairs, triton's
do_bench median; forward, and forward + backward with --backward):
  ours_column      fusedattn.flash_attn_func(causal=True, column_mask=) on the packed sequence:
                   each key hides from the rows after its document (on Hopper the forward's sm90
                   kernel at d64/d128, else the portable kernels)
  ours_column_det  ours_column with deterministic=True (the backward's dQ adds in a fixed order)
  column_portable  the same on the portable kernels (FUSEDATTN_DISABLE_SM90=1)
  varlen_portable  fusedattn.flash_attn_varlen_func over the documents with
                   FUSEDATTN_DISABLE_SM90=1: the same kernels given the documents' bounds, what
                   the mask's skipping should come near
  ours_varlen      the same varlen call (on Hopper the forward's sm90 kernel)
  ours_varlen_det  ours_varlen with deterministic=True
  causal_portable  the packed sequence under causal alone (the work without skipping; its pairs
                   are not the documents', so only its time is comparable)
  flex             torch's FlexAttention (torch.compile'd) with the document mask as a block mask:
                   it skips the blocks the mask hides, the peer for packed documents in PyTorch
  sdpa_mask        torch SDPA with the document mask as a boolean [S, S] tensor (the efficient-
                   attention backend, what torch runs for an arbitrary mask)
Every provider's output is checked against ours_column (max abs difference) before it is timed.

  tools/bench_documents.py [--dtype float16] [--head-dims 64,128] [--dists ...] [--providers ...]
                           [--backward] [--kernels] [--out FILE]
"""
import argparse
import contextlib
import functools
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import fusedattn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_varlen import DISTRIBUTIONS, MODEL_DIM, env, lengths, pairs  # noqa: E402
from kernel_times import kernel_rows  # noqa: E402

# Skewed lengths: one long document before (or after) many short ones, so the grid's own order
# (the last rows first) runs the long document's heavy query blocks last (or first). Here an order
# of the CTAs by their work was tried and dropped (docs/hopper.md, session 51). Not among
# bench_varlen's distributions: a varlen batch orders its tiles by sequence.
SKEWED = {"long-first": [12288] + [64] * 64, "long-last": [64] * 64 + [12288]}
NAMES = ["ours_column", "ours_column_det", "column_portable", "varlen_portable", "ours_varlen", "ours_varlen_det",
         "causal_portable", "flex", "sdpa_mask"]


@contextlib.contextmanager
def settings(pairs):
    """Environment switches (name, value) for the scope."""
    with contextlib.ExitStack() as stack:
        for name, value in pairs:
            stack.enter_context(env(name, value))
        yield


def kernel_times(step, top=6):
    """The device time of one step, per kernel (kernel_times.py): a gap between the step's
    do_bench time and its kernels' sum is host time the GPU waited for."""
    step()
    torch.cuda.synchronize()
    rows = kernel_rows(step)
    return [(round(t, 1), round(n, 1), key[:90]) for t, n, key in rows[:top]], round(sum(t for t, _, _ in rows), 1)


def run_case(dist, d, dtype, backward, names, kernels=False):
    lens = SKEWED[dist] if dist in SKEWED else lengths(dist)
    heads, total, longest = MODEL_DIM // d, sum(lens), max(lens)
    offsets = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(total, heads, d, dtype=dtype, device="cuda", requires_grad=backward) for _ in range(3))
    dout = torch.randn(total, heads, d, dtype=dtype, device="cuda")
    mask = fusedattn.masks.document_mask([lens], device="cuda")
    doc = torch.repeat_interleave(torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda"))
    keep = (doc[:, None] == doc[None, :]) & torch.ones(total, total, dtype=torch.bool, device="cuda").tril()

    def ours_column(deterministic=False):
        return fusedattn.flash_attn_func(q[None], k[None], v[None], causal=True, column_mask=mask,
                                         deterministic=deterministic)[0]

    def ours_varlen(deterministic=False):
        return fusedattn.flash_attn_varlen_func(q, k, v, offsets, offsets, longest, longest, causal=True,
                                                deterministic=deterministic)

    def varlen_portable():
        with env("FUSEDATTN_DISABLE_SM90", "1"):
            return ours_varlen()

    def causal_portable():
        with env("FUSEDATTN_DISABLE_SM90", "1"):
            return fusedattn.flash_attn_func(q[None], k[None], v[None], causal=True)[0]

    def sdpa_mask():
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            qt, kt, vt = (x[None].transpose(1, 2) for x in (q, k, v))
            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=keep).transpose(1, 2)[0]

    def flex_provider():
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def document_causal(b, h, q_idx, kv_idx):
            return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)
        block_mask = create_block_mask(document_causal, None, None, total, total, device="cuda")
        compiled = torch.compile(flex_attention)

        def fn():
            qt, kt, vt = (x[None].transpose(1, 2) for x in (q, k, v))
            return compiled(qt, kt, vt, block_mask=block_mask).transpose(1, 2)[0]
        return fn

    providers = {"ours_column": ours_column, "ours_column_det": functools.partial(ours_column, deterministic=True),
                 "column_portable": ours_column, "varlen_portable": varlen_portable,
                 "ours_varlen": ours_varlen, "ours_varlen_det": functools.partial(ours_varlen, deterministic=True),
                 "causal_portable": causal_portable, "flex": None, "sdpa_mask": sdpa_mask}
    with torch.no_grad():
        reference = ours_column()
    flops = 4 * heads * d * pairs(lens, True) * (3.5 if backward else 1.0)  # backward: 2.5x the forward's
    row = {"dist": dist, "head_dim": d, "dtype": str(dtype).split(".")[-1], "docs": len(lens), "tokens": total,
           "backward": backward}
    # A provider's switches hold over its whole step, the backward too.
    switches = {"column_portable": [("FUSEDATTN_DISABLE_SM90", "1")]}
    for name, fn in providers.items():
        if name not in names:
            continue
        scope = functools.partial(settings, switches.get(name, []))
        try:
            if name == "flex":
                fn = flex_provider()
            with torch.no_grad(), scope():
                out = fn()
            row[name + "_maxdiff"] = round((out.float() - reference.float()).abs().max().item(), 4)
            if name == "causal_portable":
                row[name + "_maxdiff"] = None  # another mask: no comparison

            def step(fn=fn, scope=scope):
                with scope():
                    if not backward:
                        with torch.no_grad():
                            return fn()
                    q.grad = k.grad = v.grad = None
                    fn().backward(dout)
                    return None
            ms = do_bench(step, warmup=10, rep=100)
            row[name] = round(flops / ms / 1e9, 1)
            row[name + "_ms"] = round(ms, 3)
            if kernels:
                row[name + "_kernels"], row[name + "_kernel_us"] = kernel_times(step)
        except Exception as e:  # noqa: BLE001
            row[name] = None
            row[name + "_error"] = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--dists", default=",".join(DISTRIBUTIONS),
                    help=f"of {', '.join(list(DISTRIBUTIONS) + list(SKEWED))}")
    ap.add_argument("--providers", default=",".join(NAMES),
                    help="the columns to time (ours_column always runs: the reference)")
    ap.add_argument("--backward", action="store_true", help="time forward + backward (credited 3.5x the pairs)")
    ap.add_argument("--kernels", action="store_true",
                    help="also each provider's device time per kernel (torch.profiler) against its do_bench time")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    names = args.providers.split(",")
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        ap.error(f"--providers: unknown {', '.join(unknown)}; known: {', '.join(NAMES)}")
    dtype = getattr(torch, args.dtype)
    what = "forward + backward" if args.backward else "forward"
    print(f"{torch.cuda.get_device_name()}  {args.dtype}  {what}: TFLOP/s of the documents' pairs (ms)")
    print(f"{'dist':>12} {'d':>4} {'docs':>4} " + " ".join(f"{n:>17}" for n in NAMES)
          + "  column/ours_varlen column/flex portable/varlen_portable")
    for dist in args.dists.split(","):
        for d in (int(x) for x in args.head_dims.split(",")):
            row = run_case(dist, d, dtype, args.backward, names, args.kernels)
            cells = " ".join(f"{str(row[n]) + ' (' + str(row[n + '_ms']) + ')' if row.get(n) else '-':>17}"
                             for n in NAMES)
            ratio = lambda ours, peer: (f"{row[ours] / row[peer]:.2f}"  # noqa: E731
                                        if row.get(ours) and row.get(peer) else "-")
            print(f"{dist:>12} {d:>4} {row['docs']:>4} {cells}  {ratio('ours_column', 'ours_varlen'):>18} "
                  f"{ratio('ours_column', 'flex'):>11} {ratio('column_portable', 'varlen_portable'):>24}",
                  flush=True)
            for n in NAMES:
                if row.get(n + "_kernels"):
                    print(f"    {n}: {row[n + '_ms'] * 1000:.0f} us a step, {row[n + '_kernel_us']} us in kernels:")
                    for t, count, key in row[n + "_kernels"]:
                        print(f"      {t:9.1f} us  x{count:<4} {key}")
                if row.get(n + "_error"):
                    print(f"    {n}: {row[n + '_error']}")
                elif (row.get(n + "_maxdiff") or 0) > 0.05:
                    print(f"    {n}: max abs difference to ours_column {row[n + '_maxdiff']}")
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
