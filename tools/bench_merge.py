#!/usr/bin/env python3
"""fusedattn.merge_attention_ (one kernel) against the same merge in torch's elementwise ops (the
way context_parallel merged before it: logaddexp, two exps, a scaling pass and a multiply-add over
out), on one GPU. Per shape (batch 1, (rows, heads, head_dim)) and dtype pair (running out,
part_out): medians of --iters calls timed with CUDA events, and the kernel's bandwidth (out read
and written, part_out read, the LSEs' bytes) against the card's.

  tools/bench_merge.py [--shapes 8192x16x128,32768x16x128,4096x32x64] [--iters 50] [--out FILE]
"""
import argparse
import json
import statistics

import torch

import fusedattn

PAIRS = [("float32", "float16"), ("float16", "float16"), ("bfloat16", "bfloat16")]


def torch_merge(out, lse, part_out, part_lse):
    merged = torch.logaddexp(lse, part_lse)
    finite = torch.where(torch.isfinite(merged), merged, 0.0)
    weight = torch.exp(lse - finite).transpose(1, 2).unsqueeze(-1)
    part_weight = torch.exp(part_lse - finite).transpose(1, 2).unsqueeze(-1)
    out.mul_(weight).addcmul_(part_out, part_weight)
    lse.copy_(merged)


def median_ms(fn, iters):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8192x16x128,32768x16x128,4096x32x64")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = []
    print(f"{torch.cuda.get_device_name()}  medians of {args.iters}, ms")
    print(f"{'shape':>16} {'out/part':>18} {'torch':>8} {'fused':>8} {'speedup':>8} {'fused GB/s':>11}")
    for shape in args.shapes.split(","):
        seqlen, heads, dim = (int(x) for x in shape.split("x"))
        for out_name, part_name in PAIRS:
            out_dtype, part_dtype = getattr(torch, out_name), getattr(torch, part_name)
            out = torch.randn(1, seqlen, heads, dim, device="cuda", dtype=out_dtype)
            part_out = torch.randn_like(out, dtype=part_dtype)
            lse = torch.randn(1, heads, seqlen, device="cuda")
            part_lse = torch.randn_like(lse)
            fused = median_ms(lambda: fusedattn.merge_attention_(out, lse, part_out, part_lse), args.iters)
            plain = median_ms(lambda: torch_merge(out, lse, part_out, part_lse), args.iters) \
                if out_dtype == torch.float32 else float("nan")  # the torch form ran on a float32 result only
            moved = out.numel() * (2 * out.element_size() + part_out.element_size()) + lse.numel() * 4 * 3
            row = {"shape": shape, "out": out_name, "part": part_name, "torch_ms": plain, "fused_ms": fused,
                   "fused_gbps": moved / fused / 1e6}
            rows.append(row)
            print(f"{shape:>16} {out_name + '/' + part_name:>18} {plain:8.4f} {fused:8.4f} "
                  f"{plain / fused:8.2f} {row['fused_gbps']:11.0f}")
    if args.out:
        with open(args.out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
