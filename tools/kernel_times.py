#!/usr/bin/env python3
"""Per-kernel GPU time of one backward call, ours against torch SDPA's FLASH_ATTENTION (FA2), from
torch.profiler: which kernel (main loop, preprocess, dQ convert, the peer's own copies) a gap
between two providers' totals comes from. Run on the GPU machine with the Python binding built:

  PYTHONPATH=build-gpu/python tools/kernel_times.py 128:causal:16384 128:full:64:16384:1:16 ...
A point is head_dim:mask:seqlen on the FA grid (16k tokens, model dim 2048), or
head_dim:mask:seqlen_q:seqlen_k:batch:heads. KTOP=n prints the n longest kernels (default 9).
Fixed-cost probe: seqlen_q 64..4096 at seqlen_k 16384 keeps the CTA count and varies the
iterations per CTA (FUSEDATTN_BWD_TAIL_SPLIT=0 keeps full-mask items whole).
"""
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import fusedattn.flash_attn_interface as fa

REPEATS = 10


def attention(name):
    if name == "fa2":
        def run(q, k, v, causal):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    def run(q, k, v, causal):  # the binding takes (B, S, H, D)
        return fa.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal).transpose(1, 2)
    return run


def parse(point):
    f = point.split(":")
    d, causal = int(f[0]), f[1] == "causal"
    if len(f) == 3:
        s = int(f[2])
        return d, causal, s, s, 16384 // s, 2048 // d
    sq, sk, b, h = (int(x) for x in f[2:])
    return d, causal, sq, sk, b, h


def main():
    top = int(os.environ.get("KTOP", "9"))
    for point in sys.argv[1:]:
        d, causal, sq, sk, b, h = parse(point)
        flop = 4.0 * b * h * sq * sk * d * (0.5 if causal else 1.0) * 2.5
        for name in ("fa2", "ours"):
            fn = attention(name)
            q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.float16, requires_grad=True)
            k, v = (torch.randn(b, h, sk, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(2))
            o = fn(q, k, v, causal)
            do = torch.randn_like(o)
            for _ in range(5):
                torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(REPEATS):
                    torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
                torch.cuda.synchronize()
            rows = [(e.self_device_time_total / REPEATS, e.key) for e in prof.key_averages() if e.self_device_time_total > 0]
            total = sum(t for t, _ in rows)
            print(f"{point} {name}: {total:.0f} us -> {flop / total / 1e6:.1f} TFLOP/s")
            for t, key in sorted(rows, reverse=True)[:top]:
                print(f"   {t:9.1f} us  {key[:80]}")


if __name__ == "__main__":
    main()
