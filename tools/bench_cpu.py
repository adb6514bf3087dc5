#!/usr/bin/env python3
"""fusedattn's CPU backend against torch's CPU scaled_dot_product_attention, through Python, on
this machine (no GPU needed): forward, forward + backward through autograd, and decode steps.

Each case times medians of --iters calls after one warm-up. torch gets contiguous [B, H, S, D]
copies (its fast layout), and for decode also the same [B, S, H, D] tensors as views, since a
KV cache in flash_attn's layout is what a caller holds. Ratios are torch's time over ours (above
1: ours faster).

  tools/bench_cpu.py [--iters 11] [--only forward,backward,decode] [--out FILE]

To compare two builds, run it once per build with PYTHONPATH pointing at each installed package
(e.g. `pip install --no-build-isolation --no-deps --target /tmp/base .` in a checkout of the other
commit), alternating, and compare the `ours` columns.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import fusedattn

# (batch, seqlen, heads, head_dim, causal, dtype)
FORWARD = [
    (1, 1024, 8, 64, False, torch.float32),
    (1, 1024, 8, 64, True, torch.float32),
    (1, 2048, 8, 128, True, torch.float32),
    (4, 512, 8, 64, False, torch.float32),
    (1, 2048, 8, 128, False, torch.float16),
    (1, 1024, 8, 64, True, torch.bfloat16),
]
BACKWARD = [
    (4, 512, 8, 64, False, torch.float32),
    (2, 1024, 8, 64, True, torch.float32),
    (1, 2048, 8, 128, True, torch.bfloat16),
]
# (query heads, KV heads, keys, head_dim, dtype): one query row per sequence, batch 1
DECODE = [
    (32, 8, 32768, 128, torch.float32),
    (32, 32, 8192, 128, torch.float32),
    (32, 8, 32768, 128, torch.bfloat16),
    (32, 32, 16384, 64, torch.float16),
]


def median_ms(fn, iters):
    fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def forward_cases(iters):
    for b, s, h, d, causal, dtype in FORWARD:
        q, k, v = (torch.randn(b, s, h, d, dtype=dtype) for _ in range(3))
        ours = median_ms(lambda: fusedattn.flash_attn_func(q, k, v, causal=causal), iters)
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        ref = median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), iters)
        yield {"case": "forward", "shape": f"B{b} S{s} H{h} D{d} {'causal' if causal else 'full'}",
               "dtype": dtype_name(dtype), "ours_ms": ours, "torch_ms": ref}


def backward_cases(iters):
    for b, s, h, d, causal, dtype in BACKWARD:
        q, k, v = (torch.randn(b, s, h, d, dtype=dtype, requires_grad=True) for _ in range(3))
        g = torch.randn(b, s, h, d, dtype=dtype)
        ours = median_ms(lambda: fusedattn.flash_attn_func(q, k, v, causal=causal).backward(g), iters)
        qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
        gt = g.transpose(1, 2).contiguous()
        ref = median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).backward(gt), iters)
        yield {"case": "forward+backward", "shape": f"B{b} S{s} H{h} D{d} {'causal' if causal else 'full'}",
               "dtype": dtype_name(dtype), "ours_ms": ours, "torch_ms": ref}


def decode_cases(iters):
    for hq, hk, s, d, dtype in DECODE:
        q = torch.randn(1, 1, hq, d, dtype=dtype)
        k, v = (torch.randn(1, s, hk, d, dtype=dtype) for _ in range(2))
        gqa = hq != hk
        ours = median_ms(lambda: fusedattn.flash_attn_func(q, k, v), iters)
        views = [x.transpose(1, 2) for x in (q, k, v)]
        ref_views = median_ms(lambda: F.scaled_dot_product_attention(*views, enable_gqa=gqa), iters)
        copies = [x.contiguous() for x in views]
        ref = median_ms(lambda: F.scaled_dot_product_attention(*copies, enable_gqa=gqa), iters)
        yield {"case": "decode", "shape": f"{hq}/{hk} heads {s} keys D{d}", "dtype": dtype_name(dtype),
               "ours_ms": ours, "torch_ms": ref, "torch_views_ms": ref_views}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=11)
    ap.add_argument("--only", default="forward,backward,decode")
    ap.add_argument("--out", help="append one JSON line per case")
    args = ap.parse_args()
    torch.manual_seed(0)
    kinds = {"forward": forward_cases, "backward": backward_cases, "decode": decode_cases}
    wanted = args.only.split(",")
    unknown = [w for w in wanted if w not in kinds]
    if unknown:
        ap.error(f"--only: unknown {', '.join(unknown)}; known: {', '.join(kinds)}")
    print(f"{'case':<17} {'shape':<30} {'dtype':<9} {'ours ms':>9} {'torch ms':>9} {'ratio':>6}  torch on views")
    for kind in wanted:
        for row in kinds[kind](args.iters):
            views = ""
            if "torch_views_ms" in row:
                views = f"{row['torch_views_ms']:.2f} ms ({row['torch_views_ms'] / row['ours_ms']:.2f}x)"
            print(f"{row['case']:<17} {row['shape']:<30} {row['dtype']:<9} {row['ours_ms']:>9.2f} "
                  f"{row['torch_ms']:>9.2f} {row['torch_ms'] / row['ours_ms']:>5.2f}x  {views}", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps({**row, "threads": torch.get_num_threads()}) + "\n")


if __name__ == "__main__":
    main()
