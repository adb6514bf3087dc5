#!/usr/bin/env python3
"""Per-kernel GPU time of one call (torch.profiler), for each provider, at points of
tools/bench_points.py: which kernel (main loop, preprocess, dQ convert, a peer's own copies) a
gap between two providers' totals comes from. Providers and their call paths are peers.py's, as
in bench_points.py (peers.py read from .devbuild/carry/). Run on the GPU machine with the Python
binding built:

  PYTHONPATH=build-gpu/python:.devbuild/carry tools/kernel_times.py --points bwd:128:causal:16384 \\
      [--providers sdpa_flash,ours] [--top 9]
Fixed-cost probe of the backward: seqlen_q 64..4096 at seqlen_k 16384 (bwd:128:full:64:16384:1:16:16
...) keeps the CTA count and varies the iterations per CTA (FUSEDATTN_BWD_TAIL_SPLIT=0 keeps
full-mask items whole).
"""
import argparse
import math

import torch
from torch.profiler import ProfilerActivity, profile

WARMUP, REPEATS = 5, 10


def kernel_rows(call, repeats=REPEATS):
    """Each kernel's device time in one call (torch.profiler, averaged over `repeats` calls):
    [(us per call, launches per call, kernel name)], longest first. Warm the call up first."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            call()
        torch.cuda.synchronize()
    return sorted(((e.self_device_time_total / repeats, e.count / repeats, e.key) for e in prof.key_averages()
                   if e.self_device_time_total > 0), reverse=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", required=True)
    ap.add_argument("--providers", default="sdpa_flash,ours")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--module", default="fusedattn")
    ap.add_argument("--top", type=int, default=9, help="the longest kernels printed per call")
    args = ap.parse_args()
    from bench_points import PEERS_LEFT_OUT, expand_points, parse_point, peer_mask_differs, peers  # peers.py: carried
    peers.OURS["mod"] = __import__(args.module)
    dtype = getattr(torch, args.dtype)
    for text in expand_points(args.points):
        mode, d, causal, sq, sk, batch, hq, hkv = parse_point(text)
        flop = peers.flops(batch, hq, sq, sk, d, causal, mode)
        for name in args.providers.split(","):
            if peer_mask_differs(name, causal, sq, sk):
                print(f"{text} {name}: {PEERS_LEFT_OUT}")
                continue
            fn = peers.PROVIDERS[name]
            grad = mode == "bwd"
            q = torch.randn(batch, hq, sq, d, device="cuda", dtype=dtype, requires_grad=grad)
            k, v = (torch.randn(batch, hkv, sk, d, device="cuda", dtype=dtype, requires_grad=grad) for _ in range(2))
            scale = 1.0 / math.sqrt(d)
            if grad:
                o = fn(q, k, v, causal, scale)
                do = torch.randn_like(o)
                call = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
            else:
                call = lambda: fn(q, k, v, causal, scale)
            with torch.set_grad_enabled(grad):
                for _ in range(WARMUP):
                    call()
                torch.cuda.synchronize()
                rows = kernel_rows(call)
            total = sum(t for t, _, _ in rows)
            print(f"{text} {name}: {total:.0f} us -> {flop / total / 1e6:.1f} TFLOP/s")
            for t, _, key in rows[:args.top]:
                print(f"   {t:9.1f} us  {key[:80]}")
            del q, k, v
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
